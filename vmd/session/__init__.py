"""A session: its state on disk (state.py), the live object (session.py), its machine's
boot (boot.py), the live sessions (registry.py), the verb handlers (handlers/), the
record, report, task list and the check vmd re-runs (record.py, report.py, tasks.py,
verification.py), and writes that survive a full disk (disk.py)."""
