"""Warm machines: guests booted ahead, saved to disk, handed out by restore.

A cold boot to a ready desktop takes 30-45 s under TCG (~10 s on KVM); a restore of a
saved guest takes about 1.5 s. A slot is one guest booted to the point a session needs
(desktop up, SSH answering), given its own identity (SSH host keys, machine-id: the image
bakes one of each), with the project share present but unmounted (QEMU refuses to save a
guest with a mounted 9p share), then saved with `virDomainSave` into its own folder:

    <state>/warm/<image dir>/<slot id>/   slot.json, saved.img, overlay.qcow2, console.log

A hand-out claims a slot by renaming its folder (atomic: no slot serves two sessions),
moves its overlay and console log into the session's folder, and restores it with the
saved XML edited to point at them and at the session's project folder (libvirt accepts
other file paths; the domain's name and devices must stay those saved). The slot's name
stays the domain's name; the session learns it from the machine (`name`). The session's
`ready` then mounts the share, sets the guest's clock and reads the same facts a boot does.

A restore that fails discards the slot, and the session boots cold instead, with a note
in the record. Slots of an older build of the image are discarded (the image folder's
name carries its recipe's hash). The refill runs in the background at low priority
(`nice`, cputune shares) and only while the host is not busier than twice its cores.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import libvirt
from pydantic import BaseModel

from vmd.images import Image

log = logging.getLogger("vmd.warm_pool")

SLOT_PREFIX = "vmagent-w-"
# What makes a booted guest a slot: its own SSH host keys and machine-id (every guest of
# an image would share the image's), nothing of the placeholder share mounted, and no
# process of ours left in the guest.
IDENTITY = ("rm -f /etc/ssh/ssh_host_* && ssh-keygen -A >/dev/null && "
            "tr -d - </proc/sys/kernel/random/uuid >/etc/machine-id && "
            "systemctl reload ssh")


class SlotInfo(BaseModel):
    """slot.json: what a hand-out needs to know of its slot."""
    name: str  # the libvirt domain's name, kept by the restore
    folder: str  # where the slot was made: the saved XML's paths start here
    share: str  # the placeholder share folder the slot was booted with
    ssh_port: int
    accel: str
    boot_seconds: float
    made_at: float


class WarmFailed(RuntimeError):
    """A slot could not be handed out; it was discarded."""


class WarmPool:
    def __init__(self, state_dir: Path, uri: str, qemu_user: str, size: int):
        self.dir = state_dir / "warm"
        self.uri = uri
        self.qemu_user = qemu_user
        self.size = size
        self.made = 0  # slots made by this pool (tests, the benchmark)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._making: str | None = None  # the slot domain booting now
        self._quiet_until = 0.0  # no refill before (monotonic): a session boots cold meanwhile

    # --- slots ---------------------------------------------------------------------------

    def _image_dir(self, image: Image) -> Path:
        return self.dir / image.dir.name

    def ready_slots(self, image: Image) -> list[Path]:
        folder = self._image_dir(image)
        if not folder.is_dir():
            return []
        # `.<id>.making`: still being made (its slot.json is written just before the rename).
        return sorted(p for p in folder.iterdir() if p.is_dir() and (p / "slot.json").is_file()
                      and not p.name.startswith(".") and not p.name.endswith(".taken"))

    def make_slot(self, image: Image) -> Path:
        """Boots one slot of `image` and saves it; returns its folder."""
        from vmd.machine import Machine, timeout_scale

        slot_id = uuid.uuid4().hex[:12]
        folder = self._image_dir(image) / f".{slot_id}.making"  # not a slot until renamed
        share = folder / "share"
        share.mkdir(parents=True)
        os.chmod(folder, 0o755)
        name = SLOT_PREFIX + slot_id
        self._making = name
        started = time.monotonic()
        machine = None
        try:
            machine = Machine.create(image, name=name, workdir=folder, project_dir=share, uri=self.uri,
                                     qemu_user=self.qemu_user)
            _renice(name)
            machine.ready(75 * timeout_scale(machine.accel), desktop=True)
            machine.guest.runners.close()  # its processes sit in the share: it must unmount
            machine.guest.use_runner = False
            prepared = machine.guest.run(f"sudo sh -c {shlex.quote(IDENTITY)} && sudo umount {image.project_path}",
                                         timeout=60, cwd="/")
            if prepared.exit_code != 0:
                raise WarmFailed(f"the slot could not be prepared: {(prepared.stdout + prepared.stderr)[-300:]}")
            boot_seconds = round(time.monotonic() - started, 1)
            machine.ssh.close()
            machine.domain.save(str(folder / "saved.img"))
            try:
                machine.domain.undefine()
            except libvirt.libvirtError:
                pass
            info = SlotInfo(name=name, folder=str(folder), share=str(share),
                            ssh_port=machine.ssh_port, accel=machine.accel, boot_seconds=boot_seconds,
                            made_at=time.time())
            (folder / "slot.json").write_text(info.model_dump_json())
            final = self._image_dir(image) / slot_id
            # The saved XML names the folder it was made in; a hand-out edits those paths.
            os.rename(folder, final)
            self.made += 1
            return final
        except BaseException:
            if machine is not None:
                try:
                    machine.destroy()
                except Exception:
                    pass
            else:
                Machine.discard(name, folder, self.uri)
            shutil.rmtree(folder, ignore_errors=True)
            raise
        finally:
            self._making = None

    def take(self, image: Image) -> Path | None:
        """Claims a ready slot of `image` (renamed to `<id>.taken`), or None."""
        for slot in self.ready_slots(image):
            claimed = slot.with_name(slot.name + ".taken")
            try:
                os.rename(slot, claimed)
            except OSError:
                continue  # another hand-out took it
            return claimed
        return None

    def hand_out(self, claimed: Path, image: Image, *, workdir: Path, project_dir: Path | None):
        """Restores the claimed slot as a session's machine (vmd.machine.Machine). The slot
        is gone afterwards, handed out or discarded (WarmFailed)."""
        from vmd.machine import Machine, connect

        try:
            info = SlotInfo.model_validate_json((claimed / "slot.json").read_text())
            saved = claimed / "saved.img"
            conn = connect(self.uri)
            xml = conn.saveImageGetXMLDesc(str(saved), 0)
            workdir.mkdir(parents=True, exist_ok=True)
            share = project_dir
            if share is None:  # a session without a project folder: an empty share of its own
                share = workdir / "share"
                share.mkdir(exist_ok=True)
            for part in ("overlay.qcow2", "console.log"):
                if (claimed / part).exists():
                    shutil.move(str(claimed / part), str(workdir / part))
            xml = _restore_xml(xml, info, workdir, share)
            (workdir / "domain.xml").write_text(xml)
            try:
                conn.restoreFlags(str(saved), xml, libvirt.VIR_DOMAIN_SAVE_RUNNING)
                domain = conn.lookupByName(info.name)
            except libvirt.libvirtError as exc:
                Machine.discard(info.name, workdir, self.uri)
                raise WarmFailed(f"libvirt could not restore it: {exc.get_error_message()}") from None
            machine = Machine.adopt_restored(image, name=info.name, workdir=workdir, project_dir=project_dir,
                                             uri=self.uri, domain=domain, ssh_port=info.ssh_port,
                                             accel=info.accel, qemu_user=self.qemu_user)
        except WarmFailed:
            (workdir / "overlay.qcow2").unlink(missing_ok=True)
            raise
        except Exception as exc:
            (workdir / "overlay.qcow2").unlink(missing_ok=True)
            raise WarmFailed(f"{type(exc).__name__}: {exc}") from None
        finally:
            shutil.rmtree(claimed, ignore_errors=True)
        return machine

    # --- the refill ------------------------------------------------------------------------

    def defer(self, seconds: float) -> None:
        """A session boots cold now: a slot's boot would compete with it, so the refill
        waits this long (a cold boot's budget) before it starts another."""
        self._quiet_until = max(self._quiet_until, time.monotonic() + seconds)

    def discard_stale(self, image: Image) -> None:
        """Slots of other builds of the image, claimed or half-made ones of an earlier vmd."""
        if not self.dir.is_dir():
            return
        for folder in self.dir.iterdir():
            if folder.name != image.dir.name and folder.name.startswith(image.name + "-"):
                shutil.rmtree(folder, ignore_errors=True)
        mine = self._image_dir(image)
        if mine.is_dir():
            for slot in mine.iterdir():
                if slot.name.endswith(".making"):  # an earlier vmd died while it booted: its guest goes too
                    from vmd.machine import Machine
                    try:
                        Machine.discard(SLOT_PREFIX + slot.name.strip(".").removesuffix(".making"), slot, self.uri)
                    except Exception as exc:
                        log.warning("could not destroy the half-made slot %s: %s", slot.name, exc)
                if slot.name.endswith(".taken") or slot.name.endswith(".making"):
                    shutil.rmtree(slot, ignore_errors=True)

    def start(self, find_image) -> "WarmPool":
        if self.size <= 0:
            return self
        self._thread = threading.Thread(target=self._loop, args=(find_image,), name="vmd-warm-pool", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        making = self._making
        if making is not None:  # a slot booting now: its create or ready fails and cleans up
            try:
                from vmd.machine import connect
                connect(self.uri).lookupByName(making).destroy()
            except Exception:
                pass
        if self._thread is not None:
            self._thread.join(60)

    def _loop(self, find_image) -> None:
        try:
            os.nice(10)  # this thread's own work (qemu-img, SSH) yields to the sessions'
        except OSError:
            pass
        image = None
        while not self._stop.is_set():
            try:
                current = find_image()
                if image is None or current.dir != image.dir:
                    image = current
                    self.discard_stale(image)
                if (len(self.ready_slots(image)) < self.size and not _host_busy()
                        and time.monotonic() >= self._quiet_until):
                    self.make_slot(image)
                    continue
            except Exception as exc:
                if self._stop.is_set():
                    return
                log.warning("the warm pool could not make a slot: %s", exc)
                self._stop.wait(30)
                continue
            self._stop.wait(2)


def _host_busy() -> bool:
    """Runnable work past twice the cores: a slot's boot now would slow the sessions' work.
    (An idle TCG guest alone keeps the load near 1 on a small host, so one core's worth
    would stop every refill while any session runs.)"""
    return os.getloadavg()[0] > 2 * (os.cpu_count() or 1)


def _renice(name: str, niceness: int = 10) -> None:
    """Every thread of a slot's QEMU (started by libvirtd, at its priority) yields to the
    sessions' guests while it boots; a hand-out's restore is a new QEMU, at the usual one."""
    try:
        pid = int(Path(f"/run/libvirt/qemu/{name}.pid").read_text().strip())
        for task in Path(f"/proc/{pid}/task").iterdir():
            os.setpriority(os.PRIO_PROCESS, int(task.name), niceness)
    except (OSError, ValueError):
        pass  # not QEMU here (the test driver), or it went meanwhile


def _restore_xml(xml: str, info: SlotInfo, workdir: Path, share: Path) -> str:
    """The saved XML with the slot's files moved to the session's folder and the share
    pointed at the session's project folder."""
    root = ET.fromstring(xml)
    for source in root.iter("source"):
        for attr in ("file", "path"):
            value = source.get(attr)
            if value and value.startswith(info.folder + "/"):
                source.set(attr, str(workdir / value[len(info.folder) + 1:]))
        if source.get("dir") == info.share:
            source.set("dir", str(share))
    return ET.tostring(root, encoding="unicode")
