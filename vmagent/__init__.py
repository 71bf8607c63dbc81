"""vmagent: the unprivileged agent. Its rooms:

- loop/: the turn loop, one job from the task to a report, and what it stands on;
- models/: the model interface, one folder per backend (ollama/, openai/);
- tools/: the tools the model is offered, the reading of what it sends, the calls to vmd;
- link/: the link to vmd (its socket, the loop's session link, the interface of both
  transports; the Ray transport is fleet/on_host.py);
- web/: the web read on the host for the agent;
- service/: the job service; fleet/: jobs placed on several vmd hosts by Ray;
- eval/: `vmagent eval`; openwebui/: the Open WebUI tool file (one standalone file).

On top: cli.py (the commands), config.py (the agent's settings), prompts.py, worker.py (one
job's process) and job_file.py (what a worker is handed), os_family.py (the guest's OS
family, decided in one place), terminal.py, atomic_file.py.
Nothing here imports vmd/ but its contract (vmd/contract/), and no sub-package imports one
that imports it back (tests/project/test_layering.py).
"""
