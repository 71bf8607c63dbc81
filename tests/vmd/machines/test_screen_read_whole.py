"""The screen read whole (vmd/machines/screen_text.py, terminal_cells.py) on the debian guest's own
desktop drawn here (tests/support/guest_desktop.py: Xvfb, the guest recipe's openbox session and 9x15
xterm): the idle terminal's prompt is read, under the terminal's window, so that a model that
cannot see can tell an idle terminal from a busy one; a terminal's output, light-on-dark text
and a dialog are read too (recall of the words drawn >= 0.9). The windows come from vmd's own
X11 listing run on that display. The terminal's bitmap font is read cell by cell: also on a
picture drawn with the font here, in both polarities and under a block cursor, and not on
anti-aliased text or a scaled-down screen."""

from __future__ import annotations

import gzip
import io
import os
import re
import shutil
import subprocess

import pytest
from PIL import Image, ImageDraw, ImageFont, PcfFontFile

from tests.support import guest_desktop
from vmd.guests.guest import CommandResult
from vmd.guests.linux.x11_windows import WINDOWS_COMMAND, list_x11_windows
from vmd.machines import screen_text as st
from vmd.machines import terminal_cells

RECALL = 0.9


def _needs(problem: str) -> None:
    # scripts/setup.sh installs all of it: CI runs these tests.
    if problem:
        pytest.fail(problem, pytrace=False) if os.environ.get("CI") else pytest.skip(problem)


@pytest.fixture(scope="module")
def drawable():
    problem = guest_desktop.missing()
    if not problem and shutil.which(st.TESSERACT) is None:
        problem = "tesseract is not installed; run `apt-get install tesseract-ocr tesseract-ocr-eng`"
    if not problem and shutil.which("xwininfo") is None:
        problem = "vmd's window listing needs xprop and xwininfo here: apt-get install x11-utils"
    _needs(problem)


class DesktopGuest:
    """The guest side of `list_windows` on the desktop drawn here: vmd's own X11 listing
    command, run on this display instead of the guest's :0."""

    def __init__(self, desktop: guest_desktop.GuestDesktop):
        self.desktop = desktop

    def list_windows(self):
        def run(command: str, timeout: float) -> CommandResult:
            command = command.replace("export DISPLAY=:0", f"export DISPLAY={self.desktop.display}")
            done = subprocess.run(["bash", "-c", command], env=self.desktop.env(), capture_output=True,
                                  text=True, timeout=timeout)
            return CommandResult(exit_code=done.returncode, stdout=done.stdout, stderr=done.stderr, duration=0.0)

        assert "export DISPLAY=:0" in WINDOWS_COMMAND
        return list_x11_windows(run)


def read(scene) -> tuple[guest_desktop.Scene, list[st.Word], str]:
    """A fresh desktop with the scene drawn: what was drawn, the words read, the listing."""
    with guest_desktop.GuestDesktop() as desktop:
        drawn = scene(desktop)
        shot = desktop.screenshot()
        listing = st.read_screen(shot.png, shot.width, shot.height, shot.scale, DesktopGuest(desktop))
    return drawn, st.read_words(shot.png), listing


def window_section(listing: str, title: str) -> list[str]:
    """The listing's lines under the window titled `title`, up to the next window, less its
    title bar's."""
    lines = listing.splitlines()
    start = next(n for n, line in enumerate(lines) if line.startswith(f'Window "{title}" at '))
    section = []
    for line in lines[start + 1:]:
        if not line.startswith("- "):
            break
        if not line.startswith(f'- "{title}" at '):
            section.append(line)
    return section


def point_of(line: str) -> tuple[int, int]:
    found = re.search(r'" at \((\d+), (\d+)\)', line)
    assert found, line
    return int(found[1]), int(found[2])


def test_an_idle_terminal_is_read_with_its_prompt(drawable):
    drawn, words, listing = read(guest_desktop.idle_terminal)
    recall, missed = guest_desktop.recall(drawn.words, [w.text for w in words])
    assert recall >= RECALL, (missed, listing)
    assert "no text read on it" not in listing, listing
    terminal = window_section(listing, "terminal")
    assert terminal and terminal[0].startswith(f'- "{guest_desktop.PROMPT}" at ('), listing
    x, y = point_of(terminal[0])  # on the terminal's first line, where xterm draws the prompt
    assert 30 < x < 300 and 50 < y < 68, terminal[0]


def test_a_terminal_with_output_is_read_and_ends_at_its_prompt(drawable):
    drawn, words, listing = read(guest_desktop.terminal_with_output)
    recall, missed = guest_desktop.recall(drawn.words, [w.text for w in words])
    assert recall >= RECALL, (missed, listing)
    terminal = window_section(listing, "terminal")
    # What was typed and printed, exactly, and the prompt again last: the terminal is idle.
    assert f'- "{guest_desktop.PROMPT} cat notes.txt" at (' in terminal[0], terminal
    assert any("\"ls: cannot access 'missing.txt': No such file or directory\"" in line for line in terminal), terminal
    assert terminal[-1].startswith(f'- "{guest_desktop.PROMPT}" at ('), terminal


@pytest.mark.parametrize("scene", [guest_desktop.dark_terminal, guest_desktop.dialog],
                         ids=["light-on-dark xterm", "dialog"])
def test_light_on_dark_text_and_a_dialog_are_read(drawable, scene):
    drawn, words, listing = read(scene)
    recall, missed = guest_desktop.recall(drawn.words, [w.text for w in words])
    assert recall >= RECALL, (missed, listing)


# --- the terminal's cells, on pictures drawn with the font here ------------------------------

@pytest.fixture(scope="module")
def fixed_font(tmp_path_factory):
    """X's 9x15 as a Pillow font (Pillow's own PCF reader and renderer), for drawing."""
    path = terminal_cells.FONT_DIR / "9x15.pcf.gz"
    if not path.exists():
        _needs(f"the terminal's font {path} is missing: apt-get install xfonts-base")
    folder = tmp_path_factory.mktemp("font")
    PcfFontFile.PcfFontFile(io.BytesIO(gzip.decompress(path.read_bytes()))).save(str(folder / "9x15"))
    return ImageFont.load(str(folder / "9x15.pil"))


LINES = ["agent@vmagent-guest:~/project$ make test", "pytest -q: 12 passed, 0 failed in 0.84s",
         "(a == b) && echo 'same' | grep -c same"]


def draw_terminal(font, fg: int, bg: int, cursor_at: int | None = None) -> tuple[Image.Image, list[tuple]]:
    """LINES drawn with the font at a 9x15 grid from (13, 21), and each line's box."""
    image = Image.new("L", (640, 120), 200)
    draw = ImageDraw.Draw(image)
    draw.rectangle((10, 18, 630, 110), fill=bg)
    boxes = []
    for n, line in enumerate(LINES):
        x, y = 13, 21 + 15 * n
        draw.text((x, y), line, font=font, fill=fg)
        boxes.append((x, y, 9 * len(line), 15))
    if cursor_at is not None:  # a block cursor over a character of the first line: it shows inverted
        x = 13 + 9 * cursor_at
        cell = image.crop((x, 21, x + 9, 36)).point(lambda v: bg if v == fg else fg)
        image.paste(cell, (x, 21))
    return image, boxes


def cell_text(words: list[terminal_cells.CellWord]) -> list[str]:
    lines: dict[int, list[terminal_cells.CellWord]] = {}
    for word in words:
        lines.setdefault(word.top, []).append(word)
    return [" ".join(w.text for w in sorted(row, key=lambda w: w.left)) for _, row in sorted(lines.items())]


@pytest.mark.parametrize("fg, bg", [(0, 255), (255, 0), (30, 120)], ids=["dark on light", "light on dark", "grey"])
def test_terminal_cells_are_read_exactly_in_either_polarity(fixed_font, fg, bg):
    image, boxes = draw_terminal(fixed_font, fg, bg, cursor_at=5)
    words = terminal_cells.read_cells(image, [boxes[1]])  # one line's box finds the grid
    assert cell_text(words) == LINES
    first = min(words, key=lambda w: (w.top, w.left))
    assert (first.left, first.top, first.width, first.height) == (13, 21, 9 * len("agent@vmagent-guest:~/project$"), 15)


def test_other_fonts_and_scaled_screens_have_no_cells(fixed_font):
    image = Image.new("L", (640, 120), 255)
    ImageDraw.Draw(image).text((13, 21), LINES[1], font=ImageFont.load_default(size=15), fill=0)  # anti-aliased
    assert terminal_cells.read_cells(image, [(13, 21, 400, 15)]) == []
    terminal, boxes = draw_terminal(fixed_font, 0, 255)
    half = terminal.resize((320, 60), Image.LANCZOS)  # a framebuffer shown at half its size
    assert terminal_cells.read_cells(half, [(b[0] // 2, b[1] // 2, b[2] // 2, b[3] // 2) for b in boxes]) == []


def test_a_real_guests_screen_reads_its_prompt_and_the_button_to_click():
    # A screenshot of the debian guest as tests/e2e/test_ocr_vm.py leaves it (QEMU's dump through
    # vmd's Screen): the terminal idle at its prompt, the approval window below it. Read before
    # as "agent@vmagent-suest:~$"; a line-removal that left the button's sides read its caption
    # as "“povrove".
    if shutil.which(st.TESSERACT) is None:
        _needs("tesseract is not installed; run `apt-get install tesseract-ocr tesseract-ocr-eng`")
    png = (guest_desktop.ROOT / "tests" / "support" / "golden" / "screens" / "debian-approval.png").read_bytes()
    words = {w.text: w for w in st.read_words(png)}
    assert guest_desktop.PROMPT in words and "Approve" in words, sorted(words)
    prompt, approve = words[guest_desktop.PROMPT], words["Approve"]
    assert (prompt.left, prompt.top, prompt.width, prompt.height) == (33, 52, 9 * 22, 15)  # its cells
    assert 594 <= approve.centre[0] <= 686 and 716 <= approve.centre[1] <= 745, approve  # on the button
