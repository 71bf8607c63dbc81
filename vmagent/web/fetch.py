"""One guarded GET: the URL and every redirect checked by the guard (vmagent/web/guard.py)
and connected to at the pinned address, at most `max_redirects` redirects, the body read
up to `max_bytes` and until `timeout_s` has passed (what arrived by then is kept and said
to be cut). Raises `Refused` (the guard said no) or `FetchFailed`; never anything else."""

from __future__ import annotations

import ssl
import time
import urllib.parse
from dataclasses import dataclass, field

import certifi
import httpcore

from vmagent.web.guard import Guard, PinnedBackend, Refused, Target

REDIRECTS = (301, 302, 303, 307, 308)
USER_AGENT = "vmagent-read_page/1 (a coding agent reading documentation)"


class FetchFailed(Exception):
    """The page could not be read: the message says why, for the model."""


@dataclass(frozen=True)
class FetchLimits:
    max_bytes: int
    timeout_s: float
    max_redirects: int


@dataclass
class Fetched:
    url: str  # where the body came from, after redirects
    status: int
    media_type: str  # "text/html", lower case, without parameters
    charset: str | None
    body: bytes
    cut: str | None = None  # why the body is not whole: a sentence, or None
    redirects: list[str] = field(default_factory=list)  # the URLs redirected to, in order
    admitted_by: str | None = None  # the allow-list entry a non-public address came in by


def fetch(url: str, guard: Guard, limits: FetchLimits, backend: PinnedBackend | None = None,
          context: ssl.SSLContext | None = None) -> Fetched:
    """GET `url` within the limits. `backend`: the tests' spy on connections; `context`:
    the certificates trusted (certifi's, the browsers' set, unless a test brings its own)."""
    deadline = time.monotonic() + limits.timeout_s
    backend = backend or PinnedBackend()
    backend.deadline = deadline
    context = context or ssl.create_default_context(cafile=certifi.where())
    redirects: list[str] = []
    with httpcore.ConnectionPool(ssl_context=context, network_backend=backend, retries=0) as pool:
        current = url
        while True:
            target = _checked(guard, current, url)
            backend.pin(target)
            try:
                fetched = _get(pool, target, deadline, limits)
            except httpcore.TimeoutException:
                raise FetchFailed(f"{current} did not answer within {limits.timeout_s:g} s.") from None
            except (httpcore.NetworkError, httpcore.ProtocolError, ssl.SSLError, OSError) as exc:
                raise FetchFailed(f"{current} could not be read: {type(exc).__name__}: {exc}".rstrip(": ")
                                  + ".") from None
            if isinstance(fetched, Fetched):
                fetched.redirects = redirects
                fetched.admitted_by = str(target.admitted_by) if target.admitted_by else None
                return fetched
            if len(redirects) >= limits.max_redirects:
                raise Refused(f"{url} is refused: it redirects more than {limits.max_redirects} times "
                              f"(last to {fetched}).")
            redirects.append(fetched)
            current = fetched


def _checked(guard: Guard, current: str, first: str) -> Target:
    try:
        return guard.check(current)
    except Refused as exc:
        if current == first:
            raise
        why = str(exc).removeprefix(f"{current} is refused: ")
        raise Refused(f"{first} redirects to {current}, which is refused: {why}") from None


def _get(pool: httpcore.ConnectionPool, target: Target, deadline: float, limits: FetchLimits) -> "Fetched | str":
    """The page, or the URL a redirect points to."""
    left = max(0.001, deadline - time.monotonic())
    request_url = httpcore.URL(scheme=target.scheme.encode(), host=target.host.encode("ascii"), port=target.port,
                               target=target.target.encode("ascii", "ignore") or b"/")
    headers = [(b"Host", target.host_header.encode("ascii")), (b"User-Agent", USER_AGENT.encode()),
               (b"Accept", b"text/html,application/xhtml+xml,text/plain,application/json,application/pdf;q=0.9,*/*;q=0.5"),
               # Compressed bodies would need a bound of their own (a zip bomb): none asked for.
               (b"Accept-Encoding", b"identity")]
    timeouts = {"connect": left, "read": left, "write": left, "pool": left}
    with pool.stream("GET", request_url, headers=headers, extensions={"timeout": timeouts}) as response:
        status = response.status
        head = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in response.headers}
        if status in REDIRECTS and head.get("location"):
            return urllib.parse.urljoin(target.url, head["location"].strip())
        if status >= 400:
            raise FetchFailed(f"{target.url} answered HTTP {status}; nothing to read there.")
        media_type, charset = _content_type(head.get("content-type", ""))
        body, cut = bytearray(), None
        try:
            for chunk in response.iter_stream():
                body += chunk
                if len(body) >= limits.max_bytes:
                    del body[limits.max_bytes:]
                    cut = (f"the page is larger than the {limits.max_bytes // 1024} KiB read_page reads; "
                           "this is its beginning")
                    break
                if time.monotonic() >= deadline:
                    cut = f"the page took longer than {limits.timeout_s:g} s to arrive; this is what came"
                    break
        except httpcore.TimeoutException:
            if not body:
                raise
            cut = f"the page took longer than {limits.timeout_s:g} s to arrive; this is what came"
        return Fetched(url=target.url, status=status, media_type=media_type, charset=charset, body=bytes(body),
                       cut=cut)


def _content_type(value: str) -> tuple[str, str | None]:
    media, _, params = value.partition(";")
    charset = None
    for param in params.split(";"):
        name, _, val = param.partition("=")
        if name.strip().lower() == "charset" and val.strip():
            charset = val.strip().strip('"').lower()
    return media.strip().lower(), charset
