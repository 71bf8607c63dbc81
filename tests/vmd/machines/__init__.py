"""The tests of vmd/machines/ (the folders of tests/ mirror the packages)."""
