"""The report's sources: one line per query or page from vmd's record, a page read in
parts said once, failures said as such, and what came from the web (a title, a URL) shown
as code that no backtick in it can close, never as markdown."""

from __future__ import annotations

import json

from vmd.session.report import build_report


def _record(tmp_path, events: list[dict]) -> str:
    path = tmp_path / "record.jsonl"
    lines = [{"time": "2026-01-01T00:00:00+00:00", "kind": "session", "event": "open", "session_id": "s1",
              "args": {"task": "read docs", "os": "debian"}}]
    lines += [{"time": "2026-01-01T00:00:01+00:00", "kind": "web", "title": "", "detail": "", "ok": True, **e}
              for e in events]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def test_the_report_lists_each_source_once_and_shows_web_text_as_code(tmp_path):
    hostile = "Docs `` ![x](http://evil.example/p.png) [click](http://evil.example)"
    report = build_report(_record(tmp_path, [
        {"source": "search", "target": "frob api", "detail": "3 results (searxng)"},
        {"source": "page", "target": "https://frob.example/docs", "title": hostile, "detail": "characters 0-4,000 of 9,000"},
        {"source": "page", "target": "https://frob.example/docs", "title": hostile, "detail": "characters 4,000-8,000 of 9,000"},
        {"source": "page", "target": "http://10.0.0.1/", "ok": False, "detail": "10.0.0.1 is a private address."},
        {"source": "search", "target": "frob api 2", "ok": False, "detail": "the search engine (searxng) answered HTTP 502"},
    ])).markdown
    section = report.split("## Sources read on the web\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("- ")]
    assert lines == [
        "- searched `frob api`: `3 results (searxng)`",
        "- read `https://frob.example/docs` — ```Docs `` ![x](http://evil.example/p.png) [click](http://evil.example)``` "
        "(`characters 4,000-8,000 of 9,000`, 2 times)",
        "- could not read `http://10.0.0.1/`: `10.0.0.1 is a private address.`",
        "- could not search `frob api 2`: `the search engine (searxng) answered HTTP 502`",
    ]


def test_a_session_that_read_nothing_has_no_sources_section(tmp_path):
    assert "Sources read on the web" not in build_report(_record(tmp_path, [])).markdown
