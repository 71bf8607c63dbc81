"""The tests of vmagent/web/ (the folders of tests/ mirror the packages)."""
