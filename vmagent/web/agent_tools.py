"""web_search and read_page as tools of the agent, run by vmagent on the host (never in
the guest): their argument models, and `WebTools`, which the loop asks to run a call.

Which of the two a job offers is decided once, when the job starts (`WebTools.names`),
from the operator's settings: the tool list stays the same all job long. web_search is
offered when an engine is configured; read_page with it, or alone when the operator turns
the web tools on without an engine. Each call answers the model's text and a `source`,
the line vmd records (the `web_source` verb) and the report lists.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field

from vmagent.link import VmdError
from vmagent.web.allow_list import parse_allow_list
from vmagent.web.fetch import FetchLimits
from vmagent.web.guard import Guard
from vmagent.web.page import PageReader
from vmagent.web.search import MAX_RESULTS, SearchEngine, SearchFailed, engine_from, results_text

log = logging.getLogger(__name__)

WEB_TOOLS = ("web_search", "read_page")
# What the frame around a page's text takes of a tool result (the URL twice, the title,
# the sentence saying it is data): read_page shows at most the loop's cap less this, so
# that the loop never cuts the middle out of a page (vmagent/loop/compact.py cap_tool_result).
FRAME_CHARS = 1200


class WebSearchArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    query: str = Field(min_length=1, max_length=500)
    max_results: int = Field(5, ge=1, le=MAX_RESULTS)


class ReadPageArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str = Field(min_length=1, max_length=4096)
    max_chars: int = Field(4000, ge=200, le=100_000)
    offset: int = Field(0, ge=0, le=2**53)


@dataclass
class WebAnswer:
    text: str
    ok: bool
    # For vmd's record (vmd/contract/params.py WebSource): kind, target, title, detail, ok.
    source: dict[str, Any] = field(default_factory=dict)


class WebTools:
    def __init__(self, engine: SearchEngine | None, reader: PageReader | None, max_chars: int) -> None:
        self.engine, self.reader, self.max_chars = engine, reader, max_chars
        self.names: tuple[str, ...] = tuple(n for n, on in zip(WEB_TOOLS, (engine, reader)) if on is not None)

    @classmethod
    def from_config(cls, config: Any) -> "WebTools":
        """The web tools the operator's settings allow (none when web_tools is off, or
        when it is unset and no engine is configured)."""
        engine = engine_from(config.searxng_url, config.brave_api_key, config.tavily_api_key, config.web_timeout_s)
        on = config.web_tools if config.web_tools is not None else engine is not None
        if not on:
            return cls(None, None, 0)
        guard = Guard(allow=parse_allow_list(config.web_allow))
        limits = FetchLimits(max_bytes=config.web_page_bytes, timeout_s=config.web_timeout_s,
                             max_redirects=config.web_max_redirects)
        reader = PageReader(guard, limits, cache_s=config.web_cache_s)
        return cls(engine, reader, max(200, config.tool_result_cap_chars - FRAME_CHARS))

    def call(self, verb: str, params: dict[str, Any]) -> WebAnswer:
        if verb == "web_search" and self.engine is not None:
            return self._search(WebSearchArgs(**params))
        if verb == "read_page" and self.reader is not None:
            return self._read(ReadPageArgs(**params))
        return WebAnswer(f"ERROR: {verb} is not available in this job.", ok=False)

    def _search(self, args: WebSearchArgs) -> WebAnswer:
        source = {"kind": "search", "target": args.query}
        try:
            results = self.engine.search(args.query, args.max_results)
        except SearchFailed as exc:
            return WebAnswer(f"ERROR: web_search failed: {exc}. Try again later, or read a page you know "
                             "with read_page.", ok=False, source={**source, "ok": False, "detail": str(exc)})
        detail = f"{len(results)} result{'s' if len(results) != 1 else ''} ({self.engine.name})"
        return WebAnswer(results_text(args.query, results), ok=True, source={**source, "ok": True, "detail": detail})

    def _read(self, args: ReadPageArgs) -> WebAnswer:
        answer = self.reader.read(args.url, max_chars=min(args.max_chars, self.max_chars), offset=args.offset)
        source = {"kind": "page", "target": answer.url or args.url, "ok": answer.ok}
        if not answer.ok:
            why = answer.text.split(": ", 1)[-1].removeprefix(f"{source['target']} is refused: ")
            return WebAnswer(answer.text, ok=False, source={**source, "detail": why})
        shown = f"characters {answer.offset:,}-{answer.offset + answer.chars:,} of {answer.total_chars:,}"
        if answer.final_url != answer.url:
            shown += f", from {answer.final_url}"
        return WebAnswer(answer.text, ok=True, source={**source, "title": answer.title, "detail": shown})


def record_source(vmd: Any, emit: Callable[[dict], None], source: dict[str, Any]) -> None:
    """A search or a page read: a line of the live feed, and of vmd's record (the
    `web_source` verb), from which the report lists the sources. A refusal there is logged;
    the work goes on (vmd gone, VmdUnavailable, is the loop's to hear)."""
    line = {"kind": source.get("kind", "page"), "target": str(source.get("target") or "?")[:4000],
            "title": str(source.get("title") or "")[:500], "detail": str(source.get("detail") or "")[:900],
            "ok": bool(source.get("ok"))}
    word = ("searched" if line["kind"] == "search" else "read") if line["ok"] else "could not read"
    emit({"type": "status", "text": f"{word} {line['target']}" + (f": {line['detail']}" if line["detail"] else "")})
    try:
        vmd.call("web_source", **line)
    except VmdError as exc:
        log.warning("vmd refused a web source: %s", exc)
