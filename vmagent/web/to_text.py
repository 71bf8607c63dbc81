"""The page kinds read_page turns into text, unbounded: HTML to readable markdown
(trafilatura; readability-lxml + markdownify where it finds no article) and a PDF page by
page (pypdf). read_page runs them only in vmagent/web/convert.py's bounded child."""

from __future__ import annotations

import io
import re
from typing import Iterator

from vmagent.web.fetch import Fetched, FetchFailed
from vmd.contract.shown_text import printable


def html_to_markdown(html: str, url: str = "") -> str:
    """Readable markdown of a page: headings, links, code blocks and lists kept, menus and
    footers left out (trafilatura); readability + markdownify when trafilatura finds nothing.
    Unbounded: read_page calls it in convert.py's child."""
    try:
        import trafilatura
    except ImportError as exc:
        raise _missing(url, exc) from None

    text = trafilatura.extract(html, output_format="markdown", include_links=True, include_formatting=True,
                               include_tables=True, include_comments=False, favor_recall=True, url=url or None)
    if not text or not text.strip():
        from markdownify import markdownify
        from readability import Document

        try:
            summary = Document(html).summary(html_partial=True)
        except Exception:  # readability raises on empty or odd documents
            summary = html
        text = markdownify(summary, heading_style="ATX", code_language="")
    return printable(re.sub(r"\n{3,}", "\n\n", text).strip())


def html_title(html: str) -> str:
    found = re.search(r"<title[^>]*>(.*?)</title>", html, re.I | re.S)
    if not found:
        return ""
    import html as html_lib

    return " ".join(printable(html_lib.unescape(found.group(1))).split())[:200]


def pdf_pages(fetched: Fetched) -> Iterator[tuple[int, int, str]]:
    """(page number, pages in all, its text) for each page in turn; unbounded: read_page
    calls it in convert.py's child, which gives what it read when its time is up."""
    try:
        from pypdf import PdfReader
    except ImportError as exc:
        raise _missing(fetched.url, exc) from None
    try:
        reader = PdfReader(io.BytesIO(fetched.body))
        total = len(reader.pages)
        for number, page in enumerate(reader.pages, 1):
            yield number, total, page.extract_text() or ""
    except Exception as exc:  # pypdf raises many kinds on a broken file
        raise FetchFailed(f"{fetched.url} is a PDF that could not be read: {type(exc).__name__}: {exc}") from None


def _missing(url: str, exc: ImportError) -> FetchFailed:
    # An install without the web tools' packages (pyproject.toml).
    return FetchFailed(f"{url} was fetched, but this vmagent cannot turn it into text: the Python "
                       f"package {exc.name} is not installed; an administrator installs it.")
