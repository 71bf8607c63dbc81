"""The screen verbs (screenshot and input: the machine's screen, vmd/machines/screen.py; launch_app,
wait) and the machine verbs (check_internet, reboot_vm). Each result is made here from
what the screen or the guest returns."""

from __future__ import annotations

import base64
import time
from typing import TYPE_CHECKING

from vmd.contract.params import Click, Key, LaunchApp, Move, Screenshot, Scroll, TypeText, Wait
from vmd.machines.screen_text import read_screen

if TYPE_CHECKING:
    from vmd.session.session import Session


def screenshot(session: Session, p: Screenshot, notify) -> dict:
    machine = session.ready_machine()
    shot = machine.screen.screenshot()  # the screen now: never an older look
    path = session.record.save_screenshot(shot.png)
    text = f"screenshot {shot.width}x{shot.height} (coordinates are in these pixels)."
    result = {"width": shot.width, "height": shot.height, "scale": shot.scale, "path": path,
              "png_base64": base64.b64encode(shot.png).decode(), "text": text}
    if p.text:  # OCR costs a second or more: only when asked
        result["screen_text"] = read_screen(shot.png, shot.width, shot.height, shot.scale, machine.guest)
        result["text"] = text + " The screen read as text is in screen_text."
    return result


def click(session: Session, p: Click, notify) -> dict:
    session.ready_machine().screen.click(p.x, p.y, button=p.button, double=p.double)
    return {"ok": True, "text": f"{'double-' if p.double else ''}clicked {p.button} at ({p.x}, {p.y})."}


def move(session: Session, p: Move, notify) -> dict:
    session.ready_machine().screen.move(p.x, p.y)
    return {"ok": True, "text": f"moved the pointer to ({p.x}, {p.y})."}


def type_text(session: Session, p: TypeText, notify) -> dict:
    session.ready_machine().screen.type(p.text)
    return {"ok": True, "text": f"typed {len(p.text)} characters."}


def key(session: Session, p: Key, notify) -> dict:
    session.ready_machine().screen.key(p.keys)
    return {"ok": True, "text": f"pressed {p.keys}."}


def scroll(session: Session, p: Scroll, notify) -> dict:
    session.ready_machine().screen.scroll(p.x, p.y, p.amount)
    return {"ok": True, "text": f"scrolled {p.amount} at ({p.x}, {p.y})."}


def launch_app(session: Session, p: LaunchApp, notify) -> dict:
    return {"ok": True, "text": session.ready_machine().guest.launch_app(p.path, p.args)}


def wait(session: Session, p: Wait, notify) -> dict:
    time.sleep(p.seconds)
    return {"seconds": p.seconds, "text": f"waited {p.seconds:g} s."}


def check_internet(session: Session, p, notify) -> dict:
    online, detail = session.ready_machine().guest.check_internet(session.config.internet_probe)
    text = ("the guest reaches the internet." if online else
            "the guest has no internet (egress is closed by default); ask with request_unfreeze "
            "if the work needs it.")
    return {"online": online, "detail": detail, "text": text}


def reboot_vm(session: Session, p, notify) -> dict:
    seconds = session.ready_machine().reboot(session.boot_timeout)
    session.desktop_ready = False
    return {"seconds": seconds, "text": f"the machine rebooted and answers again after {seconds:.0f} s."}


HANDLERS = {
    "screenshot": screenshot,
    "click": click,
    "move": move,
    "type": type_text,
    "key": key,
    "scroll": scroll,
    "launch_app": launch_app,
    "wait": wait,
    "check_internet": check_internet,
    "reboot_vm": reboot_vm,
}
