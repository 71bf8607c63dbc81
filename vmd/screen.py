"""The guest's screen and input: libvirt screenshots, QMP `input-send-event`.

Coordinates are in screenshot space (the image the agent was shown, scaled to fit the
configured size); they are mapped back to the guest's framebuffer and then to the USB
tablet's absolute axis. Buttons and keys pressed here are always released, even when
something fails half way, so a guest is never left with a stuck modifier.
"""

from __future__ import annotations

import io
import json
import time
from dataclasses import dataclass

import libvirt
import libvirt_qemu
from PIL import Image as PILImage

from vmd.keys import UnknownKey, char_keys, parse_combo

ABS_MAX = 32767  # QEMU's absolute axis range for the USB tablet
# Typing into a guest under TCG drops keys sent back to back (measured: a focusing click
# followed at once by text lost the first characters), so keys are paced.
KEY_GAP_S = 0.012
BUTTONS = {"left", "right", "middle"}


class ScreenError(Exception):
    """A screen or input request that cannot be done; the message is for the model."""


@dataclass
class Shot:
    png: bytes
    width: int
    height: int
    scale: float  # shown pixels per framebuffer pixel
    source_width: int
    source_height: int


class Screen:
    def __init__(self, domain: libvirt.virDomain, size: tuple[int, int]):
        self.domain = domain
        self.size = size
        # Framebuffer size as of the last screenshot; coordinates map through it.
        self._source: tuple[int, int] | None = None

    # --- screenshots -------------------------------------------------------------------

    def grab(self) -> PILImage.Image:
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
        image = PILImage.open(io.BytesIO(b"".join(chunks)))
        image.load()
        return image.convert("RGB")

    def screenshot(self) -> Shot:
        image = self.grab()
        source = image.size
        self._source = source
        scale = min(self.size[0] / source[0], self.size[1] / source[1], 1.0)
        if scale < 1.0:
            image = image.resize((round(source[0] * scale), round(source[1] * scale)),
                                 PILImage.LANCZOS)
        buf = io.BytesIO()
        image.save(buf, format="PNG", optimize=False, compress_level=6)
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
