"""The eval's hidden check (`hidden_check`, asked by `vmagent eval`, never by the model):
after the agent's work and before the close, vmd writes the check's files to a fresh
folder in the session's guest, outside the project folder, and runs the check's command
in the project folder, bounded like every run. The agent never saw the files: they come
after its last turn, and the folder is removed after the run. Like the baseline run
(vmd/session/verification.py), this is vmd's own run; the verb's line in the record keeps
the run."""

from __future__ import annotations

import secrets
import shlex

from vmd import verbs as V
from vmd.errors import refused
from vmd.session import verification as check
from vmd.session.session import Session

# Outside the project share, so that nothing of the check is committed or pushed, and on
# the guest's disk rather than /tmp (a tmpfs on some images).
CHECK_ROOT = "/var/tmp"


def hidden_check(session: Session, p: V.HiddenCheck, notify) -> dict:
    if (session.s.os_family or "linux") != "linux":
        raise refused(f"a hidden check runs on Linux guests only; this session's guest is "
                      f"{session.s.os_family}. Run the eval on a Linux image (--os debian).")
    machine = session.ready_machine()
    folder = f"{CHECK_ROOT}/vmd-check-{secrets.token_hex(6)}"
    for name, text in p.files.items():
        machine.guest.write_file(f"{folder}/{name}", text)
    cwd = session.s.facts.get("project_path") or machine.project_path if session.s.project_dir else None
    command = f"export CHECK_DIR={shlex.quote(folder)}; mkdir -p \"$CHECK_DIR\"; {p.command}"
    timeout = min(p.timeout, session.verify_timeout)
    run = check.run_check(machine.guest, command, p.expect_exit, cwd, timeout, None,
                          session.config.output_tail_chars)
    try:
        machine.guest.run(f"rm -rf {shlex.quote(folder)}", timeout=60)
    except Exception:  # the machine is destroyed at the close anyway
        pass
    verdict = "passed" if run.passed else ("timed out" if run.timed_out else "failed")
    text = (f"The hidden check {verdict}: exit {run.exit_code} (expected {p.expect_exit}) after "
            f"{run.duration:.1f} s.\nOutput tail:\n{run.output_tail[-1500:]}")
    return {**run.model_dump(), "command": p.command, "expect_exit": p.expect_exit, "text": text}


HANDLERS = {
    "hidden_check": hidden_check,
}
