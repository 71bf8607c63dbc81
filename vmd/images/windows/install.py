"""The install boot: what the host needs for it, running it under libvirt until the guest
says it is ready on COM1, and keeping its disk as a compressed base image."""

from __future__ import annotations

import shutil
import socket
import stat
import subprocess
import time
from pathlib import Path
from typing import Callable

from vmd.errors import WordedError
from vmd.guests.windows import contract
from vmd.host_env import clean_env
from vmd.images.windows.install_watch import FAILED, cd_started, firmware_problem, guest_steps, stopped_in
from vmd.machines.domain_xml import OVMF_CODE, OVMF_VARS

# Setup takes 20-40 min under KVM on an SSD, plus the OpenSSH download at the first logon;
# past this the install is stuck (a prompt nobody answers, a driver missing), not slow.
INSTALL_TIMEOUT_S = 2 * 3600
# After the ready marker: Windows shuts down in well under a minute; past this it is forced off.
SHUTDOWN_TIMEOUT_S = 300
# Media without the no-prompt loader (boot_medium.py) boot only after "Press any key to
# boot from CD or DVD", which Microsoft's loader shows for about 5 s: Enter is pressed this
# often, from the start and again for this long once the firmware starts the CD.
BOOT_KEY_EVERY_S = 1.0
BOOT_KEY_FOR_S = 20.0
# A prompt missed anyway (the CD's loader hands back a time-out): the machine is reset and
# the key pressed again, this many times, before the build says what happened.
CD_TRIES = 3
POLL_S = 5.0
NOTE_EVERY_S = 300.0  # a line of progress this often, so a 30-minute wait does not look hung
KVM_REFUSAL = ("this host has no working KVM, and Windows Setup under TCG (QEMU's emulation) takes hours, so "
               "vmd refuses to start it: build the Windows image on a host where `vmd doctor` reports KVM "
               "(/dev/kvm usable by QEMU), then copy the image folder here if you like.")


def host_problems(kvm_usable: Callable[[], bool], tpm: bool = True) -> list[str]:
    """What this host lacks for a Windows install, each as a sentence saying what to do."""
    problems = []
    if not kvm_usable():
        problems.append(KVM_REFUSAL)
    if not (Path(OVMF_CODE).is_file() and Path(OVMF_VARS).is_file()):
        problems.append(f"the UEFI firmware is missing ({OVMF_CODE}, {OVMF_VARS}): install Debian's ovmf package.")
    if tpm and not shutil.which("swtpm"):
        problems.append("swtpm is not installed, and Windows 11 needs a TPM 2.0: install Debian's swtpm and "
                        "swtpm-tools packages.")
    if not shutil.which("qemu-img"):
        problems.append("qemu-img is not installed: install Debian's qemu-utils package.")
    return problems


def closed_folder(path: Path) -> Path | None:
    """The first folder above `path` that QEMU, running as libvirt's unprivileged user
    (libvirt-qemu on Debian), cannot pass through; libvirt hands QEMU the file itself
    (it relabels it), never the folders above it."""
    for folder in list(path.resolve().parents)[::-1]:
        if not folder.exists():  # the build makes it (0711 for the image's own folder)
            break
        if not folder.stat().st_mode & stat.S_IXOTH:
            return folder
    return None


def unreachable(paths: list[Path]) -> list[str]:
    problems = []
    for path in paths:
        folder = closed_folder(path)
        if folder is not None:
            problems.append(f"QEMU runs as libvirt's unprivileged user and cannot pass through {folder} to reach "
                            f"{path}: move it to a folder others may pass (chmod o+x {folder} is another way).")
    return problems


def make_disk(path: Path, size_gb: int) -> None:
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(path), f"{size_gb}G"],
                   check=True, capture_output=True, env=clean_env())


def compress_base(disk: Path, out: Path) -> None:
    """The installed disk as a compressed qcow2 base, read-only like the Debian image's."""
    subprocess.run(["qemu-img", "convert", "-q", "-c", "-O", "qcow2", str(disk), str(out)],
                   check=True, capture_output=True, env=clean_env())
    out.chmod(0o444)


def serial_text(log: Path) -> str:
    try:
        return log.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def serial_says(log: Path, marker: str) -> str | None:
    """The ready marker, or a failure line firstlogon.ps1 wrote, from the serial log."""
    for line in serial_text(log).splitlines():
        if line.strip() == marker or FAILED in line:
            return line.strip()
    return None


class InstallFailed(WordedError, RuntimeError):
    """The install cannot run here or did not finish; the message says why and what to do."""


def _active(dom, libvirt) -> bool:
    try:
        return bool(dom.isActive())
    except libvirt.libvirtError:  # a transient domain that powered off is gone altogether
        return False


# After the ready marker: sshd may still be starting its listener; tries this long.
SSH_CHECK_S = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sshd_takes_key(port: int, user: str, key_path: Path, within_s: float = SSH_CHECK_S) -> Callable[[], None]:
    """The check the build makes once the guest says it is ready: vmd logs in as `user` with
    the image's key over the install's forward to the guest's port 22, as every session will.
    That proves sshd runs, the firewall lets it be reached, and sshd takes the key file (it
    ignores an administrators_authorized_keys whose ACL it does not like); raises with
    paramiko's or the socket's last word when it cannot within `within_s`."""
    def check() -> None:
        from vmd.guests.ssh import SshConnection  # paramiko, only when a build gets this far

        deadline = time.monotonic() + within_s
        while True:
            connection = SshConnection("127.0.0.1", port, user, str(key_path), connect_timeout=10)
            try:
                connection.transport()
                return
            except Exception as exc:  # refused, reset, auth failed: tried again until the bound
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{type(exc).__name__}: {exc}") from None
            finally:
                connection.close()
            time.sleep(2)

    return check


def screenshot(dom, path: Path) -> str:
    """The guest's screen saved as a PNG at `path`, said as the end of a sentence."""
    from vmd.machines.screen import Screen  # libvirt-python, as in run_install

    try:
        Screen(dom, (0, 0)).grab().save(path, "PNG")
    except Exception as exc:  # a gone domain, a libvirt without screenshots: the log says so
        return f"no screenshot of the guest could be taken ({exc})"
    return f"a screenshot of the guest: {path}"


class InstallRun:
    """One install machine, watched through its serial log until the guest is ready."""

    def __init__(self, dom, libvirt, serial_log: Path, out, press_keys: bool, poll_s: float,
                 boot_key_for_s: float):
        self.dom, self.libvirt, self.serial_log, self.out = dom, libvirt, serial_log, out
        self.press_keys, self.poll_s, self.boot_key_for_s = press_keys, poll_s, boot_key_for_s
        self.started = time.monotonic()
        self.keys_until = self.started + boot_key_for_s if press_keys else 0.0
        self.cd_seen = False
        self.mark = 0  # where the current boot's lines begin in the serial log (after a reset)
        self.tries = 1
        self.shown = 0  # the guest's `vmd:` lines already printed

    def failed(self, why: str, what_to_do: str = "") -> InstallFailed:
        text = serial_text(self.serial_log)
        shot = screenshot(self.dom, self.serial_log.with_name("install-screen.png"))
        return InstallFailed(f"{why} It stopped in {stopped_in(text)}; the whole serial log: {self.serial_log}; "
                             f"{shot}.{' ' + what_to_do if what_to_do else ''}")

    def firmware(self, text: str) -> None:
        """Acts on what the firmware said since the current boot began."""
        since = text[self.mark:]
        if self.press_keys and not self.cd_seen and cd_started(since):
            self.cd_seen = True  # the CD's loader is about to ask: keep pressing a while
            self.keys_until = max(self.keys_until, time.monotonic() + self.boot_key_for_s)
        problem = firmware_problem(since)
        if problem is None:
            return
        if problem == "timeout" and self.press_keys and self.tries < CD_TRIES:
            self.tries += 1
            print(f"  the CD's 'Press any key' prompt went unanswered; resetting the machine (try {self.tries} of "
                  f"{CD_TRIES})", file=self.out, flush=True)
            self.dom.reset(0)
            # From here on the log is the new boot's: what the old one printed after `text`
            # was read (the firmware's shell, say) is behind the mark too.
            self.mark, self.cd_seen = len(serial_text(self.serial_log)), False
            self.keys_until = time.monotonic() + self.boot_key_for_s
            return
        if problem == "timeout":
            raise self.failed(f"the install CD's loader waited for a key that never came ({self.tries} tries).",
                              "Its prompt is Microsoft's efisys.bin; media with efisys_noprompt.bin boot without it.")
        if problem == "nothing":
            raise self.failed("the firmware found nothing to boot (the disk is empty and the install CD did not "
                              "start Setup).", "Check that --iso is a bootable x64 Windows install ISO.")
        raise self.failed(f"the firmware could not start the install CD ({problem[4:]}).",
                          "Check that --iso is a bootable x64 Windows install ISO and reads whole (its sha256).")

    def press(self) -> None:
        try:
            self.dom.sendKey(self.libvirt.VIR_KEYCODE_SET_LINUX, 0, [28], 1, 0)  # KEY_ENTER
        except self.libvirt.libvirtError:
            pass  # the firmware is not reading keys yet

    def show_steps(self, text: str) -> None:
        """The first logon's steps as they come (what it tried, what it could not do)."""
        steps = guest_steps(text)
        for step in steps[self.shown:]:
            print(f"  guest: {step}", file=self.out, flush=True)
        self.shown = len(steps)

    def wait_ready(self, timeout_s: float) -> None:
        last_note = self.started
        while True:
            text = serial_text(self.serial_log)
            self.show_steps(text)
            said = serial_says(self.serial_log, contract.READY_MARKER)
            if said == contract.READY_MARKER:
                return
            if said:
                raise self.failed(f"the guest's first logon failed: {said}.")
            self.firmware(text)
            if not _active(self.dom, self.libvirt):
                raise self.failed(f"the install machine stopped before the guest said {contract.READY_MARKER}.")
            elapsed = time.monotonic() - self.started
            if elapsed > timeout_s:
                raise self.failed(f"Windows was not ready after {timeout_s / 60:.0f} min.")
            if time.monotonic() - last_note > NOTE_EVERY_S:
                print(f"  still installing ({elapsed / 60:.0f} min; now in {stopped_in(text)})", file=self.out,
                      flush=True)
                last_note = time.monotonic()
            if time.monotonic() < self.keys_until:
                self.press()
                time.sleep(min(BOOT_KEY_EVERY_S, self.poll_s))
            else:
                time.sleep(self.poll_s)


def run_install(domain_xml: str, serial_log: Path, uri: str, out, timeout_s: float = INSTALL_TIMEOUT_S,
                poll_s: float = POLL_S, boot_key_for_s: float = BOOT_KEY_FOR_S, press_keys: bool = True,
                ssh_check: Callable[[], None] | None = None) -> None:
    """Boot the install domain (transient: nothing is left defined in libvirt), watch its
    serial log until the guest says it is ready, then shut Windows down. `press_keys`: the
    install CD's loader asks for a key (media without the no-prompt loader: boot_medium.py);
    Enter is pressed while it may ask, and a missed prompt resets the machine. A failure
    names the step the install stopped in and leaves a screenshot beside the serial log.
    `ssh_check` (sshd_takes_key): asked once the guest is ready, before the shutdown."""
    # Here, not above: `vmd images build` and `vmd doctor` start without libvirt-python.
    import libvirt

    try:
        conn = libvirt.open(uri)
    except libvirt.libvirtError as exc:
        raise InstallFailed(f"libvirtd does not answer at {uri} ({exc}); start it (`systemctl start libvirtd`) "
                            f"and build again.") from exc
    dom = None
    try:
        try:
            dom = conn.createXML(domain_xml, 0)
        except libvirt.libvirtError as exc:
            raise InstallFailed(f"libvirt could not start the install machine: {exc}") from exc
        run = InstallRun(dom, libvirt, serial_log, out, press_keys, poll_s, boot_key_for_s)
        run.wait_ready(timeout_s)
        if ssh_check is not None:
            try:
                ssh_check()
            except Exception as exc:
                raise run.failed(f"the guest said {contract.READY_MARKER} but vmd could not log in over SSH with the "
                                 f"image's key ({exc}).", "sshd, its firewall rule or administrators_authorized_keys "
                                 "is not as the first logon left it: see the serial log's OpenSSH steps.") from None
            print("  sshd takes the image's key", file=out, flush=True)
        try:
            dom.shutdown()
        except libvirt.libvirtError:
            if _active(dom, libvirt):
                raise
            # It powered off on its own after the marker: nothing to shut down.
        deadline = time.monotonic() + SHUTDOWN_TIMEOUT_S
        while _active(dom, libvirt) and time.monotonic() < deadline:
            time.sleep(poll_s)
    finally:
        try:
            if dom is not None and _active(dom, libvirt):
                dom.destroy()
        except libvirt.libvirtError:
            pass  # it ended between the two calls
        conn.close()
