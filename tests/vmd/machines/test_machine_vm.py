"""The machine layer on a real Debian guest under libvirt (TCG in CI).

One guest is booted for the module (a cold TCG boot costs 30-40 s) and destroyed by the
last test, which checks that nothing is left behind.
"""

from __future__ import annotations

import io
import os
import socket
import statistics
import string
import subprocess
import textwrap
import threading
import time
import uuid

import libvirt
import pytest
from PIL import Image as PILImage, ImageStat

from tests.conftest import make_traversable

from vmd.guests.guest import GuestError
from vmd.guests.linux.guest import LinuxGuest
from vmd.guests.linux.runner_link import RUNNER_PATH
from vmd.machines import screen_text
from vmd.machines.machine import Machine
from vmd.machines.screen import ScreenError

pytestmark = pytest.mark.vm


def machine_with_project(image, root):
    """A new guest sharing `root/project` (writable by the guest's user) as /mnt/project."""
    make_traversable(root)
    project = root / "project"
    project.mkdir()
    os.chmod(project, 0o777)
    machine = Machine.create(image, name=f"vmtest-{uuid.uuid4().hex[:8]}", workdir=root / "work",
                             project_dir=project)
    return machine, project


@pytest.fixture(scope="module")
def booted(debian_image, tmp_path_factory):
    machine, project = machine_with_project(debian_image, tmp_path_factory.mktemp("machine"))
    try:
        facts = machine.ready(timeout=300, desktop=True)
        yield machine, facts, project
    finally:
        machine.destroy()


def test_ready_returns_facts_read_from_the_guest(booted):
    machine, facts, _ = booted
    assert "Debian" in facts.os
    assert facts.kernel.startswith("Linux ")
    assert facts.python.startswith("Python 3")
    assert facts.git.startswith("git version")
    assert facts.desktop is True
    assert facts.project_path == "/mnt/project" and facts.project_mounted
    assert len(facts.boot_id) == 36
    assert 0 < facts.seconds < 300


def test_uname_runs_in_the_guest(booted):
    machine, _, _ = booted
    result = machine.guest.run("uname -a")
    assert result.exit_code == 0
    assert result.stdout.startswith("Linux vmagent-guest")
    assert not result.truncated and not result.timed_out


def test_exit_code_stderr_and_cwd_come_back(booted):
    machine, _, _ = booted
    result = machine.guest.run("pwd; echo oops >&2; exit 3")
    assert result.exit_code == 3
    assert result.stdout.strip() == "/mnt/project"  # commands start in the project folder
    assert result.stderr.strip() == "oops"
    assert machine.guest.run("pwd", cwd="/tmp").stdout.strip() == "/tmp"


def test_five_megabytes_of_output_come_back_capped_with_head_and_tail(booted):
    machine, _, _ = booted
    script = "import sys; print('FIRST-LINE'); sys.stdout.write('x' * 5_000_000 + '\\n'); print('LAST-LINE')"
    lines = []
    result = machine.guest.run(f"python3 -c \"{script}\"", timeout=120,
                               on_output=lambda stream, line: lines.append(line))
    assert result.exit_code == 0
    assert result.truncated
    assert result.stdout.startswith("FIRST-LINE")
    assert result.stdout.rstrip().endswith("LAST-LINE")
    assert "bytes of output cut here" in result.stdout
    assert len(result.stdout) < 100_000
    assert lines[0] == "FIRST-LINE" and lines[-1] == "LAST-LINE"  # the live view saw it all


def test_a_timeout_kills_the_whole_process_tree_promptly(booted):
    machine, _, _ = booted
    started = time.monotonic()
    result = machine.guest.run("sleep 600 & setsid sleep 601 & sleep 602", timeout=5)
    elapsed = time.monotonic() - started
    assert result.timed_out
    assert "timeout" in result.stderr
    assert elapsed < 15, f"a 5 s timeout took {elapsed:.1f} s to return"
    left = machine.guest.run("pgrep -a sleep || true").stdout
    assert "sleep 60" not in left, f"processes outlived their timeout: {left}"


def test_run_goes_through_the_runner_kept_in_the_guest(booted):
    machine, _, _ = booted
    guest = machine.guest
    runs, execs = guest.runner_runs, guest.exec_runs
    assert guest.run("true").exit_code == 0
    assert guest.runner_runs == runs + 1 and guest.exec_runs == execs and guest.runner_off is None
    link = guest.runners.idle[-1]
    listed = guest.run(f"pgrep -f -- {RUNNER_PATH}").stdout.split()
    assert str(link.pid) in listed, f"the runner {link.pid} is not among {listed}"
    assert guest.run("kill -SEGV $$").exit_code == 139  # 128 + signal, as bash reported it


def test_a_timeout_through_the_runner_kills_the_daemons_it_started(booted):
    machine, _, _ = booted
    guest = machine.guest
    runs, execs = guest.runner_runs, guest.exec_runs
    command = ("setsid bash -c 'echo $$ > /tmp/daemon.pid; exec sleep 611' & "
               "sudo -n -E setsid bash -c 'echo $$ > /tmp/root-daemon.pid; exec sleep 612' & "
               "sleep 613")
    result = guest.run(command, timeout=5)
    assert result.timed_out and result.exit_code == 124 and "timeout" in result.stderr
    assert result.duration < 15
    assert guest.runner_runs == runs + 1 and guest.exec_runs == execs  # the runner killed them itself
    left = guest.run("for f in /tmp/daemon.pid /tmp/root-daemon.pid; do p=$(cat $f); "
                     "test -d /proc/$p && echo alive:$p; done; pgrep -a sleep; true").stdout
    assert "alive" not in left and "sleep 61" not in left, f"processes outlived their timeout: {left}"


def test_two_commands_at_once_on_one_guest_both_come_back(booted):
    guest = booted[0].guest
    results = {}

    def work(name, seconds):
        results[name] = guest.run(f"sleep {seconds}; echo {name}", timeout=60)

    def both(seconds) -> float:
        threads = [threading.Thread(target=work, args=(name, seconds)) for name in ("alpha", "beta")]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert results["alpha"].stdout == "alpha\n" and results["beta"].stdout == "beta\n"
        return time.monotonic() - started

    both(0)  # the first pair may start a second runner (python3's start under TCG)
    assert both(3) < 5.8, "the two commands ran one after the other"


def test_a_runner_killed_mid_command_loses_that_result_only(booted):
    guest = booted[0].guest
    with pytest.raises(GuestError, match="result is lost and vmd did not run it again"):
        guest.run("echo once >> /tmp/lost-count; kill -9 $PPID; sleep 30", timeout=60)
    assert guest.run("cat /tmp/lost-count").stdout == "once\n"  # a fresh runner; the command ran once
    assert "sleep 30" not in guest.run("pgrep -a sleep; true").stdout  # what it left was killed


def test_the_exec_path_still_works_when_forced(booted):
    machine, _, _ = booted
    guest = LinuxGuest(machine.ssh, machine.image.project_path, use_runner=False)
    result = guest.run("pwd; echo oops >&2; exit 3")
    assert (result.exit_code, result.stdout, result.stderr) == (3, "/mnt/project\n", "oops\n")
    timed = guest.run("setsid sleep 621 & sleep 622", timeout=3)
    assert timed.timed_out and "sleep 62" not in guest.run("pgrep -a sleep; true").stdout
    assert guest.exec_runs == 3 and guest.runner_runs == 0


def test_run_through_the_runner_is_far_quicker_than_a_fresh_ssh(booted):
    machine, _, _ = booted
    image = machine.image
    ssh = ["ssh", "-q", "-i", str(image.path("ssh_key")), "-p", str(machine.ssh_port),
           "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
           "-o", "BatchMode=yes", f"{image.user}@127.0.0.1", "true"]
    runs = machine.guest.runner_runs
    machine.guest.run("true")
    runner, fresh = [], []
    for _ in range(20):  # alternating, so that the host's load hits both alike
        t = time.perf_counter()
        assert machine.guest.run("true").exit_code == 0
        runner.append(time.perf_counter() - t)
        t = time.perf_counter()
        subprocess.run(ssh, check=True, timeout=60)
        fresh.append(time.perf_counter() - t)
    assert machine.guest.runner_runs == runs + 21
    r, f = statistics.median(runner), statistics.median(fresh)
    print(f"run('true') median: runner {r * 1000:.0f} ms, fresh ssh {f * 1000:.0f} ms, {f / r:.1f}x")
    assert r * 5 <= f, f"the runner ({r * 1000:.0f} ms) is not 5x below a fresh ssh ({f * 1000:.0f} ms)"


def test_a_file_written_in_the_project_is_on_the_host_at_once(booted):
    machine, _, project = booted
    token = uuid.uuid4().hex
    assert machine.guest.run(f"echo {token} > /mnt/project/from-guest.txt").exit_code == 0
    assert (project / "from-guest.txt").read_text().strip() == token


def test_files_read_write_append_list_and_edit_over_sftp(booted):
    machine, _, project = booted
    guest = machine.guest
    assert guest.write_file("notes/a.txt", "alpha\nbeta\n") == 11  # relative: the project
    guest.append_file("/mnt/project/notes/a.txt", "gamma\n")
    assert (project / "notes" / "a.txt").read_text() == "alpha\nbeta\ngamma\n"
    chunk = guest.read_file("notes/a.txt", offset=6, limit=4)
    assert chunk.content == "beta" and chunk.size == 17 and chunk.truncated
    guest.edit_file("notes/a.txt", "beta", "BETA")
    assert (project / "notes" / "a.txt").read_text() == "alpha\nBETA\ngamma\n"
    guest.write_file("notes/b.txt", "x x\n")
    with pytest.raises(GuestError, match="matched 2 times"):
        guest.edit_file("notes/b.txt", "x", "y")
    with pytest.raises(GuestError, match="matched nowhere"):
        guest.edit_file("notes/b.txt", "zzz", "y")
    names = {e.name: e.type for e in guest.list_dir("notes")}
    assert names == {"a.txt": "file", "b.txt": "file"}


def test_bad_paths_get_sentences_that_say_what_to_do(booted):
    guest = booted[0].guest
    with pytest.raises(GuestError, match="no such file.*list_dir"):
        guest.read_file("/nonexistent/file.txt")
    with pytest.raises(GuestError, match="Windows path"):
        guest.read_file("C:\\Users\\agent\\x.txt")
    with pytest.raises(GuestError, match="permission denied.*sudo"):
        guest.write_file("/etc/vmd-test", "x")
    with pytest.raises(GuestError, match="directory"):
        guest.read_file("/mnt/project")


def test_the_screenshot_has_the_configured_size_and_is_not_blank(booted):
    machine, _, _ = booted
    shot = machine.screen.screenshot()
    image = PILImage.open(io.BytesIO(shot.png))
    assert image.format == "PNG"
    assert (shot.width, shot.height) == image.size == tuple(machine.image.resolution)
    stat = ImageStat.Stat(image.convert("L"))
    assert stat.stddev[0] > 10, "the screen is one flat colour"
    assert len(image.getcolors(1 << 20) or []) > 2
    # The frame came from QEMU's own dump, not libvirt's slower stream (vmd/machines/screen.py).
    assert machine.screen.dump_off is None, machine.screen.dump_off
    assert not (machine.screen.dump_path.parent.stat().st_mode & 0o077), "the frame folder is QEMU's and vmd's only"


def test_the_guest_lists_its_windows_for_the_screen_text(booted):
    """The X11 listing moved into the Linux guest (vmd/guests/linux/x11_windows.py): on the real
    desktop it finds the terminal openbox manages, with its title bar as the frame's top."""
    machine, _, _ = booted
    [terminal] = [w for w in machine.guest.list_windows() if w.title == "terminal"]
    assert terminal.width > 100 and terminal.height > 100 and terminal.frame[2] > 0
    shot = machine.screen.screenshot()
    shown, why = screen_text.guest_windows(machine.guest, shot.scale, (shot.width, shot.height))
    assert why == "" and [w.title for w in shown].count("terminal") == 1


def _wait_for(machine, command: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = machine.guest.run(command, timeout=20)
        if result.exit_code == 0 and result.stdout.strip():
            return result.stdout
        time.sleep(0.5)
    return ""


def test_text_typed_into_the_focused_terminal_runs(booted):
    machine, _, _ = booted
    screen = machine.screen
    screen.screenshot()
    screen.click(400, 300)  # the terminal window opens at +30+30, 990x540
    time.sleep(0.5)
    printable = "".join(ch for ch in string.printable if ch not in "\t\n\r\x0b\x0c")
    screen.type("cat > /tmp/typed.txt\n")
    time.sleep(0.5)
    screen.type(printable + "\n")
    screen.key("ctrl+d")
    typed = _wait_for(machine, "test -s /tmp/typed.txt && sleep 0.5 && cat /tmp/typed.txt")
    assert typed == printable + "\n", "typed text differs from what the guest received"


def test_a_click_on_a_button_found_on_the_screenshot_has_an_effect(booted):
    machine, _, _ = booted
    program = textwrap.dedent("""
        import tkinter as tk
        root = tk.Tk(); root.title("clickme"); root.geometry("+700+420")
        def done():
            open("/tmp/clicked", "w").write("yes"); root.destroy()
        tk.Button(root, text="Press", bg="#00c000", activebackground="#00c000",
                  width=12, height=3, command=done).pack(padx=20, pady=20)
        root.mainloop()
    """)
    machine.guest.write_file("/tmp/clickme.py", program)
    machine.guest.run("rm -f /tmp/clicked; DISPLAY=:0 nohup python3 /tmp/clickme.py >/tmp/clickme.log 2>&1 &")
    assert _wait_for(machine, "DISPLAY=:0 xwininfo -name clickme >/dev/null && echo up")
    time.sleep(1.0)
    shot = machine.screen.screenshot()
    image = PILImage.open(io.BytesIO(shot.png)).convert("RGB")
    green = [(x, y) for y in range(0, image.height, 2) for x in range(0, image.width, 2)
             if image.getpixel((x, y)) == (0, 192, 0)]
    assert len(green) > 50, "the green button is not on the screenshot"
    cx = sum(x for x, _ in green) // len(green)
    cy = sum(y for _, y in green) // len(green)
    machine.screen.click(cx, cy)
    assert _wait_for(machine, "cat /tmp/clicked 2>/dev/null") == "yes"


def test_bad_screen_input_is_refused_with_the_valid_choices(booted):
    screen = booted[0].screen
    with pytest.raises(ScreenError, match="Valid names:.*ctrl"):
        screen.key("ctrl+nonsense")
    with pytest.raises(ScreenError, match="outside the screen"):
        screen.click(5000, 10)
    with pytest.raises(ScreenError, match="printable ASCII"):
        screen.type("naïve")


@pytest.fixture
def host_listener():
    """An HTTP server on every address of the host (0.0.0.0): its loopback and its own
    interfaces, what a guest with egress must not reach."""
    import http.server

    class Hello(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"reached-the-host")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("0.0.0.0", 0), Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


@pytest.fixture
def egress_world():
    """The stand-in internet and a private-range host, each in a namespace of the test's
    own, and the egress guard in force as vmd keeps it (vmd installs it at start)."""
    from tests.support.egress_hosts import namespace_host
    from vmd.machines.egress_guard import EgressGuard

    EgressGuard("libvirt-qemu").install()
    with namespace_host("inet", "203.0.113", "reached-the-internet") as internet, \
            namespace_host("lan", "192.168.231", "reached-a-private-range") as lan:
        yield internet, lan


def _reach(machine, host: str, port: int) -> str:
    """What the guest reads from host:port in 5 s: the first bytes, or 'unreachable'."""
    command = (f"timeout 8 bash -c 'exec 3<>/dev/tcp/{host}/{port} && printf \"GET / HTTP/1.0\\r\\n\\r\\n\" >&3 "
               f"&& head -c 300 <&3' 2>/dev/null || echo unreachable")
    return machine.guest.run(command, timeout=30).stdout


def test_a_guard_flushed_while_a_guest_has_egress_cuts_it_until_it_is_back(booted, host_listener, egress_world):
    # What a firewall reload does (Debian's nftables.conf begins with `flush ruleset`): the
    # table goes while a guest has egress. The watch (vmd/server/guard_watch.py, as vmd runs
    # it, here over this one guest) cuts the guest off within its round and, while the table
    # cannot be put back, keeps it cut; once it is back, egress comes back guarded.
    from vmd.machines.egress_guard import TABLE, EgressGuard
    from vmd.server.guard_watch import GuardWatch, Target

    machine, _, _ = booted
    internet, _ = egress_world
    guard = EgressGuard("libvirt-qemu")
    guard.install()
    notes: list[str] = []
    may_install = threading.Event()
    watch = GuardWatch(lambda: [Target("guest", machine, lambda event, **_: notes.append(event))], guard.problem,
                       lambda: may_install.is_set() and guard.install(), interval_s=0.5).start()
    try:
        machine.set_egress(True)
        assert _wait_for(machine, "ip -4 route | grep -q '^default via 10.0.3.2' && echo routed", timeout=60)
        assert "reached-the-internet" in _reach(machine, internet.address, 80)
        subprocess.run(["nft", "delete", "table", "inet", TABLE], check=True)
        deadline = time.monotonic() + 5
        while not notes and time.monotonic() < deadline:
            time.sleep(0.1)
        assert notes == ["egress_cut"]
        assert "unreachable" in _reach(machine, "10.0.3.2", host_listener)  # the host's loopback
        assert "unreachable" in _reach(machine, internet.address, 80)
        assert machine.guest.run("echo still here", timeout=30).stdout.strip() == "still here"
        may_install.set()  # the table can be put back now
        deadline = time.monotonic() + 10
        while notes[-1] != "egress_restored" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert notes == ["egress_cut", "egress_restored"] and guard.problem() is None
        assert _wait_for(machine, f"timeout 8 bash -c 'exec 3<>/dev/tcp/{internet.address}/80' && echo open", timeout=60)
        assert "unreachable" in _reach(machine, "10.0.3.2", host_listener)
    finally:
        watch.stop()
        guard.install()
        machine.set_egress(False)


def test_egress_reaches_the_internet_and_never_the_host(booted, host_listener, egress_world, debian_image,
                                                        tmp_path):
    from tests.support.egress_hosts import host_addresses

    machine, _, _ = booted
    internet, lan = egress_world
    # Closed by default: restrict=on keeps the SSH forward but lets nothing out.
    assert "unreachable" in _reach(machine, internet.address, 80)
    assert "unreachable" in _reach(machine, "10.0.2.2", host_listener)
    # The guest knows its SSH NIC by its PCI slot (each machine has its own MAC address) and
    # gives it no default route: without egress a connection fails at once.
    routes = machine.guest.run("ip -4 route", timeout=30).stdout
    assert "default" not in routes and "10.0.2.0/24" in routes, routes
    assert not machine.egress_open()
    # Another running guest: its QEMU listens on the host's loopback for its SSH forward.
    other, _ = machine_with_project(debian_image, tmp_path)
    try:
        with socket.create_connection(("127.0.0.1", other.ssh_port), timeout=5):
            pass  # it listens (the host reaches it), so a refusal below is the guard's
        machine.set_egress(True)
        assert machine.egress_open()
        assert _wait_for(machine, "ip -4 route | grep -q '^default via 10.0.3.2' && echo routed", timeout=60)
        routes = machine.guest.run("ip -4 route", timeout=30).stdout
        assert routes.count("default") == 1, routes  # the egress NIC's route only
        assert "reached-the-internet" in _reach(machine, internet.address, 80)
        # Not the host: its loopback through slirp's gateway, its loopback's other names,
        # its own interfaces' addresses (found, not named), its end of the test's veth.
        refused = {"gateway (host loopback)": ("10.0.3.2", host_listener),
                   "another guest's SSH forward": ("10.0.3.2", other.ssh_port),
                   "the host's veth address": (internet.host_side, host_listener),
                   "a private range": (lan.address, 80)}
        for i, address in enumerate(host_addresses()):
            refused[f"host address {i}"] = (address, host_listener)
        reached = {what: out for what, (host, port) in refused.items()
                   if "unreachable" not in (out := _reach(machine, host, port))}
        assert not reached, reached
        # The host itself reaches the private-range server: the route is there, the guard holds.
        with socket.create_connection((lan.address, 80), timeout=5):
            pass
        machine.set_egress(False)
        assert not machine.egress_open()
        assert "unreachable" in _reach(machine, internet.address, 80)
    finally:
        other.destroy()


def test_destroy_leaves_nothing_but_the_project_folder(debian_image, tmp_path):
    machine, project = machine_with_project(debian_image, tmp_path)
    try:
        machine.ready(timeout=300)
        machine.guest.run("echo kept > /mnt/project/kept.txt && sync")
    except BaseException:
        machine.destroy()
        raise
    pid = int(subprocess.run(["pgrep", "-f", f"guest={machine.name}"], capture_output=True,
                             text=True).stdout.split()[0])
    machine.destroy()
    conn = libvirt.open("qemu:///system")
    assert machine.name not in [d.name() for d in conn.listAllDomains()]
    assert not (tmp_path / "work" / "overlay.qcow2").exists()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", machine.ssh_port)) != 0, "the SSH forward is still open"
    assert (project / "kept.txt").read_text() == "kept\n"
