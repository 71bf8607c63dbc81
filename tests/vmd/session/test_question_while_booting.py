"""A question asked while the machine still boots: once answered, the session is ready
(it stayed `booting` for good before, while its status said the machine was ready)."""

from __future__ import annotations

import time

from tests.support.vmd_fakes import LocalMachines, local_vmd
from tests.support.vmd_wire import WireVmd


def test_a_question_asked_during_the_boot_resumes_to_ready(tmp_path):
    with local_vmd(tmp_path, LocalMachines(boot_seconds=1.0)) as (server, machines, config):
        c = WireVmd(config.socket, timeout=60).connect()
        c.call("session_open", os="debian", project="early", task="t", wait=False)
        c.call("plan_tasks", tasks=["one"])
        assert c.call("session_status")["state"] == "booting"
        assert c.call("ask_user", question="which colour?")["state"] == "question"
        time.sleep(2.0)  # the boot ends while the question waits
        assert c.call("session_resume", answer="blue")["state"] == "ready"
        assert c.call("session_status")["state"] == "ready"
        assert c.call("run", command="echo on")["stdout"].strip() == "on"
        c.call("session_close")
