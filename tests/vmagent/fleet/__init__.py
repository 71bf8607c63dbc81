"""The tests of vmagent/fleet/ (the folders of tests/ mirror the packages)."""
