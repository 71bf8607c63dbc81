"""`vmagent eval`: how well a model does real jobs through this harness. The task set's
format (tasks.py), the runs through the normal path (runner.py), the scoring (scores.py)
and what is kept of a run (pages.py); the command in command.py."""
