"""A model that cannot see images works a real guest's screen through text: on a real
debian guest a scripted text-only model launches a small Tk window with an "Approve"
button, takes a screenshot, reads the button's point from the screen read as text (OCR
on the host, the guest's window list), clicks it, and finishes with a check that the
click happened. No image ever reaches the model. The guest's terminal, idle at its prompt
all the while (the commands run over SSH), reads as that prompt under its window."""

from __future__ import annotations

import json
import re

import pytest

from tests.support.guests import clean_up_domains
from tests.support.loop_harness import agent_config, call, calls
from tests.support.ollama_server import start_ollama
from tests.support.vmd_fakes import make_config
from vmagent.loop import run_job
from vmagent.loop.job import JobSpec
from vmd.machines.libvirt_machines import LibvirtMachines
from vmd.server.rpc import VmdServer

pytestmark = pytest.mark.vm

# Without "vision": Ollama would drop images for such a model, silently.
TEXT_ONLY = ["completion", "tools"]
CHECK = "test -f /mnt/project/clicked.txt"
APP = """import tkinter as tk

root = tk.Tk()
root.title("Approval needed")
tk.Label(root, text="Please review the change", font=("DejaVu Sans", 12)).pack(padx=30, pady=12)


def approve():
    with open("/mnt/project/clicked.txt", "w") as fh:
        fh.write("approved\\n")
    root.destroy()


tk.Button(root, text="Approve", font=("DejaVu Sans", 12), command=approve).pack(padx=30, pady=12)
root.mainloop()
"""
# The point of the word in the screen text: `"Approve" at (x, y)` as an item of its own,
# or `Approve (x, y)` in an item's list of words.
APPROVE_AT = re.compile(r'(?:"Approve" at|\bApprove) \((\d+), (\d+)\)')
# What the guest's skeleton .bashrc prompts: user agent on host vmagent-guest (vmd/images/debian).
PROMPT = "agent@vmagent-guest:~$"


def window_text(screen: str, title: str) -> list[str]:
    """The items listed under the window titled `title` in the screen text."""
    lines = screen.splitlines()
    start = next((n for n, line in enumerate(lines) if line.startswith(f'Window "{title}" at ')), None)
    if start is None:
        return []
    items = []
    for line in lines[start + 1:]:
        if not line.startswith("- "):
            break
        items.append(line)
    return items


def _last_tool_text(body: dict) -> str:
    tool_messages = [m for m in body.get("messages") or [] if m.get("role") == "tool"]
    return str(tool_messages[-1].get("content", "")) if tool_messages else ""


def click_approve(seen: dict):
    """The model's turn after the screenshot: find "Approve" in the screen text and click it."""

    def turn(body: dict):
        screen = _last_tool_text(body)
        seen["screen"] = screen
        found = APPROVE_AT.search(screen)
        if found is None:  # the test fails below, with the screen text shown
            return call("update_task", {"id": 2, "status": "blocked", "note": "Approve is not on screen"})
        x, y = int(found[1]), int(found[2])
        seen["point"] = (x, y)
        return call("click", {"x": x, "y": y}, content=f"The Approve button is at ({x}, {y}).")

    return turn


def _clean_up_domains(marker: str) -> None:
    """A failed test must not leave a guest running: destroy the ones made under tmp_path."""
    import libvirt

    conn = libvirt.open("qemu:///system")
    try:
        clean_up_domains(conn, marker)
    finally:
        conn.close()


def test_a_text_only_model_clicks_a_button_it_read_on_screen(tmp_path, debian_image):
    seen: dict = {}
    script = [
        call("plan_tasks", {"tasks": ["start the approval window", "click Approve",
                                      "check that the click was recorded"]}),
        calls(("update_task", {"id": 1, "status": "in_progress"}),
              ("write_file", {"path": "/mnt/project/app.py", "content": APP})),
        call("run", {"command": "DISPLAY=:0 nohup python3 /mnt/project/app.py >/dev/null 2>&1 & "
                                "sleep 4; DISPLAY=:0 xdotool search --sync --name 'Approval needed'",
                     "timeout": 60}),
        calls(("update_task", {"id": 1, "status": "done", "note": "the window is up"}),
              ("screenshot", {})),
        click_approve(seen),
        call("run", {"command": "sleep 2; cat /mnt/project/clicked.txt"}),
        calls(("update_task", {"id": 2, "status": "done", "note": "clicked"}),
              ("update_task", {"id": 3, "status": "done", "note": "clicked.txt exists"})),
        call("finish", {"summary": "clicked Approve", "verification": CHECK}),
    ]
    config = make_config(tmp_path, images_dir=debian_image.dir.parent, boot_timeout_s=900,
                         verify_timeout_s=300)
    server = VmdServer(config, LibvirtMachines(config)).start()
    events: list[dict] = []
    try:
        with start_ollama(script, capabilities=TEXT_ONLY) as ollama:
            outcome = run_job(JobSpec(task="Approve the change in the window", os="debian", project="approve"),
                              on_event=events.append, transcript_path=tmp_path / "job" / "transcript.json",
                              config=agent_config(ollama, request_timeout_s=120, deadline_s=1800,
                                                  boot_wait_s=900),
                              vmd_socket=str(config.socket))
            requests = ollama.chat_requests
    finally:
        server.stop()
        _clean_up_domains(str(tmp_path))

    screen = seen.get("screen", "")
    assert "point" in seen, f"the model did not find Approve in what it read:\n{screen}\n{outcome.report}"
    assert screen.startswith("NOTE: the model you run on cannot see images"), screen
    assert 'Window "Approval needed"' in screen, screen
    # The terminal is idle, and the text says so: its prompt, under its window (it said "no
    # text read on it" before the terminal's cells were read).
    assert any(line.startswith(f'- "{PROMPT}" at (') for line in window_text(screen, "terminal")), screen
    assert outcome.state == "done" and outcome.verification_passed is True, outcome.report
    project = config.projects_dir / "local" / "approve"
    assert (project / "clicked.txt").read_text() == "approved\n"
    # the model never got an image; the person watching got the screenshot
    for body in requests:
        for message in body.get("messages") or []:
            assert "images" not in message, json.dumps(message)[:300]
    assert any(e.get("type") == "screenshot" and e.get("png_base64") for e in events)
