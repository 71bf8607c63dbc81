"""The tests of vmagent/models/ (the folders of tests/ mirror the packages)."""
