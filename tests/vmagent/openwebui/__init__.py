"""The tests of vmagent/openwebui/ (the folders of tests/ mirror the packages)."""
