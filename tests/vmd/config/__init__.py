"""The tests of vmd/config/ (the folders of tests/ mirror the packages)."""
