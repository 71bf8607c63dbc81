"""The Open WebUI tool: vm_agent.py is pasted into (or uploaded to) Open WebUI as one file of
source, a thin async client of the job service; it imports nothing of vmagent."""
