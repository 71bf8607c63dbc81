"""The tests of vmd/session/ (the folders of tests/ mirror the packages)."""
