"""A guest's window listing is text the guest wrote (vmd/guests/linux/x11_windows.py, shown by
vmd/machines/screen_text.py): a number in it
that no screen has costs that window's entry, never the screenshot verb. A position of
10**400 made `round(x * scale)` raise OverflowError, which failed the whole verb."""

from __future__ import annotations

import pytest

from vmd.guests.guest import CommandResult
from vmd.guests.linux.x11_windows import list_x11_windows, parse_x11_windows
from vmd.machines import screen_text as st


def parse_windows(listing: str, scale: float, size: tuple[int, int]) -> list[st.Window]:
    return st.on_screen(parse_x11_windows(listing), scale, size)


class X11Guest:
    """A guest whose X11 listing is `listing` (the Linux guest's `list_windows`, on a recorded answer)."""

    def __init__(self, listing: str, exit_code: int = 0, stderr: str = ""):
        self.answer = CommandResult(exit_code=exit_code, stdout=listing, stderr=stderr, duration=0.1)

    def list_windows(self):
        return list_x11_windows(lambda *a: self.answer)


def window(name: str, x: str = "10", y: str = "20", width: str = "300", height: str = "200",
           frame: str = "1, 1, 20, 5") -> str:
    return (f"@@window {len(name)}\n  Absolute upper-left X:  {x}\n  Absolute upper-left Y:  {y}\n"
            f"  Width: {width}\n  Height: {height}\n  Map State: IsViewable\nFrame: {frame}\nName: {name}\n")


HUGE = ["1" + "0" * 400, "9" * 5000, "-" + "9" * 30, "99999999", "1e999", "nan", "0x10"]


@pytest.mark.parametrize("field", ["x", "y", "width", "height"])
@pytest.mark.parametrize("number", HUGE)
def test_a_number_no_screen_has_costs_its_window_only(field, number):
    listing = window("ok") + window("hostile", **{field: number})
    windows = parse_windows(listing, 0.5, (640, 400))
    assert [w.title for w in windows] == ["ok"]


@pytest.mark.parametrize("number", HUGE)
def test_a_frame_no_screen_has_leaves_the_window_without_a_frame(number):
    [w] = parse_windows(window("framed", frame=f"1, {number}, 20, 5"), 1.0, (1280, 800))
    assert w.frame == (0, 0, 0, 0) and (w.x, w.y, w.width, w.height) == (10, 20, 300, 200)


def test_the_screenshot_text_survives_a_hostile_listing():
    listing = "@@active 5\n" + window("hostile", x="1" + "0" * 400) + window("fine")
    windows, why = st.guest_windows(X11Guest(listing), 1.0, (1280, 800))
    assert [w.title for w in windows] == ["fine"] and why == ""
    assert 'Window "fine" at (10, 20) 300x200' in st.describe(1280, 800, [], windows)


def test_ocr_boxes_past_any_screen_are_left_out():
    head = "level\tpage_num\tblock_num\tpar_num\tline_num\tword_num\tleft\ttop\twidth\theight\tconf\ttext\n"
    rows = ["5\t1\t1\t1\t1\t1\t" + "\t".join(box) + "\t96\tword" for box in
            (("20", "20", "40", "10"), ("1" + "0" * 400, "0", "10", "10"), ("0", "0", "9" * 5000, "10"))]
    words = st.parse_tsv(head + "\n".join(rows), 2, (1280, 800))
    assert [(w.text, w.left) for w in words] == [("word", 10)]
