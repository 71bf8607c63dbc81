"""The Open WebUI tool file as Open WebUI calls it, against the whole stack on a real guest.

Open WebUI's side is played the way tests/vmagent/openwebui/test_openwebui_tool.py plays it: the file's
source exec'd into a fresh module, the injected `__user__`, `__chat_id__`,
`__message_id__` and an `__event_emitter__` that records what the chat would show. The
rest is real: the job service over HTTP with real worker processes and the turn loop,
`vmd serve` as its own process driving libvirt, and the Debian guest. The model is the
scripted Ollama server (tests/support/ollama_server.py).

The story: the agent plans, records the guest's boot id in the project folder, and asks
a question. The guest is paused while the question waits; then vmd and the job service
are both stopped and started again; the answer resumes the same guest (the boot id read
after the answer is the one read before it), and the agent finishes with a check that
vmd re-runs itself on a fresh machine.
"""

from __future__ import annotations

import re
import subprocess
import time

import pytest

from tests.support.guests import clean_up_domains
from tests.support.loop_harness import call, calls, user_texts
from tests.support.ollama_server import start_ollama
from tests.support.service_harness import REAL_WORKER, SERVICE, ServiceProcess, real_worker_env
from tests.vmagent.openwebui.test_openwebui_tool import USER, call as tool_call, jobs_of, load_tool
from tests.support.vmd_process import VmdProcess

pytestmark = pytest.mark.vm

CHAT = "chat-vm"
PROJECT = "greeting"
QUESTION = "Which greeting should greet.txt hold?"
ANSWER = "hello there"
BOOT_ID = "cat /proc/sys/kernel/random/boot_id"
# vmd re-runs this at finish, on a fresh machine with the committed project: the greeting
# is there. (That the session's guest never rebooted is the test's to read: boot_id.after.)
CHECK = "cd /mnt/project && grep -qx 'hello there' greet.txt"

SCRIPT = [
    call("plan_tasks", {"tasks": ["record the boot id", "ask which greeting to write",
                                  "write greet.txt and check the machine is the same"]},
         content="Planning while the machine boots."),
    calls(("update_task", {"id": 1, "status": "in_progress"}),
          # ...and waits for the desktop, as an agent about to use the screen would, so
          # that the live preview has the guest's desktop to show.
          ("run", {"command": f"{BOOT_ID} | tee /mnt/project/boot_id.before; export DISPLAY=:0; "
                              "until xwininfo -name terminal 2>/dev/null | grep -q IsViewable; "
                              "do sleep 0.5; done; sleep 3"})),
    calls(("update_task", {"id": 1, "status": "done", "note": "in boot_id.before"}),
          ("update_task", {"id": 2, "status": "in_progress"}),
          ("ask_user", {"question": QUESTION})),
    # --- after the answer, in a new worker, against a new vmd ---
    calls(("update_task", {"id": 2, "status": "done", "note": ANSWER}),
          ("run", {"command": f"{BOOT_ID} | tee /mnt/project/boot_id.after && "
                              f"echo '{ANSWER}' > /mnt/project/greet.txt"})),
    call("update_task", {"id": 3, "status": "done", "note": "greet.txt written, same boot id"}),
    call("finish", {"summary": "greet.txt holds the greeting the person chose",
                    "verification": {"command": CHECK, "expect_exit": 0}}),
]


def render_preview(tmp_path, embed: str) -> None:
    """Headless Chromium renders the preview of the live job; a PNG goes to artifacts/."""
    from tests.vmagent.service.test_preview_browser import ARTIFACTS, Browser  # Chromium comes with setup.sh

    url = re.search(r"https?://[^\s\"'<>]+/preview\?token=[^\s\"'<>]+", embed)[0].replace("&amp;", "&")
    browser = Browser(tmp_path)
    try:
        browser.open(url, width=1400, height=800)
        # The newest screenshot is the guest's desktop at its configured size.
        browser.wait_for("document.getElementById('screen').complete && "
                         "document.getElementById('screen').naturalWidth === 1280", timeout=30)
        terminal = browser.wait_for("document.getElementById('terminal').innerText.indexOf('boot_id') >= 0 && "
                                    "document.getElementById('terminal').innerText", timeout=30)
        assert "$ " in terminal  # commands shown as a person would type them
        ARTIFACTS.mkdir(exist_ok=True)
        browser.screenshot(ARTIFACTS / "preview-guest.png")
        shown = browser.evaluate(
            "(function(){var i=document.getElementById('screen'),c=document.createElement('canvas');"
            "c.width=i.naturalWidth;c.height=i.naturalHeight;var x=c.getContext('2d');x.drawImage(i,0,0);"
            "var d=x.getImageData(0,0,c.width,c.height).data,seen={};"
            "for(var k=0;k<d.length;k+=4*97){seen[d[k]+','+d[k+1]+','+d[k+2]]=1}"
            "return Object.keys(seen).length})()")
        assert shown > 3, "the preview shows a flat screen, not the guest's desktop"
    finally:
        browser.close()


def test_question_both_services_restarted_answer_and_the_same_guest_finishes(tmp_path, debian_image):
    import libvirt

    from tests.support.service_harness import stop_workers

    conn = libvirt.open("qemu:///system")
    timings: dict[str, float] = {}
    vmd = VmdProcess(tmp_path, debian_image.dir.parent).start()
    svc = None
    started = time.monotonic()
    try:
        with start_ollama(SCRIPT) as ollama:
            # Looks at the screen every second, so the preview shows the guest's desktop.
            env = {**real_worker_env(ollama.url), "VMAGENT_SCREEN_WATCH_S": "1"}
            svc = ServiceProcess(tmp_path / "svc", worker_command=REAL_WORKER, vmd_socket=str(vmd.socket),
                                 env=env).start()
            module = load_tool()
            tools = module.Tools()
            tools.valves = module.Tools.Valves(service_url=svc.url, service_token=SERVICE, poll_interval=0.3)

            # --- the task: plan, a command, a question -----------------------------------
            text, first = tool_call(tools.run_task_in_vm, CHAT, task="Write greet.txt with a greeting I pick",
                                    os="debian", project=PROJECT)
            timings["to the question"] = time.monotonic() - started
            assert QUESTION in text and "answer_vm_question" in text, text
            assert "Ask the person" in text
            statuses = first.statuses()
            assert statuses[-1] == {"description": "The VM agent has a question.", "done": True}
            assert all(s["done"] is False for s in statuses[:-1])
            [embed] = first.embeds()  # the preview went out once, when the first command ran
            assert embed["replace"] is True and "/preview?token=" in embed["embeds"][0]

            [waiting] = jobs_of(svc, CHAT)
            assert waiting["state"] == "needs_input" and waiting["question"] == QUESTION, waiting
            assert waiting["owner"] == USER["id"] and waiting["message_id"] == "m-1"
            session_id = waiting["session_id"]
            domain = conn.lookupByName(f"vmagent-{session_id}")
            # The guest waits paused: its vCPUs are stopped, it uses no CPU.
            assert domain.state()[0] == libvirt.VIR_DOMAIN_PAUSED
            project = vmd.state / "projects" / USER["id"] / PROJECT
            boot_before = (project / "boot_id.before").read_text().strip()
            assert len(boot_before) == 36, boot_before
            ready = next(e for e in vmd.record(session_id) if e["kind"] == "machine" and e["event"] == "ready")
            assert ready["facts"]["boot_id"] == boot_before

            # --- the preview, as the chat shows it: the guest's real screen and terminal ---
            render_preview(tmp_path, embed["embeds"][0])

            # --- both services stop and start again --------------------------------------
            svc_pid, vmd_pid = svc.proc.pid, vmd.proc.pid
            restart = time.monotonic()
            svc.stop()
            vmd.stop()
            assert domain.state()[0] == libvirt.VIR_DOMAIN_PAUSED, "the guest outlives vmd, still paused"
            vmd.start()
            svc.start()
            assert (svc.proc.pid, vmd.proc.pid) != (svc_pid, vmd_pid)
            timings["restart of both"] = time.monotonic() - restart
            [still] = jobs_of(svc, CHAT)
            assert still["state"] == "needs_input" and still["question"] == QUESTION
            assert domain.state()[0] == libvirt.VIR_DOMAIN_PAUSED

            # --- the answer: the same guest carries on to the finish ---------------------
            answered = time.monotonic()
            report, second = tool_call(tools.answer_vm_question, CHAT, answer=ANSWER)
            timings["answer to report"] = time.monotonic() - answered

        [done] = jobs_of(svc, CHAT)
        assert done["state"] == "done" and done["verification_passed"] is True, report
        assert report.startswith("Outcome: verified.") and report.endswith("\n\n" + done["report"])
        assert done["verification"] == {"passed": True, "proven": True, "attempts": 1}
        assert done["session_id"] == session_id
        statuses = second.statuses()
        assert statuses[0] == {"description": "Answer given; the same machine carries on…", "done": False}
        assert statuses[-1] == {"description": "The VM agent finished.", "done": True}
        assert all(s["done"] is False for s in statuses[:-1])
        # the answer reached the model, in the conversation it had before the question
        resumed = ollama.chat_requests[3]
        assert any(ANSWER in t for t in user_texts(resumed))
        assert any("Write greet.txt" in t for t in user_texts(resumed))

        # same machine, not rebooted: the boot id read after the answer is the one from before
        assert (project / "boot_id.after").read_text().strip() == boot_before
        assert (project / "greet.txt").read_text() == f"{ANSWER}\n"
        record = vmd.record(session_id)
        assert not any(e["kind"] == "machine" and e.get("event") == "ready"
                       for e in record[record.index(ready) + 1:]), "the guest was not booted again"

        # the report: vmd's own re-run of the check, and the commit
        assert "✅ verified" in report and "exit code **0**" in report and CHECK in report, report
        bare = vmd.state / "repos" / USER["id"] / f"{PROJECT}.git"
        head = subprocess.run(["git", "--git-dir", str(bare), "rev-parse", "main"], capture_output=True,
                              text=True, check=True).stdout.strip()
        assert head[:12] in report, report
        assert "`A greet.txt`" in report
        close = next(e for e in record if e["kind"] == "close")
        assert close["commit"] == head and close["machine_destroyed"] is True
        assert f"vmagent-{session_id}" not in [d.name() for d in conn.listAllDomains()], \
            "closing the session leaves no guest behind"
    finally:
        timings["total"] = time.monotonic() - started
        print("timings (s):", {k: round(v, 1) for k, v in timings.items()})
        if svc is not None:
            svc.stop()
            stop_workers(svc)
        vmd.stop()
        clean_up_domains(conn, str(tmp_path))
        conn.close()
