"""A Linux guest's window list, read from X11 on display :0 (xprop, xwininfo and xdotool over
the guest's shell): `LinuxVerbs.list_windows` (vmd/guests/linux/verbs.py) runs WINDOWS_COMMAND
and parses its answer here. The answer is the guest's text: every number in it is checked
(vmd/guests/guest.py `screen_coordinate`), and an entry that does not parse costs that
window, never the listing."""

from __future__ import annotations

from typing import Callable

from vmd.guests.guest import CommandResult, GuestError, ListedWindow, screen_coordinate

WINDOWS_TIMEOUT_S = 20.0
# Characters of a title kept from the guest; vmd/machines/screen_text.py cuts them again.
RAW_TITLE_CAP = 400

# Lists the guest's windows, bottom of the stack first: the window manager's own list
# (openbox keeps it), or every visible named window where no manager keeps one. xwininfo
# gives the absolute position (xdotool's is off by the title bar under openbox).
WINDOWS_COMMAND = r"""export DISPLAY=:0
ids=$(xprop -root _NET_CLIENT_LIST_STACKING 2>/dev/null | sed -n 's/.*# *//p' | tr -d ',')
[ -n "$ids" ] || ids=$(xdotool search --onlyvisible --name . 2>/dev/null)
[ -n "$ids" ] || { echo "no windows found on DISPLAY :0" >&2; exit 3; }
echo "@@active $(xdotool getactivewindow 2>/dev/null)"
for w in $ids; do
  echo "@@window $((w))"
  xwininfo -id "$w" 2>/dev/null | grep -E '^ *(Absolute upper-left [XY]|Width|Height|Map State):'
  printf 'Frame: %s\n' "$(xprop -id "$w" _NET_FRAME_EXTENTS 2>/dev/null | sed -n 's/^.*= *//p')"
  printf 'Name: %s\n' "$(xdotool getwindowname "$w" 2>/dev/null | head -c 400 | tr -d '\r\n')"
done
"""


def parse_x11_windows(listing: str) -> list[ListedWindow]:
    """The viewable windows of WINDOWS_COMMAND's output, front first, in framebuffer pixels."""
    active = ""
    found: list[dict] = []
    for line in listing.splitlines():
        if line.startswith("@@active "):
            active = line.split(" ", 1)[1].strip()
        elif line.startswith("@@window "):
            found.append({"id": line.split(" ", 1)[1].strip()})
        elif found and ":" in line:
            key, value = line.split(":", 1)
            found[-1].setdefault(key.strip(), value.strip())
    windows = []
    for entry in found:
        try:
            x = screen_coordinate(entry["Absolute upper-left X"])
            y = screen_coordinate(entry["Absolute upper-left Y"])
            width, height = screen_coordinate(entry["Width"]), screen_coordinate(entry["Height"])
        except (KeyError, ValueError):
            continue  # a listing the guest made up costs its own window, not the verb
        if entry.get("Map State") != "IsViewable" or width < 8 or height < 8:
            continue
        try:
            frame = tuple(max(0, screen_coordinate(v)) for v in entry.get("Frame", "").split(","))
        except ValueError:
            frame = ()
        windows.append(ListedWindow(title=entry.get("Name", "")[:RAW_TITLE_CAP], x=x, y=y, width=width,
                                    height=height, active=active != "" and entry["id"] == active,
                                    frame=frame if len(frame) == 4 else (0, 0, 0, 0)))
    windows.reverse()  # the stack lists the bottom first; the model wants the front first
    return windows


def list_x11_windows(run: Callable[..., CommandResult]) -> list[ListedWindow]:
    """The windows on the guest's display :0 through its `run`; GuestError when it did not list them."""
    result = run(WINDOWS_COMMAND, WINDOWS_TIMEOUT_S)
    if result.exit_code != 0:
        problem = (result.stderr or result.stdout or "").strip()
        raise GuestError(f"exit {result.exit_code}: {problem}")
    return parse_x11_windows(result.stdout)
