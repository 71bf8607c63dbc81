"""The tests of vmd/projects/ (the folders of tests/ mirror the packages)."""
