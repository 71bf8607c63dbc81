"""One job through the service that `scripts/setup.sh --start` started, as a person's
first job would go: POST /jobs with the service token, a real guest, the tests' Ollama
stand-in playing a short script on the address the service uses by default, and the
job's end read back from GET /jobs/{id}. `.ci/run` runs it after setup.sh --start.

    .venv/bin/python -m tests.support.setup_smoke --token-file /var/lib/vmagent/state/service-token

Exit 0 when the job ended done, with vmd's re-run of the check passed and proven; 1
otherwise, with what the job said.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from tests.support.loop_harness import call, calls
from tests.support.ollama_server import OllamaScriptServer
from vmagent.service.store import FINAL_STATES

CHECK = "cd /mnt/project && test \"$(python3 hello.py)\" = 'hello from vmagent'"
SCRIPT = [
    call("plan_tasks", {"tasks": ["write hello.py", "run it"]}, content="Planning while the machine boots."),
    calls(("update_task", {"id": 1, "status": "in_progress"}),
          ("write_file", {"path": "/mnt/project/hello.py", "content": "print('hello from vmagent')\n"})),
    calls(("update_task", {"id": 1, "status": "done"}),
          ("update_task", {"id": 2, "status": "in_progress"}),
          ("run", {"command": "cd /mnt/project && python3 hello.py"})),
    call("update_task", {"id": 2, "status": "done", "note": "it prints the greeting"}),
    call("finish", {"summary": "hello.py prints the greeting", "verification": {"command": CHECK, "expect_exit": 0}}),
]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8700", help="the job service")
    p.add_argument("--token-file", type=Path, required=True, help="setup.sh --start's service token")
    p.add_argument("--model-url", default="http://127.0.0.1:11434",
                   help="where the service's workers look for Ollama (its default: ollama_host)")
    p.add_argument("--timeout", type=float, default=900, help="seconds the job may take, the guest's boot included")
    args = p.parse_args(argv)

    model = urlsplit(args.model_url)
    server = OllamaScriptServer(SCRIPT)
    server._port = model.port or 11434  # the address the service was started with
    server.start()
    headers = {"Authorization": f"Bearer {args.token_file.read_text().strip()}",
               "X-OpenWebUI-User-Id": "setup-smoke"}
    try:
        with httpx.Client(base_url=args.url, headers=headers, timeout=30) as http:
            created = http.post("/jobs", json={"task": "Write hello.py that prints 'hello from vmagent'.",
                                               "project": f"smoke-{int(time.time())}", "web": False})
            if created.status_code != 201:
                print(f"setup smoke: POST /jobs answered {created.status_code}: {created.text[:500]}")
                return 1
            job = created.json()
            print(f"setup smoke: job {job['id']} queued; waiting for it (a guest boots)")
            deadline = time.monotonic() + args.timeout
            while job["state"] not in FINAL_STATES and time.monotonic() < deadline:
                time.sleep(3)
                job = http.get(f"/jobs/{job['id']}").json()
    finally:
        server.stop()
    verification = job.get("verification") or {}
    print(f"setup smoke: state {job['state']}, verification {verification}, "
          f"{job.get('turns')} turns, {job.get('tool_calls')} tool calls "
          f"({len(server.chat_requests)} requests to the model server)")
    if job["state"] != "done" or not verification.get("passed") or not verification.get("proven"):
        print(job.get("report") or job.get("status_line") or "(no report)")
        return 1
    print("setup smoke: the job was done, verified and proven")
    return 0


if __name__ == "__main__":
    sys.exit(main())
