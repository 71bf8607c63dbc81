"""The tests of vmd/guests/linux/ (the folders of tests/ mirror the packages)."""
