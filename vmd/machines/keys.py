"""Key names and characters mapped to QEMU key codes (QMP `qcode`s).

The model names keys the way people write them ("ctrl+alt+t", "Return", "Page_Down");
QEMU wants qcodes. `type` text is mapped character by character with the shift state
a US keyboard layout needs, which is the layout the guest images use.
"""

from __future__ import annotations

import string


class UnknownKey(ValueError):
    pass


_NAMED = {
    "ctrl": "ctrl", "control": "ctrl", "lctrl": "ctrl", "rctrl": "ctrl_r", "ctrl_r": "ctrl_r",
    "alt": "alt", "lalt": "alt", "ralt": "alt_r", "alt_r": "alt_r", "altgr": "alt_r",
    "shift": "shift", "lshift": "shift", "rshift": "shift_r", "shift_r": "shift_r",
    "super": "meta_l", "win": "meta_l", "windows": "meta_l", "meta": "meta_l", "cmd": "meta_l",
    "enter": "ret", "return": "ret", "ret": "ret", "kp_enter": "kp_enter",
    "esc": "esc", "escape": "esc", "backspace": "backspace", "tab": "tab",
    "space": "spc", "spc": "spc", "delete": "delete", "del": "delete", "insert": "insert",
    "ins": "insert", "home": "home", "end": "end", "pageup": "pgup", "page_up": "pgup",
    "pgup": "pgup", "prior": "pgup", "pagedown": "pgdn", "page_down": "pgdn", "pgdn": "pgdn",
    "next": "pgdn", "up": "up", "down": "down", "left": "left", "right": "right",
    "capslock": "caps_lock", "caps_lock": "caps_lock", "menu": "menu", "print": "print",
    "printscreen": "print", "pause": "pause", "numlock": "num_lock", "scrolllock": "scroll_lock",
}
_NAMED.update({f"f{i}": f"f{i}" for i in range(1, 13)})

# Unshifted punctuation and the qcode of its key.
_PUNCT = {
    "-": "minus", "=": "equal", "[": "bracket_left", "]": "bracket_right", "\\": "backslash",
    ";": "semicolon", "'": "apostrophe", "`": "grave_accent", ",": "comma", ".": "dot",
    "/": "slash", " ": "spc", "\n": "ret", "\t": "tab",
}
# Shifted characters and the unshifted character on the same key.
_SHIFTED = {
    "!": "1", "@": "2", "#": "3", "$": "4", "%": "5", "^": "6", "&": "7", "*": "8", "(": "9",
    ")": "0", "_": "-", "+": "=", "{": "[", "}": "]", "|": "\\", ":": ";", '"': "'", "~": "`",
    "<": ",", ">": ".", "?": "/",
}
_PUNCT_NAMES = {"minus": "-", "equal": "=", "plus": "=", "comma": ",", "period": ".", "dot": ".",
                "slash": "/", "backslash": "\\", "semicolon": ";", "apostrophe": "'",
                "grave": "`", "bracketleft": "[", "bracketright": "]"}


def valid_key_names() -> list[str]:
    return sorted(set(_NAMED) | set(_PUNCT_NAMES)) + ["a-z", "0-9"]


def key_qcode(name: str) -> str:
    """The qcode of one key name ('ctrl', 'Return', 'a', 'F5', '-')."""
    raw = name.strip()
    low = raw.lower()
    if len(raw) == 1:
        if raw.lower() in string.ascii_lowercase or raw in string.digits:
            return raw.lower()
        if raw in _PUNCT:
            return _PUNCT[raw]
        if raw in _SHIFTED:
            return _PUNCT.get(_SHIFTED[raw], _SHIFTED[raw])
    if low in _NAMED:
        return _NAMED[low]
    if low in _PUNCT_NAMES:
        return _PUNCT[_PUNCT_NAMES[low]]
    raise UnknownKey(
        f"unknown key name '{name}'. Valid names: {', '.join(valid_key_names())}; "
        "combine them with '+', e.g. 'ctrl+alt+t' or 'shift+Tab'."
    )


def parse_combo(keys: str) -> list[str]:
    """'ctrl+alt+t' -> ['ctrl', 'alt', 't'] as qcodes; a lone '+' is the plus key."""
    text = keys.strip()
    if text in ("+", "plus"):
        return ["shift", "equal"]
    parts = [p for p in text.replace(" ", "").split("+")]
    if any(p == "" for p in parts):
        raise UnknownKey(f"'{keys}' has an empty part; write combinations like 'ctrl+c'.")
    codes = []
    for part in parts:
        if len(part) == 1 and part in _SHIFTED:
            codes += ["shift", key_qcode(part)]
        elif len(part) == 1 and part.isupper():
            codes += ["shift", part.lower()]
        else:
            codes.append(key_qcode(part))
    return codes


def char_keys(ch: str) -> tuple[bool, str]:
    """(needs shift, qcode) for one character of typed text."""
    if ch in string.ascii_lowercase or ch in string.digits:
        return False, ch
    if ch in string.ascii_uppercase:
        return True, ch.lower()
    if ch in _PUNCT:
        return False, _PUNCT[ch]
    if ch in _SHIFTED:
        return True, _PUNCT.get(_SHIFTED[ch], _SHIFTED[ch])
    if ch == "\r":
        return False, "ret"
    raise UnknownKey(
        f"cannot type {ch!r}: `type` covers printable ASCII, newline and tab. Write other "
        "characters into a file with write_file instead."
    )
