"""Open WebUI's side of the stack, set up through its REST API at first start (and made
the same again at every start): the admin account, the VM Agent tool with the source of
vmagent/openwebui/vm_agent.py, readable by every user, and its valves from the
environment. Afterwards a person only logs in and picks a model.

Run by the compose file's one-shot `open-webui-init` (the job service's image, which has
the tool file and httpx) once Open WebUI is healthy. The calls are the ones
tests/support/openwebui_harness.py makes against open-webui 0.12.4:

    POST /api/v1/auths/signin | /api/v1/auths/signup    the admin (the first account is the admin)
    GET  /api/v1/tools/id/{id}                          is the tool there?
    POST /api/v1/tools/create | /api/v1/tools/id/{id}/update
    POST /api/v1/tools/id/{id}/valves/update

Environment: OPEN_WEBUI_URL, OPEN_WEBUI_ADMIN_EMAIL, OPEN_WEBUI_ADMIN_PASSWORD,
OPEN_WEBUI_ADMIN_NAME, VMAGENT_SERVICE_URL (as Open WebUI's server reaches the job
service), VMAGENT_SERVICE_TOKEN, VMAGENT_DEFAULT_OS, VMAGENT_TOOL_FILE.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import httpx

TOOL_ID = "vm_agent"
DEFAULT_TOOL_FILE = "/app/vmagent/openwebui/vm_agent.py"
# Open WebUI answers /health before its first account can be made on a slow host; the
# compose file starts this only once it is healthy, so this is a margin, not the wait.
READY_TIMEOUT_S = 300


class ProvisionError(RuntimeError):
    pass


def checked(response: httpx.Response, what: str):
    if response.status_code >= 400:
        raise ProvisionError(f"Open WebUI refused to {what} ({response.status_code}: {response.text[:500]}).")
    return response.json()


def wait_ready(api: httpx.Client, timeout: float = READY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if api.get("/health").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise ProvisionError(f"Open WebUI at {api.base_url} did not answer /health within {timeout:.0f} s.")
        time.sleep(2)


def admin_token(api: httpx.Client, email: str, password: str, name: str) -> str:
    """Signs in as the admin; on a new Open WebUI (no account yet) signs the admin up first:
    the first account is the admin."""
    signin = api.post("/api/v1/auths/signin", json={"email": email, "password": password})
    if signin.status_code == 200:
        reply = signin.json()
    else:
        signup = api.post("/api/v1/auths/signup", json={"name": name, "email": email, "password": password})
        if signup.status_code >= 400:
            raise ProvisionError(
                f"cannot sign in to Open WebUI as {email} ({signin.status_code}: {signin.text[:200]}) nor sign "
                f"up ({signup.status_code}: {signup.text[:200]}): OPEN_WEBUI_ADMIN_EMAIL and "
                "OPEN_WEBUI_ADMIN_PASSWORD must be the first account's, or the data volume must be new.")
        reply = signup.json()
    if reply.get("role") != "admin":
        raise ProvisionError(f"{email} is not an admin of Open WebUI (role {reply.get('role')!r}): "
                             "set OPEN_WEBUI_ADMIN_EMAIL to the first account's address.")
    return reply["token"]


def provision(url: str, env: dict[str, str]) -> str:
    """Brings Open WebUI at `url` to the state described above; returns what it did."""
    email = env.get("OPEN_WEBUI_ADMIN_EMAIL", "")
    password = env.get("OPEN_WEBUI_ADMIN_PASSWORD", "")
    token = env.get("VMAGENT_SERVICE_TOKEN", "")
    missing = [n for n, v in (("OPEN_WEBUI_ADMIN_EMAIL", email), ("OPEN_WEBUI_ADMIN_PASSWORD", password),
                              ("VMAGENT_SERVICE_TOKEN", token)) if not v]
    if missing:
        raise ProvisionError(f"{', '.join(missing)} not set: put them in .env (see .env.example).")
    source = Path(env.get("VMAGENT_TOOL_FILE") or DEFAULT_TOOL_FILE).read_text()
    with httpx.Client(base_url=url, timeout=60) as api:
        wait_ready(api)
        api.headers["Authorization"] = f"Bearer {admin_token(api, email, password, env.get('OPEN_WEBUI_ADMIN_NAME') or 'Admin')}"
        form = {"id": TOOL_ID, "name": "VM Agent", "content": source,
                "meta": {"description": "Hands a coding task to an agent in a virtual machine."},
                "access_grants": [{"principal_type": "user", "principal_id": "*", "permission": "read"}]}
        if api.get(f"/api/v1/tools/id/{TOOL_ID}").status_code == 200:
            checked(api.post(f"/api/v1/tools/id/{TOOL_ID}/update", json=form), "update the VM Agent tool")
            did = "updated the VM Agent tool"
        else:
            checked(api.post("/api/v1/tools/create", json=form), "create the VM Agent tool")
            did = "created the VM Agent tool"
        valves = {"service_url": env.get("VMAGENT_SERVICE_URL") or "http://vmagent:8700",
                  "service_token": token, "default_os": env.get("VMAGENT_DEFAULT_OS") or "debian"}
        checked(api.post(f"/api/v1/tools/id/{TOOL_ID}/valves/update", json=valves), "set the tool's valves")
    return f"{did} and set its valves (service_url {valves['service_url']})"


def main() -> int:
    url = os.environ.get("OPEN_WEBUI_URL", "http://open-webui:8080")
    try:
        print(f"open-webui-init: {provision(url, dict(os.environ))}", flush=True)
    except (ProvisionError, OSError, httpx.HTTPError) as exc:
        print(f"open-webui-init: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
