"""The guest's screen and input: libvirt screenshots, QMP `input-send-event`.

Coordinates are in screenshot space (the image the agent was shown, scaled to fit the
configured size); they are mapped back to the guest's framebuffer and then to the USB
tablet's absolute axis. Buttons and keys pressed here are always released, even when
something fails half way, so a guest is never left with a stuck modifier.
"""

from __future__ import annotations

import io
import json
import logging
import os
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import libvirt
import libvirt_qemu
from PIL import Image as PILImage

from vmd.errors import WordedError
from vmd.machines.keys import UnknownKey, char_keys, parse_combo

ABS_MAX = 32767  # QEMU's absolute axis range for the USB tablet
# Typing into a guest under TCG drops keys sent back to back (measured: a focusing click
# followed at once by text lost the first characters), so keys are paced.
KEY_GAP_S = 0.012
BUTTONS = {"left", "right", "middle"}


class ScreenError(WordedError):
    """A screen or input request that cannot be done; the message is for the model."""


@dataclass
class Shot:
    png: bytes
    width: int
    height: int
    scale: float  # shown pixels per framebuffer pixel
    source_width: int
    source_height: int


# zlib level 1 instead of 6: a desktop frame encodes several times faster for a file
# about a quarter larger, and the frame goes to a local socket, not over a slow link.
PNG_COMPRESS_LEVEL = 1
# The largest frame file read back from QEMU: 2560x1600 RGB is 12 MB; a bigger file is not
# a frame of ours.
MAX_FRAME_BYTES = 64 * 1024 * 1024

log = logging.getLogger("vmd.machines.screen")


class Screen:
    def __init__(self, domain: libvirt.virDomain, size: tuple[int, int], dump_path: Path | None = None):
        self.domain = domain
        self.size = size
        # Where QEMU may write the framebuffer (QMP screendump, a PPM): 11 ms here against
        # 48 ms for libvirt's screenshot stream, which has QEMU encode a PNG that is then
        # decoded again. None, or a failed dump (a confined QEMU may not write there),
        # leaves the stream.
        self.dump_path = dump_path
        self.dump_off: str | None = None
        # Framebuffer size as of the last screenshot; coordinates map through it.
        self._source: tuple[int, int] | None = None
        # The last frame as captured and as shown, with when it was taken:
        # an unchanged frame is not decoded, scaled and encoded again, and the live
        # preview reuses a look the agent has just taken (`screenshot(max_age=...)`).
        self._last: tuple[bytes, Shot, float] | None = None
        self._lock = threading.Lock()

    # --- screenshots -------------------------------------------------------------------

    def grab(self) -> PILImage.Image:
        image = PILImage.open(io.BytesIO(self.grab_raw()))
        image.load()
        return image.convert("RGB")

    def grab_raw(self) -> bytes:
        """The framebuffer, undecoded: QEMU's own dump when it works, else libvirt's stream."""
        if self.dump_path is not None and self.dump_off is None:
            try:
                return self._dump()
            except (libvirt.libvirtError, OSError, ValueError) as exc:
                self.dump_off = str(exc)
                log.warning("screenshots of %s go through libvirt's stream: QEMU's screendump "
                            "to %s failed: %s", self.domain.name(), self.dump_path, exc)
        return self._stream()

    def _dump(self) -> bytes:
        command = json.dumps({"execute": "screendump", "arguments": {"filename": str(self.dump_path)}})
        reply = json.loads(libvirt_qemu.qemuMonitorCommand(self.domain, command, 0))
        if "error" in reply:
            raise ValueError(reply["error"].get("desc", reply["error"]))
        # QEMU's user writes the file: read it only as a plain file of bounded size.
        fd = os.open(self.dump_path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_FRAME_BYTES:
                raise ValueError(f"{self.dump_path} is not a frame ({info.st_size} bytes)")
            with os.fdopen(fd, "rb", closefd=False) as fh:
                return fh.read(MAX_FRAME_BYTES + 1)
        finally:
            os.close(fd)

    def _stream(self) -> bytes:
        """The framebuffer as libvirt's screenshot stream hands it over."""
        conn = self.domain.connect()
        stream = conn.newStream(0)
        try:
            self.domain.screenshot(stream, 0, 0)
            chunks = []
            while True:
                data = stream.recv(1 << 20)
                if not data or not isinstance(data, bytes):
                    break
                chunks.append(data)
            stream.finish()
        except libvirt.libvirtError as exc:
            try:
                stream.abort()
            except libvirt.libvirtError:
                pass
            raise ScreenError(f"could not capture the guest's screen: {exc}") from exc
        return b"".join(chunks)

    def screenshot(self, max_age: float = 0.0) -> Shot:
        """The screen now, scaled to fit the configured size, as PNG. With `max_age`, a
        shot taken at most that many seconds ago is good enough (the live preview)."""
        with self._lock:
            now = time.monotonic()
            if max_age > 0 and self._last is not None and now - self._last[2] <= max_age:
                return self._last[1]
            raw = self.grab_raw()
            # Compared whole (memcmp, well under a millisecond for a 1280x800 frame), not
            # hashed: a hash of 3 MB costs more than the comparison it would save.
            if self._last is not None and self._last[0] == raw:
                shot = self._last[1]  # the same frame: the same picture, nothing to encode
            else:
                shot = self._encode(raw)
            self._source = (shot.source_width, shot.source_height)
            self._last = (raw, shot, time.monotonic())
            return shot

    def _encode(self, raw: bytes) -> Shot:
        try:
            image = PILImage.open(io.BytesIO(raw))
            image.load()
        except (OSError, ValueError) as exc:
            raise ScreenError(f"the guest's screen could not be read ({exc}); take the screenshot again.") from exc
        image = image.convert("RGB")
        source = image.size
        scale = min(self.size[0] / source[0], self.size[1] / source[1], 1.0)
        if scale < 1.0:
            image = image.resize((round(source[0] * scale), round(source[1] * scale)),
                                 PILImage.LANCZOS)
        buf = io.BytesIO()
        image.save(buf, format="PNG", optimize=False, compress_level=PNG_COMPRESS_LEVEL)
        return Shot(png=buf.getvalue(), width=image.size[0], height=image.size[1], scale=scale,
                    source_width=source[0], source_height=source[1])

    # --- pointer -----------------------------------------------------------------------

    def _abs(self, x: int, y: int) -> tuple[int, int]:
        if self._source is None:
            self.screenshot()
        sw, sh = self._source
        scale = min(self.size[0] / sw, self.size[1] / sh, 1.0)
        shown_w, shown_h = round(sw * scale), round(sh * scale)
        if not (0 <= x < shown_w and 0 <= y < shown_h):
            raise ScreenError(f"({x}, {y}) is outside the screen, which is {shown_w}x{shown_h} in "
                              "screenshot pixels; take a screenshot and aim inside it.")
        fx, fy = x / scale, y / scale
        return (round(fx * ABS_MAX / max(sw - 1, 1)), round(fy * ABS_MAX / max(sh - 1, 1)))

    def _send(self, events: list[dict]) -> None:
        command = json.dumps({"execute": "input-send-event", "arguments": {"events": events}})
        try:
            reply = json.loads(libvirt_qemu.qemuMonitorCommand(self.domain, command, 0))
        except libvirt.libvirtError as exc:
            raise ScreenError(f"the guest did not take the input: {exc}") from exc
        if "error" in reply:
            raise ScreenError(f"QEMU refused the input: {reply['error'].get('desc', reply['error'])}")

    def _move_events(self, x: int, y: int) -> list[dict]:
        ax, ay = self._abs(x, y)
        return [{"type": "abs", "data": {"axis": "x", "value": ax}},
                {"type": "abs", "data": {"axis": "y", "value": ay}}]

    def move(self, x: int, y: int) -> None:
        self._send(self._move_events(x, y))

    def click(self, x: int, y: int, button: str = "left", double: bool = False) -> None:
        if button not in BUTTONS:
            raise ScreenError(f"unknown mouse button '{button}'; use left, right or middle.")
        self._send(self._move_events(x, y))
        time.sleep(0.05)
        for _ in range(2 if double else 1):
            self._press(button)

    def _press(self, button: str) -> None:
        pressed = False
        try:
            self._send([{"type": "btn", "data": {"down": True, "button": button}}])
            pressed = True
            time.sleep(0.04)
        finally:
            if pressed:
                self._send([{"type": "btn", "data": {"down": False, "button": button}}])
            time.sleep(0.04)

    def scroll(self, x: int, y: int, amount: int) -> None:
        self._send(self._move_events(x, y))
        button = "wheel-down" if amount > 0 else "wheel-up"
        for _ in range(min(abs(amount), 50)):
            self._press(button)

    # --- keyboard ----------------------------------------------------------------------

    def key(self, keys: str) -> None:
        try:
            codes = parse_combo(keys)
        except UnknownKey as exc:
            raise ScreenError(str(exc)) from exc
        self._chord(codes)

    def type(self, text: str) -> None:
        try:
            plan = [char_keys(ch) for ch in text]  # refuse before typing anything
        except UnknownKey as exc:
            raise ScreenError(str(exc)) from exc
        for shift, code in plan:
            self._chord(["shift", code] if shift else [code])
            time.sleep(KEY_GAP_S)

    def _chord(self, codes: list[str]) -> None:
        down: list[str] = []
        try:
            for code in codes:
                self._send([_key_event(code, True)])
                down.append(code)
            time.sleep(KEY_GAP_S)
        finally:
            for code in reversed(down):
                try:
                    self._send([_key_event(code, False)])
                except ScreenError:
                    pass


def _key_event(code: str, down: bool) -> dict:
    return {"type": "key", "data": {"down": down, "key": {"type": "qcode", "data": code}}}
