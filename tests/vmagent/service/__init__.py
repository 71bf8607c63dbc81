"""The tests of vmagent/service/ (the folders of tests/ mirror the packages)."""
