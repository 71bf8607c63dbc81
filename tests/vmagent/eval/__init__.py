"""The tests of vmagent/eval/ (the folders of tests/ mirror the packages)."""
