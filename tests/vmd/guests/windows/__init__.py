"""The tests of vmd/guests/windows/ (the folders of tests/ mirror the packages)."""
