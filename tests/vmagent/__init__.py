"""The tests of vmagent/ (the folders of tests/ mirror the packages)."""
