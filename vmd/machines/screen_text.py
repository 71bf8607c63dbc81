"""The screen read as text, for a model that cannot see images.

Two sources, both already in vmd's hands: the screenshot's PNG, read on the host by
tesseract (OCR), with the terminal's bitmap-font text read exactly from its cells
(vmd/machines/terminal_cells.py), and the guest's own list of its windows (`Guest.list_windows`: X11 on Linux,
vmd/guests/linux/x11_windows.py; user32 on Windows, vmd/guests/windows/verbs.py). Every point given is in screenshot space, the pixels of the image the
agent was shown (vmd/machines/screen.py): the point of a word is the centre of its box there, so
`click` at it lands on the word.

The PNG comes from the guest and is untrusted: its size is bounded before it is decoded,
Pillow decodes it (PNG only), and tesseract reads vmd's own re-encoding of it on stdin,
never a file the guest named and never through a shell. Window titles come from the guest
too: they are cut, stripped of control characters and quoted.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from PIL import Image as PILImage
from PIL import ImageChops, ImageFilter

from vmd.guests.guest import ListedWindow, screen_coordinate
from vmd.host_env import clean_env
from vmd.machines.terminal_cells import CellWord, read_cells

if TYPE_CHECKING:
    from vmd.guests.guest import Guest

TESSERACT = "tesseract"
# A 4K screen is the largest a guest shows; anything bigger is not a screenshot.
MAX_PNG_BYTES = 16 * 1024 * 1024
MAX_PIXELS = 3840 * 2400
OCR_TIMEOUT_S = 30.0
# How the picture is prepared for tesseract, measured by bench/ocr.py on the debian guest's own
# desktop drawn on the host (an idle xterm, one with output, a reverse-video xterm, a Tk editor, a
# Tk dialog, test_ocr_vm's approval window; tests/support/guest_desktop.py) and on a real guest's
# screenshot (tests/support/golden/screens). Read as it was before (twice the size, dark
# neighbourhoods inverted, each pixel divided by the lightest around it) the idle terminal gave
# no word: the window's dark border, left dark where a light pixel's box reached the desktop,
# ran into the prompt's first letter 3 px away, and the title bar into its top.
# - Each pixel is measured against its background, the median of the box around it, either
#   way: dark text on light and light on dark give the same ink, and a grey or tinted panel
#   is its own background. Of four such boxes, shifted half their size left, right, up and
#   down, the pixel keeps the least ink: next to a window's edge one of them lies wholly on
#   the pixel's own side, so an edge leaves no dark band beside the text along it.
BACKGROUND_SIZE = 9  # wider than a stroke, narrower than a 15 px terminal line
INK_GAIN = 2  # a difference of half the range is black already: anti-aliased text stays crisp
# - A straight run of ink longer than any glyph's stroke (window borders, title bars'
#   edges, separators) is a line, not text: it is taken out before tesseract groups it
#   with the letters beside it.
#   A run of 29 px: the sides of a button with a 12 pt caption (30 px) are lines, and
#   tesseract read "Approve" between them as "“povrove" when only runs of 41 px were; a
#   glyph's stroke is that long only in a font of about 38 px.
LINE_INK = 60
LINE_RADIUS = 14
LINE_SHARE = 245  # of 255: the run is ink all along
# - Screen fonts are 11-13 px, smaller than the print tesseract is trained on: it reads
#   at twice the size (three times lost the Tk menu and buttons), bilinear (bicubic's
#   ringing made 11 words of junk where bilinear made 5, for the same words read).
OCR_UPSCALE = 2
UPSCALE_UP_TO_PIXELS = 1920 * 1200  # beyond that the text is large enough, and OCR slow
MIN_CONFIDENCE = 50  # below this tesseract's "words" are mostly icons and borders
# ... unless it reads as a word: tesseract was as unsure of "Column" on a Tk status bar (4) as
# of the icons it reads as "l=)", "elm]", "[5" or "ie" (0-40), none of them three letters.
WORDLIKE = re.compile(r"(?:[A-Z][a-z]{2,}|[a-z]{3,}|[A-Z]{3,})[.,:;!?]?")
# Words further apart than this many line heights are separate things (buttons, columns).
ITEM_GAP = 1.5
WORD_POINTS_UP_TO = 6  # an item of a few words lists each word's point (a menu bar)
TEXT_CAP = 4000  # characters of the whole listing; the model's context is small
MAX_WINDOWS = 25
TITLE_CAP = 120


class ScreenTextError(Exception):
    """The screen could not be read as text; the message is a sentence for the model."""


@dataclass(frozen=True)
class Word:
    text: str
    left: int
    top: int
    width: int
    height: int
    confidence: float

    @property
    def centre(self) -> tuple[int, int]:
        return self.left + self.width // 2, self.top + self.height // 2


@dataclass(frozen=True)
class Window:
    """A window's inside (below its title bar), and its frame's width on each side."""
    title: str
    x: int
    y: int
    width: int
    height: int
    active: bool = False
    frame: tuple[int, int, int, int] = (0, 0, 0, 0)  # left, right, top, bottom

    @property
    def centre(self) -> tuple[int, int]:
        return self.x + self.width // 2, self.y + self.height // 2

    def holds(self, point: tuple[int, int]) -> bool:
        """Whether a point is on the window, title bar and border included."""
        left, right, top, bottom = self.frame
        return (self.x - left <= point[0] < self.x + self.width + right
                and self.y - top <= point[1] < self.y + self.height + bottom)


def read_screen(png: bytes, width: int, height: int, scale: float, guest: Guest) -> str:
    """The whole listing for one screenshot: the guest lists its windows while the host
    reads the words, so the wait is the longer of the two, not their sum."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="screen-windows") as pool:
        listed = pool.submit(guest_windows, guest, scale, (width, height))
        try:
            words: list[Word] | str = read_words(png)
        except ScreenTextError as exc:
            words = str(exc)
        windows, why_none = listed.result()
    return describe(width, height, words, windows or why_none)


# --- OCR ----------------------------------------------------------------------------------


def _decode(png: bytes) -> PILImage.Image:
    if not isinstance(png, (bytes, bytearray)) or not png:
        raise ScreenTextError("the screenshot is empty, so there is no text to read; take another.")
    if len(png) > MAX_PNG_BYTES:
        raise ScreenTextError(f"the screenshot is {len(png)} bytes, more than the {MAX_PNG_BYTES} a "
                              "screen can be, so it was not read as text; take another.")
    try:
        image = PILImage.open(io.BytesIO(png), formats=["PNG"])
        width, height = image.size  # from the header, before any pixel is decoded
        if width < 1 or height < 1 or width * height > MAX_PIXELS:
            raise ScreenTextError(f"the screenshot claims {width}x{height} pixels, more pixels than a "
                                  "screen has, so it was not read as text; take another.")
        image.load()
        return image.convert("L")
    except ScreenTextError:
        raise
    except PILImage.DecompressionBombError:  # Pillow's own limit, met before ours
        raise ScreenTextError("the screenshot claims more pixels than a screen has, so it was not "
                              "read as text; take another.") from None
    except Exception as exc:  # a broken PNG from the guest is a sentence, not a crash
        raise ScreenTextError(f"the screenshot could not be decoded as a PNG ({type(exc).__name__}), so "
                              "it was not read as text; take another.") from None


def _ink(gray: PILImage.Image) -> PILImage.Image:
    """How far each pixel lies from its background, dark or light (BACKGROUND_SIZE above)."""
    background = gray.filter(ImageFilter.MedianFilter(BACKGROUND_SIZE))
    shift = BACKGROUND_SIZE // 2
    ink = None
    for dx, dy in ((shift, 0), (-shift, 0), (0, shift), (0, -shift)):
        away = ImageChops.difference(gray, ImageChops.offset(background, dx, dy))
        ink = away if ink is None else ImageChops.darker(ink, away)
    return ink


def _without_lines(ink: PILImage.Image) -> PILImage.Image:
    """The ink less its long straight runs, across and down (LINE_* above)."""
    marked = ink.point(lambda v: 255 if v >= LINE_INK else 0)
    across = marked.filter(ImageFilter.BoxBlur((LINE_RADIUS, 0)))
    down = marked.filter(ImageFilter.BoxBlur((0, LINE_RADIUS)))
    lines = ImageChops.lighter(across, down).point(lambda v: 255 if v >= LINE_SHARE else 0)
    return ImageChops.subtract(ink, lines)


def _prepared(gray: PILImage.Image) -> tuple[bytes, int]:
    """The picture tesseract reads, as PNG bytes of vmd's own encoding, and its upscale:
    dark ink on white."""
    image = _without_lines(_ink(gray)).point(lambda v: 255 - min(255, INK_GAIN * v))
    factor = OCR_UPSCALE if gray.width * gray.height <= UPSCALE_UP_TO_PIXELS else 1
    if factor != 1:
        image = image.resize((gray.width * factor, gray.height * factor), PILImage.BILINEAR)
    buf = io.BytesIO()
    image.save(buf, format="PNG", compress_level=1)
    return buf.getvalue(), factor


def read_words(png: bytes, *, timeout: float = OCR_TIMEOUT_S) -> list[Word]:
    """The words tesseract finds on a screenshot, with their boxes in the screenshot's own
    pixels. Raises ScreenTextError with a sentence when it cannot read them."""
    gray = _decode(png)
    env = clean_env({"OMP_THREAD_LIMIT": "1"})  # OpenMP's spinning threads doubled the time
    path = shutil.which(TESSERACT, path=env["PATH"])
    if path is None:
        raise ScreenTextError("tesseract is not installed on the vmd host, so the screen cannot be read "
                              "as text; install it there with `apt-get install tesseract-ocr "
                              "tesseract-ocr-eng` (scripts/setup.sh does).")
    data, factor = _prepared(gray)
    try:
        done = subprocess.run([path, "stdin", "stdout", "-l", "eng", "--psm", "11", "tsv"],
                              input=data, capture_output=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ScreenTextError(f"reading the screen as text took longer than {timeout:g} s and was "
                              "stopped; take another screenshot.") from None
    except OSError as exc:
        raise ScreenTextError(f"tesseract could not be started on the vmd host ({exc}); reinstall "
                              "tesseract-ocr there.") from None
    if done.returncode != 0:
        problem = done.stderr.decode("utf-8", "replace").strip()[-300:]
        if "eng" in problem and ("Failed loading language" in problem or "traineddata" in problem):
            raise ScreenTextError("tesseract on the vmd host has no English data, so the screen cannot "
                                  "be read as text; install it there with `apt-get install "
                                  "tesseract-ocr-eng`.")
        raise ScreenTextError(f"tesseract could not read the screen (exit {done.returncode}: {problem}).")
    seen = parse_tsv(done.stdout.decode("utf-8", "replace"), factor, gray.size, min_confidence=0)
    cells = read_cells(gray, [(w.left, w.top, w.width, w.height) for w in seen if len(w.text) > 1])
    return merged(cells, [w for w in seen if w.confidence >= MIN_CONFIDENCE or WORDLIKE.fullmatch(w.text)])


def merged(cells: list[CellWord], words: list[Word]) -> list[Word]:
    """The terminal's words read from its cells (exact), and tesseract's words elsewhere: one
    whose centre lies on a line of cells read, or on the cell just after it (where a
    cursor sits), read the same text worse."""
    spans: dict[int, list[tuple[int, int]]] = {}  # each pixel row's stretches of cells read
    for c in cells:
        for y in range(c.top, c.top + c.height):
            spans.setdefault(y, []).append((c.left, c.left + c.width + c.cell))
    kept = [w for w in words if not any(x0 <= w.centre[0] < x1 for x0, x1 in spans.get(w.centre[1], ()))]
    exact = [Word(c.text, c.left, c.top, c.width, c.height, 100.0) for c in cells
             if any(ch.isalnum() for ch in c.text)]
    return sorted(exact + kept, key=lambda w: (w.top, w.left))


def parse_tsv(tsv: str, factor: float, size: tuple[int, int], min_confidence: float = MIN_CONFIDENCE) -> list[Word]:
    """Words of tesseract's TSV output, boxes divided by the upscale, those it is at least
    `min_confidence` sure of."""
    words = []
    for row in tsv.splitlines()[1:]:
        fields = row.split("\t")
        if len(fields) != 12:
            continue
        text = _clean(fields[11], 60)
        try:
            left, top, width, height = (screen_coordinate(v) for v in fields[6:10])
            confidence = float(fields[10])
        except ValueError:
            continue
        # A word needs a letter or a digit: the rest are icons, borders and cursors.
        if not text or confidence < min_confidence or not any(c.isalnum() for c in text):
            continue
        left, top = round(left / factor), round(top / factor)
        width, height = max(1, round(width / factor)), max(1, round(height / factor))
        if left >= size[0] or top >= size[1]:
            continue
        words.append(Word(text, left, top, min(width, size[0] - left), min(height, size[1] - top),
                          confidence))
    return words


def items_of(words: list[Word]) -> list[list[Word]]:
    """Words grouped into things a person would name: rows of words that share a line,
    cut where the gap between two words is wider than ITEM_GAP line heights; top to
    bottom, left to right."""
    rows: list[list[Word]] = []
    for word in sorted(words, key=lambda w: (w.top + w.height / 2, w.left)):
        middle = word.top + word.height / 2
        for row in rows:
            top = min(w.top for w in row)
            bottom = max(w.top + w.height for w in row)
            if top <= middle <= bottom:
                row.append(word)
                break
        else:
            rows.append([word])
    items = []
    for row in sorted(rows, key=lambda r: min(w.top for w in r)):
        row.sort(key=lambda w: w.left)
        height = sorted(w.height for w in row)[len(row) // 2]
        item = [row[0]]
        for word in row[1:]:
            previous = item[-1]
            if word.left - (previous.left + previous.width) > ITEM_GAP * height:
                items.append(item)
                item = []
            item.append(word)
        items.append(item)
    return items


# --- windows ------------------------------------------------------------------------------


def on_screen(listed: list[ListedWindow], scale: float, size: tuple[int, int]) -> list[Window]:
    """The guest's windows (front first, framebuffer pixels) in screenshot space (`scale` is
    shown pixels per framebuffer pixel), those off screen left out, at most MAX_WINDOWS."""
    windows = []
    for w in listed:
        x, y = max(0, round(w.x * scale)), max(0, round(w.y * scale))
        width, height = round(w.width * scale), round(w.height * scale)
        if x >= size[0] or y >= size[1] or width < 1 or height < 1:
            continue  # off screen
        width, height = min(width, size[0] - x), min(height, size[1] - y)
        frame = tuple(min(200, max(0, round(v * scale))) for v in w.frame)
        windows.append(Window(_clean(w.title, TITLE_CAP), x, y, width, height, active=w.active, frame=frame))
    return windows[:MAX_WINDOWS]


def guest_windows(guest: Guest, scale: float, size: tuple[int, int]) -> tuple[list[Window], str]:
    """The guest's windows (`Guest.list_windows`), and a sentence when there are none to give."""
    try:
        listed = guest.list_windows()
    except Exception as exc:  # the words on screen are still worth giving
        return [], f"the guest did not list its windows ({_clean(str(exc), 200)})."
    windows = on_screen(listed, scale, size)
    return windows, "" if windows else "the guest shows no windows."


# --- the listing --------------------------------------------------------------------------


def describe(width: int, height: int, words: list[Word] | str, windows: list[Window] | str,
             cap: int = TEXT_CAP) -> str:
    """The listing the model reads, capped at `cap` characters: each window, the front one
    first, with the text on it, then the text on no window. `words` or `windows` may be a
    sentence saying why they are missing. The front window's text comes first so that a
    cut, when the screen holds more text than fits, drops what lies behind."""
    lines = [f"The screen ({width}x{height}) read as text; every (x, y) is a point to click, in "
             "screenshot pixels."]
    listed = [] if isinstance(windows, str) else windows
    if isinstance(windows, str):
        lines.append(f"Windows: {windows}")
    if isinstance(words, str):
        lines += [_window_line(w) for w in listed]
        lines.append(f"Text on screen: {words}")
        return _capped(lines, cap)
    sections: list[list[list[Word]]] = [[] for _ in range(len(listed) + 1)]
    for item in items_of(words):
        centre = _box_centre(item)
        place = next((n for n, w in enumerate(listed) if w.holds(centre)), len(listed))
        sections[place].append(item)
    for window, items in zip(listed, sections):
        lines.append(_window_line(window) + (":" if items else "; no text read on it."))
        lines += [_item_line(item) for item in items]
    rest = sections[-1]
    if not words:
        lines.append("Text on screen: none found (OCR read no words).")
    elif rest:
        lines.append("Text on no window:" if listed else "Text on screen (OCR), top to bottom:")
        lines += [_item_line(item) for item in rest]
    return _capped(lines, cap)


def _window_line(w: Window) -> str:
    return (f"Window {_quote(w.title or '(untitled)')} at ({w.x}, {w.y}) {w.width}x{w.height}, "
            f"centre ({w.centre[0]}, {w.centre[1]})" + (", focused" if w.active else ""))


def _box_centre(item: list[Word]) -> tuple[int, int]:
    left, top = min(w.left for w in item), min(w.top for w in item)
    right = max(w.left + w.width for w in item)
    bottom = max(w.top + w.height for w in item)
    return (left + right) // 2, (top + bottom) // 2


def _item_line(item: list[Word]) -> str:
    x, y = _box_centre(item)
    line = f"- {_quote(' '.join(w.text for w in item))} at ({x}, {y})"
    if 1 < len(item) <= WORD_POINTS_UP_TO:
        line += "; words at " + ", ".join(f"{w.text} ({w.centre[0]}, {w.centre[1]})" for w in item)
    return line


def _capped(lines: list[str], cap: int) -> str:
    kept: list[str] = []
    used = 0
    for n, line in enumerate(lines):
        if used + len(line) + 1 > cap - 160 and n > 0:
            left = len(lines) - n
            kept.append(f"[... {left} more line{'s' if left != 1 else ''} cut to keep this short: "
                        "close or move the windows in front, or read the program's output in "
                        "the shell ...]")
            break
        kept.append(line)
        used += len(line) + 1
    return "\n".join(kept)[:cap]


def _quote(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _clean(text: str, cap: int) -> str:
    return _CONTROL.sub(" ", text).strip()[:cap]

