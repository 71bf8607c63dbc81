"""Whole runs: a session, a job or an eval on a real guest, the compose stack, the fleet,
Windows from its ISO."""
