"""The tests of vmagent/link/ (the folders of tests/ mirror the packages)."""
