"""The tests of vmd/guests/ (the folders of tests/ mirror the packages)."""
