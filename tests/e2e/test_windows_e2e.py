"""The Windows guest from end to end, on a KVM host with the person's own ISO: build the image
(`vmd images build windows`, 20-40 min the first time, then up to date), run a job on it that
writes and runs hello.ps1 and finishes verified, opens Notepad through launch_app, types into it
and reads the text back from the screen (OCR, as a text-only model sees it); then makes two warm
slots of the image and hands them out, each with an identity of its own and its session's drive.

Opt-in (`windows` marker): it runs only where VMD_WINDOWS_ISO names an install ISO and QEMU
can use KVM; everywhere else, CI included, it is skipped, since no Windows can boot there.

    VMD_WINDOWS_ISO=~/Win11_23H2_English_x64.iso [VMD_WINDOWS_VIRTIO=~/virtio-win.iso] \\
    VMD_IMAGES_DIR=/var/lib/vmagent/images .venv/bin/python -m pytest -m windows tests/e2e/test_windows_e2e.py
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.support.guests import clean_up_domains
from tests.support.loop_harness import agent_config, call, calls
from tests.support.ollama_server import start_ollama
from tests.support.vmd_fakes import make_config
from vmd.images.windows.build import WindowsBuildOptions, build_windows
from vmd.machines.accel import kvm_works

ISO = os.environ.get("VMD_WINDOWS_ISO", "")
pytestmark = [
    pytest.mark.windows,
    pytest.mark.skipif(not ISO, reason="set VMD_WINDOWS_ISO to your Windows install ISO to run the Windows test"),
]
TEXT_ONLY = ["completion", "tools"]  # the screenshot then comes back as screen text (OCR)
HELLO = "Write-Output ('hello from ' + $PSVersionTable.PSEdition)\n"
# Select-String -Quiet answers True/False with success either way: the exit code must come from an `exit`.
CHECK = ("if (-not (powershell -NoProfile -File Z:\\hello.ps1 | Select-String -Quiet 'hello from Desktop')) "
         "{ exit 1 }")
TYPED = "typed by vmagent"


@pytest.fixture(scope="module")
def windows_images_dir(tmp_path_factory) -> Path:
    root = Path(os.environ.get("VMD_IMAGES_DIR") or tmp_path_factory.mktemp("images"))
    if not kvm_works(root):
        pytest.skip("QEMU cannot use KVM here; Windows Setup under TCG takes hours, so the build refuses")
    virtio = os.environ.get("VMD_WINDOWS_VIRTIO")
    build_windows(WindowsBuildOptions(iso=Path(ISO), virtio_win=Path(virtio) if virtio else None), root)
    return root


def destroy_left_guests(config, folder: Path) -> None:
    """A failed run leaves no Windows guest running: those with `folder` in their XML go."""
    import libvirt

    conn = libvirt.open(config.libvirt_uri)
    try:
        clean_up_domains(conn, str(folder))
    finally:
        conn.close()


def read_back(seen: dict):
    def turn(body: dict):
        tools = [m for m in body.get("messages") or [] if m.get("role") == "tool"]
        seen["screen"] = str(tools[-1].get("content", "")) if tools else ""
        return calls(("update_task", {"id": 3, "status": "done", "note": "read the screen"}))

    return turn


def test_a_job_on_windows_runs_powershell_and_drives_notepad(tmp_path, windows_images_dir):
    from vmagent.loop.job import JobSpec
    from vmagent.loop import run_job
    from vmd.machines.libvirt_machines import LibvirtMachines
    from vmd.server.rpc import VmdServer

    seen: dict = {}
    script = [
        call("plan_tasks", {"tasks": ["write and run hello.ps1", "type into Notepad", "read it back"]}),
        calls(("update_task", {"id": 1, "status": "in_progress"}),
              ("write_file", {"path": "Z:\\hello.ps1", "content": HELLO})),
        call("run", {"command": "powershell -NoProfile -File Z:\\hello.ps1", "timeout": 120}),
        calls(("update_task", {"id": 1, "status": "done", "note": "it printed hello"}),
              ("launch_app", {"path": "notepad.exe", "args": []})),
        call("wait", {"seconds": 5}),
        call("type", {"text": TYPED}),
        call("screenshot", {}),
        read_back(seen),
        calls(("update_task", {"id": 2, "status": "done", "note": "typed"})),
        call("finish", {"summary": "hello.ps1 runs; Notepad shows the text", "verification": CHECK}),
    ]
    config = make_config(tmp_path, images_dir=windows_images_dir, boot_timeout_s=600, verify_timeout_s=300)
    server = VmdServer(config, LibvirtMachines(config)).start()
    try:
        with start_ollama(script, capabilities=TEXT_ONLY) as ollama:
            outcome = run_job(JobSpec(task="Write hello.ps1 and show text in Notepad", os="windows", project="hello"),
                              transcript_path=tmp_path / "job" / "transcript.json",
                              config=agent_config(ollama, request_timeout_s=120, deadline_s=3600, boot_wait_s=900),
                              vmd_socket=str(config.socket))
    finally:
        server.stop()
        destroy_left_guests(config, tmp_path)

    assert outcome.state == "done" and outcome.verification_passed is True, outcome.report
    assert (config.projects_dir / "local" / "hello" / "hello.ps1").read_text().replace("\r\n", "\n") == HELLO
    assert re.search(r"Notepad", seen.get("screen", "")), seen.get("screen")
    assert TYPED in seen.get("screen", ""), f"the typed text is not on the screen as read:\n{seen.get('screen')}"


IDENTITY = ("'guid=' + (Get-ItemProperty -LiteralPath 'HKLM:\\SOFTWARE\\Microsoft\\Cryptography').MachineGuid; "
            "'readme=' + (Get-Content -Raw -LiteralPath 'Z:\\README.txt').Trim()")


def test_warm_windows_slots_come_with_identities_of_their_own_and_their_sessions_drive(windows_images_dir, request):
    from vmd.machines.host import local_host
    from vmd.machines.images import find_image
    from vmd.machines.warm_pool import WarmPool
    from vmd.projects.tree import share_owner

    # A short state folder, as vmd's own is: QEMU's SMB socket lies in a slot's folder, and a
    # Unix socket's path has 107 bytes at most.
    state = Path(tempfile.mkdtemp(prefix="vmdw-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(state, ignore_errors=True))
    for folder in (state, state / "sessions", state / "projects"):
        folder.mkdir(mode=0o711, exist_ok=True)
        folder.chmod(0o711)
    config = make_config(state, state_dir=state, images_dir=windows_images_dir, warm_pool_size=2)
    image = find_image("windows", windows_images_dir)
    pool = WarmPool(config, local_host(config.libvirt_uri), size=2)
    owner = share_owner(config.share_user)
    machines, seen = [], []
    try:
        for _ in (1, 2):
            pool.make_slot(image)
        for n in (1, 2):
            project = state / "projects" / f"p{n}"
            project.mkdir(mode=0o700)
            (project / "README.txt").write_text(f"session {n}\n")
            if owner is not None:
                for place in (project, project / "README.txt"):
                    os.chown(place, *owner)
            machine = pool.hand_out(pool.take(image), image, workdir=state / "sessions" / f"s{n}",
                                    project_dir=project, session_id=f"s{n}")
            machines.append(machine)
            facts = machine.ready(timeout=300, desktop=True)
            assert facts.project_mounted, facts
            done = machine.guest.run(IDENTITY, timeout=60)
            assert done.exit_code == 0, done.stdout + done.stderr
            said = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
            seen.append((said["guid"], machine.ssh.transport().get_remote_server_key().get_base64()))
            assert said["readme"] == f"session {n}"
        assert seen[0][0] != seen[1][0], "both slots kept one MachineGuid"
        assert seen[0][1] != seen[1][1], "both slots serve one sshd host key"
    finally:
        for machine in machines:
            machine.destroy()
        destroy_left_guests(config, state)


def test_the_image_s_first_logon_said_how_each_step_went(windows_images_dir):
    # The install's serial log stays in the image's folder: what the first logon wrote on
    # COM1 is the record of the steps docs/windows.md lists.
    from vmd.machines.images import find_image

    image = find_image("windows", windows_images_dir)
    log = (image.dir / "serial.log").read_text(errors="replace")
    width, height = image.resolution
    # No display driver: the firmware's mode (std VGA's EDID, the image's resolution) is Windows'.
    assert f"vmd: display {width}x{height}\r" in log or f"vmd: display {width}x{height}\n" in log, log
    assert re.search(r"vmd: OpenSSH Server: (already installed|the \S+ capability|the Win32-OpenSSH MSI)", log), log
    assert "vmd: autologon stays on" in log and "firstlogon failed" not in log
