"""The tests of vmd/contract/ (the folders of tests/ mirror the packages)."""
