"""Text from a guest or a model is shown as data: no escape sequence reaches a terminal and
no backtick run closes a report's fence."""

import re

from vmd.contract.shown_text import fence, one_line, printable


def test_escape_sequences_and_controls_are_removed_but_tab_and_newline_stay():
    hostile = ("ok\x1b]52;c;cm0gLXJmIH4=\x07 \x1b]0;owned\x1b\\ \x1b[2J\x1b[31mred\x1b[0m"
               "\tcol\nnext\r overwrite\x00\x08\x7f \x9b2J \x9d0;t\x9c end")
    shown = printable(hostile)
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", shown), repr(shown)
    assert "cm0gLXJmIH4" not in shown and "owned" not in shown  # the payloads go with their escapes
    assert shown.startswith("ok") and "red" in shown and "\tcol\nnext" in shown and shown.endswith("end")


def test_one_line_makes_a_single_log_line():
    assert one_line("first\nsecond\r\nthird\tx\x1b[1m") == "first second third x"


def test_a_fence_cannot_be_closed_from_inside():
    text = "line\n```\n![x](http://attacker/p.png)\n``````"
    block = fence(text)
    opening = block.split("\n", 1)[0]
    marks = opening.rstrip("text")
    assert len(marks) == 7 and block.endswith("\n" + marks)
    body = block[len(opening) + 1:-len(marks) - 1]
    assert marks not in body  # no line inside reaches the fence's length
    assert fence("plain").startswith("```text\n")
