"""The tests of vmd/ (the folders of tests/ mirror the packages)."""
