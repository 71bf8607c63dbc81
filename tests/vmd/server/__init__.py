"""The tests of vmd/server/ (the folders of tests/ mirror the packages)."""
