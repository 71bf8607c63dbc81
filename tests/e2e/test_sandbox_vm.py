"""The guest is an attacker: a real guest plants every git and file-system trap it can in
the project folder, with `run` and root (`sudo`) inside the guest, and the host-side
commit and push at `git_commit` and `session_close` must neither run anything on the
host nor leak the token or another tenant's work — and the honest files must arrive.
"""

from __future__ import annotations

import os
import secrets
import stat
import subprocess
from pathlib import Path

import pytest

from tests.support.gitea_server import start_gitea
from tests.support.vmd_fakes import make_config
from tests.support.vmd_wire import WireVmd

from vmd.machines.libvirt_machines import LibvirtMachines
from vmd.projects.publish import commit_project, prepare_project, push_project
from vmd.projects.remote import Remote
from vmd.projects.repository import repository_path
from vmd.server.rpc import VmdServer

TOKEN = "gitea-token-" + secrets.token_hex(8)

pytestmark = pytest.mark.vm


def git(git_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "--git-dir", str(git_dir), *args], capture_output=True, text=True)


@pytest.fixture
def gitea(tmp_path):
    with start_gitea(tmp_path / "gitea", token=TOKEN, admin=True, users={"mallory"}) as server:
        yield server


def other_tenant(config, gitea) -> dict:
    """alice's project `secret`, committed and pushed before mallory's session starts."""
    remote = Remote(owner="alice", project="secret", gitea_url=gitea.url, gitea_token=TOKEN,
                    state_dir=config.state_dir)
    folder = config.projects_dir / "alice" / "secret"
    prepare_project(folder, remote)
    (folder / "plans.txt").write_text("alice's secret plans\n")
    committed = commit_project(folder, remote, "secret work")
    assert push_project(remote).pushed
    blob = git(remote.repo_path, "rev-parse", "main:plans.txt").stdout.strip()
    return {"repo": remote.repo_path, "commit": committed.sha, "blob": blob,
            "gitea_head": git(gitea.repo_path("alice", "secret"), "rev-parse", "main").stdout.strip()}


def test_a_hostile_guest_cannot_run_anything_on_the_host_or_reach_another_tenant(tmp_path, debian_image, gitea):
    config = make_config(tmp_path, images_dir=debian_image.dir.parent, boot_timeout_s=900, gitea_owner_mode="user",
                         verify_timeout_s=300, gitea_url=gitea.url, gitea_token=TOKEN,
                         commit_max_file_mib=100)
    alice = other_tenant(config, gitea)
    marker = f"/tmp/vmagent-pwned-{secrets.token_hex(6)}"
    run_on_host = f"env > {marker}; touch {marker}.ran"
    push_url = f"{gitea.url}/mallory/app.git"
    alice_url = f"{gitea.url}/alice/secret.git"

    server = VmdServer(config, LibvirtMachines(config)).start()
    c = WireVmd(config.socket, timeout=1200).connect()
    try:
        c.call("session_open", os="debian", project="app", owner="mallory", task="write app.py")
        c.call("plan_tasks", tasks=["write the app"])
        c.call("session_ready", timeout=900)

        def guest(script: str) -> dict:
            result = c.call("run", command=script, cwd="/mnt/project", timeout=600)
            assert result["exit_code"] == 0, result
            return result

        # Honest work, and a nested repository with a commit, committed by the host once
        # (the old code recorded it as a gitlink and descended into it later).
        guest("set -e; printf 'print(42)\\n' > app.py; printf '# app\\n' > README.md; "
              "mkdir vendor; cd vendor; git init -q; printf 'int x;\\n' > x.c; git add x.c; "
              "git -c user.name=m -c user.email=m@x commit -qm vendor")
        assert c.call("git_commit", message="checkpoint")["commit"]

        # The traps. Each would run `run_on_host` as root on the host, redirect the push,
        # copy alice's objects, or cost the honest work, if the host read it.
        c.call("write_file", path="/tmp/traps.sh", content=f"""set -e
cd /mnt/project
git -C vendor config filter.x.clean "{run_on_host}"
git -C vendor config filter.x.smudge "{run_on_host}"
echo '* filter=x' > vendor/.gitattributes
git config core.fsmonitor "{run_on_host}"
git config core.hooksPath .githooks
git config 'remote.{push_url}.url' '{alice_url}'
git config 'url.{alice_url}.insteadOf' '{push_url}'
git config diff.x.textconv "{run_on_host}"
echo '* diff=x' > .gitattributes
mkdir -p .githooks .git/hooks
for h in pre-commit post-commit reference-transaction pre-push; do
  printf '#!/bin/sh\\n%s\\n' "{run_on_host}" > .githooks/$h; cp .githooks/$h .git/hooks/$h
  chmod +x .githooks/$h .git/hooks/$h
done
mkdir -p leak && echo 'gitdir: {alice['repo']}' > leak/.git
mkdir -p .git/objects/info && echo '{alice['repo']}/objects' > .git/objects/info/alternates
mkdir -p empty-nested && git -C empty-nested init -q
touch .git/index.lock
truncate -s 200M big.bin
mkfifo fifo
sudo mknod null-device c 1 3
sudo cp /bin/sh rootshell && sudo chown root:root rootshell && sudo chmod 4755 rootshell
ln -s /etc/shadow shadow-link
sudo chown -R 0:0 /mnt/project
sudo chmod 4755 rootshell  # (the chown above cleared it)
sudo touch /mnt/project/app.py
# Keep rewriting .git/config while the host closes the session.
sudo setsid nohup bash -c 'while true; do printf "[core]\\n\\tfsmonitor = {run_on_host}\\n" > /mnt/project/.git/config.new; mv /mnt/project/.git/config.new /mnt/project/.git/config; done' >/dev/null 2>&1 < /dev/null &
""")
        guest("bash /tmp/traps.sh")
        seen = guest("stat -c '%U %a %F %n' rootshell null-device app.py")
        assert "root 4755" in seen["stdout"]  # the guest believes it made a setuid root file
        assert "character special" in seen["stdout"]

        committed = c.call("git_commit", message="after the traps")
        closed = c.call("session_close")
        report = c.call("report")
    finally:
        try:
            c.call("session_close")
        finally:
            c.close()
            server.stop()

    # Nothing ran on the host.
    assert not os.path.exists(marker) and not os.path.exists(marker + ".ran")

    # The share made nothing root-owned, setuid or a device on the host.
    project = config.projects_dir / "mallory" / "app"
    for path in [project, *project.rglob("*")]:
        st = os.lstat(path)
        assert st.st_uid != 0, path
        assert not st.st_mode & (stat.S_ISUID | stat.S_ISGID), path
        assert stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode), path

    # The honest files arrived in mallory's repository on Gitea, from vmd's own commit.
    assert closed["pushed"], closed
    mallory = gitea.repo_path("mallory", "app")
    head = git(mallory, "rev-parse", "main").stdout.strip()
    assert head == closed["commit"]
    tree = git(mallory, "ls-tree", "-r", "--full-tree", "main").stdout
    names = {line.split("\t", 1)[1] for line in tree.splitlines()}
    assert {"app.py", "README.md", "vendor/x.c", "vendor/.gitattributes", "rootshell"} <= names
    assert git(mallory, "show", "main:app.py").stdout == "print(42)\n"
    assert not any(n.split("/")[-1] == ".git" or "/.git/" in f"/{n}" for n in names), names
    assert not {"big.bin", "fifo", "null-device"} & names
    assert " 160000 " not in f" {tree}"  # no gitlink to a nested repository
    assert "120000" in next(line for line in tree.splitlines() if line.endswith("\tshadow-link"))
    assert git(mallory, "show", "main:shadow-link").stdout == "/etc/shadow"

    # What was left out is named, and the work was not lost over it.
    left_out = " ".join(closed["left_out"])
    for name in ("big.bin", "vendor/.git", "leak/.git", "fifo", "null-device"):
        assert name in left_out, (name, closed["left_out"])
    assert committed["commit"] and "big.bin" in committed["text"]

    # alice's repository is untouched and none of her objects reached mallory's.
    assert git(gitea.repo_path("alice", "secret"), "rev-parse", "main").stdout.strip() == alice["gitea_head"]
    for sha in (alice["commit"], alice["blob"]):
        assert git(mallory, "cat-file", "-e", sha).returncode != 0, sha
        assert git(repository_path(config.state_dir, "mallory", "app"), "cat-file", "-e", sha).returncode != 0

    # The token is nowhere the guest or a person could read it.
    history = git(mallory, "log", "-p", "--all", "--format=%H %an %s%n%b").stdout
    record = next(config.sessions_dir.glob("*/record.jsonl")).read_text()
    for text in (history, record, report["markdown"], str(closed)):
        assert TOKEN not in text
    for path in project.rglob("*"):
        if path.is_file() and path.stat().st_size < 10_000_000:
            assert TOKEN.encode() not in path.read_bytes(), path
