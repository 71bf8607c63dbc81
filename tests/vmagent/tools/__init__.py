"""The tests of vmagent/tools/ (the folders of tests/ mirror the packages)."""
