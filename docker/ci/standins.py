"""The stand-ins the CI override (docker/ci/compose.ci.yml) puts at the service names whose
upstream images cannot be pulled there: the test suite's Gitea (tests/support/gitea_server.py: the
API vmd uses and git's smart HTTP) and Ollama (tests/support/ollama_server.py, playing one job).

    python3 standins.py gitea        # on :3000, token from GITEA_STANDIN_TOKEN
    python3 standins.py gitea-init   # writes that token where gitea-init writes Gitea's
    python3 standins.py ollama       # on :11434, the model VMAGENT_MODEL, the job below
    python3 standins.py ollama-fleet # on :11434, the compose fleet's jobs (tests/support/fleet_jobs.py)

They run from the repository's tests/ (mounted at /app/tests) on the local Debian base with
python3 and git: both modules need only the standard library.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, os.environ.get("VMAGENT_SOURCE", "/app"))

# The job tests/e2e/test_compose_stack.py posts: plan, write a file into the project, run it,
# close the tasks, finish with a check vmd re-runs in the guest. Then vmd pushes to Gitea.
CHECK = "cd /mnt/project && python3 hello.py | grep -qx 'hello from compose'"


def job_script():
    from tests.support.ollama_server import Turn

    def call(*pairs):
        return Turn(tool_calls=[{"name": n, "arguments": a} for n, a in pairs])

    return [
        Turn(content="Planning while the machine boots.",
             tool_calls=[{"name": "plan_tasks", "arguments": {"tasks": ["write hello.py", "run it"]}}]),
        call(("update_task", {"id": 1, "status": "in_progress"}),
             ("write_file", {"path": "/mnt/project/hello.py", "content": "print('hello from compose')\n"})),
        call(("run", {"command": "cd /mnt/project && python3 hello.py"})),
        call(("update_task", {"id": 1, "status": "done", "note": "written"}),
             ("update_task", {"id": 2, "status": "done", "note": "it printed the greeting"})),
        call(("finish", {"summary": "hello.py prints the greeting", "verification": {"command": CHECK}})),
    ]


def serve_forever(server) -> None:
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"stand-in listening on {server.server_address}", flush=True)
    server.serve_forever(poll_interval=0.2)


def gitea() -> None:
    from tests.support.gitea_server import FakeGitea, _Handler

    root = Path(os.environ.get("GITEA_STANDIN_ROOT", "/srv/gitea"))
    root.mkdir(parents=True, exist_ok=True)
    fake = FakeGitea(root=root, token=os.environ["GITEA_STANDIN_TOKEN"],
                     # vmd's token is the bot's, no site admin's (docker/gitea-init.sh).
                     user=os.environ.get("GITEA_BOT_USER", "vmd-bot"), admin=False,
                     scopes={"write:repository", "write:organization", "read:user"})
    fake.url = os.environ.get("GITEA_STANDIN_URL", "http://gitea:3000")
    handler = type("Handler", (_Handler,), {"gitea": fake})
    server = ThreadingHTTPServer(("0.0.0.0", 3000), handler)
    server.daemon_threads = True
    serve_forever(server)


def gitea_init() -> None:
    path = Path(os.environ["GITEA_TOKEN_FILE"])
    path.parent.mkdir(parents=True, exist_ok=True)
    old = os.umask(0o077)
    path.write_text(os.environ["GITEA_STANDIN_TOKEN"])
    os.umask(old)
    print(f"gitea-init stand-in: token written to {path}", flush=True)


def ollama() -> None:
    from tests.support.ollama_server import OllamaScriptServer, Turn, _Handler

    model = os.environ.get("OLLAMA_MODEL", "qwen3:32b")
    script = OllamaScriptServer(job_script(), models=[model],
                                default=Turn(content="The job is finished."))
    handler = type("Handler", (_Handler,), {"script_server": script})
    server = ThreadingHTTPServer(("0.0.0.0", 11434), handler)
    server.daemon_threads = True
    script._httpd = server
    serve_forever(server)


def ollama_fleet() -> None:
    """The compose fleet's model: the jobs of tests/support/fleet_jobs.py, each turn from its own
    conversation (tests/e2e/test_fleet_stack.py)."""
    from tests.support.fleet_jobs import model as fleet_model
    from tests.support.ollama_server import OllamaScriptServer, _Handler

    script = OllamaScriptServer([], models=[os.environ.get("OLLAMA_MODEL", "qwen3:32b")], default=fleet_model)
    handler = type("Handler", (_Handler,), {"script_server": script})
    server = ThreadingHTTPServer(("0.0.0.0", 11434), handler)
    server.daemon_threads = True
    script._httpd = server
    serve_forever(server)


if __name__ == "__main__":
    {"gitea": gitea, "gitea-init": gitea_init, "ollama": ollama, "ollama-fleet": ollama_fleet}[sys.argv[1]]()
