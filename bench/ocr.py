"""Benchmark of the screen read as text (vmd/machines/screen_text.py), old and new side by side.

    .venv/bin/python bench/ocr.py [--old COMMIT] [--runs 3]

Draws fixed desktops itself, the debian guest's own (tests/support/guest_desktop.py: Xvfb at
1280x800, the guest recipe's openbox session and xterm, the same Debian packages): an idle
xterm at its prompt, an xterm with output, a reverse-video xterm with output over it, a Tk
editor with code, a Tk dialog. Each scene knows the words it drew from what it typed, printed
or wrote into a window (window titles included), never from OCR. The screenshot comes through
vmd's Screen, as a guest's does. Both readings run on the same PNG in the same process: this
tree's `read_words` and the one of --old (its screen_text.py from git, imported beside this
one).

Prints per desktop, old and new: the recall of the words drawn (a word has a letter or a
digit, as in vmd's reading; each word read counts once; typographic quotes count as straight
ones), the extra words read that were not drawn (misreadings, icons and borders taken for
words), the milliseconds per screenshot (median of --runs, the two readings taking turns) and
their ratio; then the words the new reading missed. Exits 1 when a desktop's new recall is
under 0.9.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support import guest_desktop  # noqa: E402 (the repository is on the path now)
from vmd.machines import screen_text  # noqa: E402

# main before the screen was read whole (item 4 of issue 37): upscale twice, invert dark
# neighbourhoods, divide by the background, tesseract --psm 11.
OLD_COMMIT = "13f5d04d0a60e459dcbead75be8397ce657de90d"
TARGET = 0.9


def old_module(commit: str, folder: Path):
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:vmd/machines/screen_text.py"],
                            capture_output=True, text=True, check=True).stdout
    path = folder / "screen_text_old.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("screen_text_old", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def timed(reads: list, png: bytes, runs: int) -> list[tuple[list[str], float]]:
    """Each reading's words and its median milliseconds; the readings take turns, so that
    the machine's noise falls on them alike."""
    times: list[list[float]] = [[] for _ in reads]
    words: list[list[str]] = [[] for _ in reads]
    for _ in range(runs):
        for n, read in enumerate(reads):
            start = time.perf_counter()
            words[n] = [w.text for w in read(png)]
            times[n].append(time.perf_counter() - start)
    return [(w, statistics.median(t) * 1000) for w, t in zip(words, times)]


def extra(drawn: list[str], read: list[str]) -> int:
    """Words read that were not drawn (misreadings, icons and borders read as words)."""
    _, left_out = guest_desktop.recall(read, drawn)
    return len(left_out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", default=OLD_COMMIT, help="the commit whose screen_text.py is the old reading")
    parser.add_argument("--runs", type=int, default=3, help="readings of each screenshot, for the median time")
    args = parser.parse_args()
    if problem := guest_desktop.missing():
        print(problem, file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as folder:
        old = old_module(args.old, Path(folder))
        rows, misses = [], []
        for scene in guest_desktop.SCENES:
            drawn, shot = guest_desktop.draw(scene)
            (old_words, old_ms), (new_words, new_ms) = timed([old.read_words, screen_text.read_words],
                                                             shot.png, args.runs)
            old_recall, _ = guest_desktop.recall(drawn.words, old_words)
            new_recall, missed = guest_desktop.recall(drawn.words, new_words)
            rows.append((drawn.name, len(drawn.words), old_recall, new_recall, extra(drawn.words, old_words),
                         extra(drawn.words, new_words), old_ms, new_ms))
            misses.append((drawn.name, missed))
    print(f"screen read as text: {args.old[:10]} (old) vs this tree (new), {args.runs} readings each, "
          f"1280x800 PNG through vmd's Screen")
    print(f"{'desktop':<18} {'words':>5} {'recall old':>10} {'recall new':>10} {'extra old':>9} {'extra new':>9} "
          f"{'ms old':>7} {'ms new':>7} {'time new/old':>12}")
    for name, count, old_recall, new_recall, old_extra, new_extra, old_ms, new_ms in rows:
        print(f"{name:<18} {count:>5} {old_recall:>10.2f} {new_recall:>10.2f} {old_extra:>9} {new_extra:>9} "
              f"{old_ms:>7.0f} {new_ms:>7.0f} {new_ms / old_ms:>11.2f}x")
    words = sum(r[1] for r in rows)
    old_all = sum(r[1] * r[2] for r in rows) / words
    new_all = sum(r[1] * r[3] for r in rows) / words
    old_ms = statistics.mean(r[6] for r in rows)
    new_ms = statistics.mean(r[7] for r in rows)
    print(f"{'all':<18} {words:>5} {old_all:>10.2f} {new_all:>10.2f} {sum(r[4] for r in rows):>9} "
          f"{sum(r[5] for r in rows):>9} {old_ms:>7.0f} {new_ms:>7.0f} {new_ms / old_ms:>11.2f}x")
    for name, missed in misses:
        if missed:
            print(f"missed by new on {name}: {' '.join(missed)}")
    below = [r[0] for r in rows if r[3] < TARGET]
    print(f"target: recall >= {TARGET} on each desktop: " + ("met" if not below else f"NOT met on {', '.join(below)}"))
    return 0 if not below else 1


if __name__ == "__main__":
    sys.exit(main())
