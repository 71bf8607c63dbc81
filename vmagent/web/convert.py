"""Turning a fetched HTML or PDF page into text, in a process of its own with a wall-clock
and a memory bound.

The fetch is bounded (size, time); converting was not: an 8 KB PDF whose one compressed
content stream is drawn on every page kept pypdf busy seconds per page, past a minute for
40 pages, and a pathological HTML page can do the same to lxml and trafilatura. That time
was the worker's, the turn loop's. So the conversion runs in a child (`python -m
vmagent.web.convert`): the page goes in on stdin, the text comes back as JSON lines (a PDF
one line per page, as each is read), and at the bound the child is killed. What it gave by
then is kept and the result says what was cut: the pages read of a PDF, or, for HTML, the
page's text with its tags removed (linear, no parser).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass

from vmagent.web.fetch import Fetched, FetchFailed
from vmagent.web.to_text import html_title, html_to_markdown, pdf_pages
from vmd.contract.shown_text import printable

CONVERT_TIMEOUT_S = 20.0
CONVERT_MEMORY_BYTES = 1024 * 1024 * 1024
_TAG = re.compile(r"<(script|style)\b[^>]*>.*?</\1\s*>|<[^>]*>", re.I | re.S)


@dataclass
class Converted:
    title: str
    text: str
    cut: str | None  # what the bound cut, in words; None when the page was read whole


def convert(fetched: Fetched, kind: str, timeout_s: float = CONVERT_TIMEOUT_S,
            memory_bytes: int = CONVERT_MEMORY_BYTES) -> Converted:
    """`kind`: "html" or "pdf". FetchFailed when the page cannot be read at all."""
    head = json.dumps({"kind": kind, "url": fetched.url, "media_type": fetched.media_type,
                       "charset": fetched.charset, "cut": fetched.cut}).encode() + b"\n"
    child = subprocess.Popen([sys.executable, "-m", "vmagent.web.convert"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             preexec_fn=lambda: _limit_memory(memory_bytes))
    stopped = None
    try:
        out, err = child.communicate(head + fetched.body, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        child.kill()
        out, err = child.communicate()  # what it wrote before the kill is kept
        stopped = f"its {timeout_s:g} s bound"
    lines = [json.loads(line) for line in out.splitlines() if line.startswith(b"{") and line.endswith(b"}")]
    if stopped is None and child.returncode != 0:
        stopped = ("its memory bound" if b"MemoryError" in err
                   else f"an error ({_last_line(err) or f'exit {child.returncode}'})")
    for line in lines:
        if "failed" in line:
            raise FetchFailed(line["failed"])
    if kind == "pdf":
        pages = [line for line in lines if "page" in line]
        text = printable("\n\n".join(f"[page {p['page']}]\n{p['text'].strip()}" for p in pages))
        if stopped is None:
            return Converted("", text, None)
        total = pages[-1]["of"] if pages else None
        return Converted("", text, f"reading the PDF as text stopped at {stopped} after {len(pages)} of "
                                   f"{total if total is not None else 'its'} pages")
    whole = next((line for line in lines if "text" in line), None)
    if stopped is None and whole is not None:
        return Converted(whole.get("title", ""), whole["text"], None)
    html = fetched.body.decode(fetched.charset or "utf-8", errors="replace")
    plain = re.sub(r"[ \t]*\n\s*\n\s*", "\n\n", _TAG.sub(" ", html)).strip()
    return Converted("", printable(plain), f"turning the HTML into markdown stopped at {stopped or 'an error'}: "
                                           "shown as its text with the tags removed")


def _limit_memory(limit: int) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _last_line(err: bytes) -> str:
    lines = err.decode("utf-8", "replace").strip().splitlines()
    return lines[-1][:200] if lines else ""


def _child() -> int:
    """The child's side: one page from stdin, its text as JSON lines on stdout."""
    head, _, body = sys.stdin.buffer.read().partition(b"\n")
    meta = json.loads(head)
    fetched = Fetched(url=meta["url"], status=200, media_type=meta["media_type"], charset=meta["charset"], body=body,
                      cut=meta["cut"])

    def say(value: dict) -> None:
        sys.stdout.write(json.dumps(value, ensure_ascii=False) + "\n")
        sys.stdout.flush()

    try:
        if meta["kind"] == "pdf":
            for number, total, text in pdf_pages(fetched):
                say({"page": number, "of": total, "text": text})
        else:
            html = body.decode(meta["charset"] or "utf-8", errors="replace")
            say({"title": html_title(html), "text": html_to_markdown(html, fetched.url)})
    except FetchFailed as exc:
        say({"failed": str(exc)})
    return 0


if __name__ == "__main__":
    sys.exit(_child())
