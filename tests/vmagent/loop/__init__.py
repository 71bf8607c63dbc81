"""The tests of vmagent/loop/ (the folders of tests/ mirror the packages)."""
