"""The terminal's text read exactly, cell by cell, from its bitmap font.

The Linux guests' terminal is an xterm drawing X's misc-fixed 9x15 font (vmd/images/debian,
vmd/images/ubuntu: `xterm -fn 9x15`): every character is a 9x15 cell of two colours, pixel for
pixel the font's bitmap, on a fixed grid. tesseract (trained on print) misreads that font:
on the debian desktop it read the prompt `agent@vmagent-guest:~$` as `agent@vmagent-guest:"$`,
`agent@vmagent-suest:~$` or `agent@vmagent—guest` and `:°$`, and left the idle prompt out as
unsure (tests/support/guest_desktop.py, bench/ocr.py). Here the cells are matched against the font's
own bitmaps instead, so the terminal's text comes out exactly as drawn.

Where the grid lies comes from tesseract's words (their boxes are right even when their
letters are not): around a word, each of the cell's width x height offsets is tried, and one
where the cells decode into glyphs is a terminal's grid; its rows are then read across the
whole screen. A cell is split into its two colours by its most common grey (the background:
no glyph of the font covers half its cell), so dark-on-light, light-on-dark, coloured text
and the character under a block cursor read alike; a cell of one colour is a space; a cell
that is no glyph of the font (a window border, other fonts, a hollow cursor) ends a run of
text. A screenshot scaled down from its framebuffer has no exact cells: nothing matches and
tesseract's words stand.

The fonts are the vmd host's own copy of X's misc-fixed fonts (Debian's xfonts-base; the
guests draw with the same package); without them this reader finds nothing.
"""

from __future__ import annotations

import gzip
import io
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from PIL import Image as PILImage
from PIL import PcfFontFile

FONT_DIR = Path("/usr/share/fonts/X11/misc")
# The guests' terminal font and its bold face (xterm draws bold, ls --color's directories
# for one, in 9x15B). Another cell size would cost another grid search per word.
FONTS = ("9x15", "9x15B")
# Cells tried along a word to find its grid: enough for a few glyphs past junk at the
# word's edge (a window border, a cursor tesseract took in).
ANCHOR_CELLS = 8
# Glyphs a grid must decode in a row before it is believed: one or two cells can be a dot,
# a dash or a line that happens to match.
ANCHOR_GLYPHS = 3
# Grids read at most: each is read across the whole screen (at 3840x2400, 68,000 cells).
MAX_GRIDS = 4
# Words of two greys searched for a grid in vain before the search stops: a guest's screen
# full of another bitmap font would otherwise cost a search (1-3 ms) for each of its words.
MAX_SEARCHES = 200


@dataclass(frozen=True)
class CellWord:
    """A word read from a terminal's cells, its box in the screenshot's pixels."""
    text: str
    left: int
    top: int
    width: int
    height: int
    cell: int  # the width of one cell


@dataclass(frozen=True)
class CellFont:
    """Glyph bitmaps of one cell size: each cell as bytes of 0 (background) and 1 (ink),
    column by column (the layout _Row gives), to the character it draws."""
    width: int
    height: int
    glyphs: dict[bytes, str]


@lru_cache(maxsize=1)
def cell_fonts(names: tuple[str, ...] = FONTS) -> tuple[CellFont, ...]:
    """The fonts by cell size, from the host's font files; those missing are left out."""
    sizes: dict[tuple[int, int], dict[bytes, str]] = {}
    for name in names:
        path = FONT_DIR / f"{name}.pcf.gz"
        try:  # unpacked whole: read through gzip a few bytes at a time it took 0.6 s
            font = PcfFontFile.PcfFontFile(io.BytesIO(gzip.decompress(path.read_bytes())))
        except (OSError, EOFError, SyntaxError):
            continue
        # Printable ASCII: what shells and programs print, and what the model can type back.
        glyphs = [(code, glyph) for code, glyph in enumerate(font.glyph) if glyph and 32 <= code < 127]
        if not glyphs:
            continue
        width = max(glyph[0][0] for _, glyph in glyphs)
        ascent = max(-glyph[1][1] for _, glyph in glyphs)
        height = ascent + max(glyph[1][3] for _, glyph in glyphs)
        table = sizes.setdefault((width, height), {})
        for code, (_, (left, top, _, _), _, bitmap) in glyphs:
            cell = PILImage.new("L", (width, height), 0)
            cell.paste(bitmap.convert("L").point(lambda v: 1 if v else 0), (left, ascent + top))
            table.setdefault(cell.transpose(PILImage.Transpose.TRANSPOSE).tobytes(), chr(code))
    return tuple(CellFont(w, h, table) for (w, h), table in sizes.items())


_SPLIT: dict[int, bytes] = {}


def _split(background: int) -> bytes:
    """A translation table: the background grey to 0, every other grey to 1."""
    table = _SPLIT.get(background)
    if table is None:
        table = _SPLIT[background] = bytes(0 if v == background else 1 for v in range(256))
    return table


class _Row:
    """A band of the screenshot one cell high, from x = first to last, transposed: each
    column's pixels are contiguous, so a cell at any x is one slice."""

    def __init__(self, gray: PILImage.Image, font: CellFont, y: int, first: int, last: int):
        self.font = font
        self.first, self.last = max(0, first), min(gray.width, last)
        if y < 0 or y + font.height > gray.height or self.first >= self.last:
            self.pixels = b""
            self.last = self.first
        else:
            band = gray.crop((self.first, y, self.last, y + font.height))
            self.pixels = band.transpose(PILImage.Transpose.TRANSPOSE).tobytes()

    def char(self, x: int) -> str | None:
        """The character in the cell at x: ' ' for an empty cell, None for one that is no
        glyph of the font or lies outside the band."""
        w, h = self.font.width, self.font.height
        if x < self.first or x + w > self.last:
            return None
        cell = self.pixels[(x - self.first) * h:(x - self.first + w) * h]
        greys = set(cell)
        if len(greys) == 1:
            return " "
        if len(greys) != 2:  # the font's cells have two colours, nothing anti-aliased
            return None
        one, other = greys
        background = one if 2 * cell.count(one) > len(cell) else other
        return self.font.glyphs.get(cell.translate(_split(background)))


def _anchored(gray: PILImage.Image, font: CellFont, box: tuple[int, int, int, int]) -> tuple[int, int] | None:
    """The grid (x, y of a cell, modulo the cell size) on which the text in `box` decodes into
    the most glyphs in a row, at least ANCHOR_GLYPHS of them; None if no offset does."""
    left, top, width, height = box
    middle = top + height // 2
    count = min(ANCHOR_CELLS, width // font.width + 2)
    best: tuple[int, tuple[int, int]] | None = None
    for y in range(middle - font.height + 1, middle + 1):
        row = _Row(gray, font, y, left - font.width + 1, left + count * font.width)
        for x in range(left - font.width + 1, left + 1):
            run = most = 0
            for n in range(count):
                char = row.char(x + n * font.width)
                if char is None:
                    run = 0
                elif char != " ":
                    run += 1
                    most = max(most, run)
            if most >= ANCHOR_GLYPHS and (best is None or most > best[0]):
                best = (most, (x % font.width, y % font.height))
    return best[1] if best else None


def _read_grid(gray: PILImage.Image, font: CellFont, grid: tuple[int, int]) -> list[CellWord]:
    """Every word on the grid: runs of cells that are glyphs, split at spaces."""
    words = []
    for y in range(grid[1], gray.height - font.height + 1, font.height):
        row = _Row(gray, font, y, 0, gray.width)
        text = ""  # the run so far; it starts at run_x
        run_x = grid[0]
        for x in range(grid[0], gray.width - font.width + 1, font.width):
            char = row.char(x)
            if char is None:
                words += _words(text, run_x, y, font)
                text, run_x = "", x + font.width
            else:
                text += char
        words += _words(text, run_x, y, font)
    return words


def _words(run: str, x: int, y: int, font: CellFont) -> list[CellWord]:
    words, column = [], 0
    for part in run.split(" "):
        if part:
            words.append(CellWord(part, x + column * font.width, y, len(part) * font.width, font.height,
                                  font.width))
        column += len(part) + 1
    return words


def read_cells(gray: PILImage.Image, anchors: list[tuple[int, int, int, int]]) -> list[CellWord]:
    """The words of every terminal grid that one of `anchors` (boxes of words tesseract saw,
    in the image's pixels) lies on, read exactly; [] where no anchor is terminal text."""
    fonts = cell_fonts()
    grids: list[tuple[CellFont, int, int]] = []
    rows: dict[int, list[CellWord]] = {}  # the words read, by the top of their row
    searches = 0
    for box in anchors:
        if len(grids) >= MAX_GRIDS or searches >= MAX_SEARCHES:
            break
        if not _two_greys(gray, box) or _on_a_grid_read(box, grids, rows):
            continue
        for font in fonts:
            grid = _anchored(gray, font, box)
            if grid is None:
                searches += 1
            elif (font, *grid) not in grids:
                grids.append((font, *grid))
                for word in _read_grid(gray, font, grid):
                    rows.setdefault(word.top, []).append(word)
    return [word for row in rows.values() for word in row]


def _on_a_grid_read(box: tuple[int, int, int, int], grids: list[tuple[CellFont, int, int]],
                    rows: dict[int, list[CellWord]]) -> bool:
    x, y = box[0] + box[2] // 2, box[1] + box[3] // 2
    for font, _, grid_y in grids:
        top = grid_y + (y - grid_y) // font.height * font.height
        if any(w.left <= x < w.left + w.width for w in rows.get(top, ())):
            return True
    return False


def _two_greys(gray: PILImage.Image, box: tuple[int, int, int, int]) -> bool:
    """Whether the band through the middle of a word's box has at most two greys, as a
    bitmap font's text has; anti-aliased text has many (the cheap test that spares most
    words of other fonts the grid search)."""
    left, top, width, height = box
    middle, inset = top + height // 2, min(3, width // 4)  # a border or cursor in the box's edge
    band = gray.crop((left + inset, max(0, middle - 2), left + width - inset, middle + 3))
    return band.getcolors(2) is not None

