"""The tests of vmd/images/ (the folders of tests/ mirror the packages)."""
