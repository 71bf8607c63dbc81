"""The tests of vmd/images/windows/ (the folders of tests/ mirror the packages)."""
