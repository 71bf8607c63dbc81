"""Who is calling: bearer tokens, Open WebUI's forwarded user headers, and preview links.

- A user token (config `tokens`: token -> user) names its user; forwarded headers are ignored.
- The service token (Open WebUI's) names the user given in `X-OpenWebUI-User-Id` (or
  `-Email`); those headers are honoured only together with it, since anyone can send them.
  Their values are percent-encoded UTF-8 (Open WebUI sends `X-OpenWebUI-User-Name: Jos%C3%A9`,
  since a header carries no "é"); `forwarded` decodes them.
- A preview link carries `exp.sig`, an HMAC of the job id and expiry under the job's own
  secret: it opens that one job's page, screen and events, and nothing else, with no cookie.
  It stops working at its expiry, or a grace period after its job ended, whichever comes
  first; and it never reaches the access log (`RedactPreviewTokens`).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import time
from dataclasses import dataclass
from urllib.parse import unquote, unquote_plus

from fastapi import HTTPException, Request

from .config import ServiceConfig
from .store import FINAL_STATES

USER_ID_HEADER = "X-OpenWebUI-User-Id"
USER_EMAIL_HEADER = "X-OpenWebUI-User-Email"
USER_NAME_HEADER = "X-OpenWebUI-User-Name"


@dataclass(frozen=True)
class Caller:
    user: str
    email: str = ""
    name: str = ""
    via_service: bool = False


def bearer_token(request: Request) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def authenticate(request: Request, config: ServiceConfig) -> Caller:
    token = bearer_token(request)
    if not token:
        raise HTTPException(401, "Send `Authorization: Bearer <token>`; no token was given.",
                            headers={"WWW-Authenticate": "Bearer"})
    # Compared as bytes: `hmac.compare_digest` refuses a str with non-ASCII characters
    # (a TypeError, a 500 with a traceback, measured), and any malformed token is a 401.
    given = header_bytes(token)
    if config.service_token and hmac.compare_digest(given, utf8_bytes(config.service_token)):
        user = forwarded(request, USER_ID_HEADER) or forwarded(request, USER_EMAIL_HEADER)
        if not user:
            raise HTTPException(401, f"The service token needs the {USER_ID_HEADER} header naming "
                                "the person; turn on ENABLE_FORWARD_USER_INFO_HEADERS in Open WebUI.")
        return Caller(user=user, email=forwarded(request, USER_EMAIL_HEADER),
                      name=forwarded(request, USER_NAME_HEADER), via_service=True)
    for known, user in config.tokens.items():
        if hmac.compare_digest(given, utf8_bytes(known)):
            return Caller(user=user)
    raise HTTPException(401, "This token is not known to the job service.",
                        headers={"WWW-Authenticate": "Bearer"})


def header_bytes(value: str) -> bytes:
    """A header's value as the bytes that came: the server decodes headers as Latin-1."""
    try:
        return value.encode("latin-1")
    except UnicodeEncodeError:  # not from a server's headers
        return utf8_bytes(value)


def utf8_bytes(text: str) -> bytes:
    """`text` as UTF-8; lone surrogates (an environment's undecodable bytes) never raise."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def forwarded(request: Request, header: str) -> str:
    """A forwarded user header as the text it names: percent-escapes decoded as UTF-8 (how
    Open WebUI and its tool send names); a value that arrived as raw UTF-8 bytes (which
    the server reads as Latin-1) is read as UTF-8 too."""
    value = request.headers.get(header, "")
    if not value.isascii():
        try:
            value = value.encode("latin-1").decode("utf-8")
        except UnicodeError:
            pass
    return unquote(value, errors="replace").strip()


# `exp.sig`: seconds since the epoch (12 digits reach the year 33658) and a SHA-256 hex
# HMAC. Anything else is refused before a number is parsed or a signature compared:
# `int()` takes non-ASCII digits ('²') and refuses 5,000-digit ones, both once a 500.
_PREVIEW_TOKEN = re.compile(r"([0-9]{1,12})\.([0-9a-f]{64})")


def _signature(secret: str, job_id: str, expires: int) -> str:
    return hmac.new(secret.encode(), f"{job_id}.{expires}".encode(), hashlib.sha256).hexdigest()


def sign_preview(job: dict, ttl_s: int, now: float | None = None) -> str:
    expires = int((now or time.time()) + ttl_s)
    return f"{expires}.{_signature(job['preview_secret'], job['id'], expires)}"


def preview_token_valid(job: dict, token: str, grace_s: float, now: float | None = None) -> bool:
    """True for this job's own unexpired token, while the job runs or waits and for
    `grace_s` seconds after it ended (`ended`, or `updated` for rows from before it)."""
    match = _PREVIEW_TOKEN.fullmatch(token or "")
    if match is None:
        return False
    expires, signature = int(match[1]), match[2]
    if not hmac.compare_digest(signature, _signature(job["preview_secret"], job["id"], expires)):
        return False
    now = time.time() if now is None else now
    if expires < now:
        return False
    if job["state"] in FINAL_STATES and now > (job.get("ended") or job["updated"]) + grace_s:
        return False
    return True


class RedactPreviewTokens(logging.Filter):
    """Replaces the value of every `token` query parameter in a log record's arguments.

    A preview link is the key to a job's screen and terminal, and uvicorn's access log
    writes each request's path with its query string ('GET /jobs/…/preview?token=…')."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(redact_query(a) if isinstance(a, str) else a for a in record.args)
        if isinstance(record.msg, str):
            record.msg = redact_query(record.msg)
        return True


# One query parameter: its name and value, each ending where the URL does in a log line.
_QUERY_PARAM = re.compile(r"(?<=[?&])([^=&\s\"?#]+)=([^&\s\"#]*)")


def redact_query(text: str) -> str:
    """`text` with the value of each query parameter named `token` (in any spelling a
    server decodes to that, e.g. `tok%65n`) replaced by `[redacted]`."""
    def redact(match: re.Match) -> str:
        if unquote_plus(match[1]).strip().lower() == "token":
            return f"{match[1]}=[redacted]"
        return match[0]

    return _QUERY_PARAM.sub(redact, text) if "=" in text else text


def redact_access_log() -> None:
    """Installs RedactPreviewTokens on uvicorn's access logger, once."""
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, RedactPreviewTokens) for f in access.filters):
        access.addFilter(RedactPreviewTokens())


def require_operator(caller: Caller, config: ServiceConfig, what: str) -> Caller:
    """`caller`, when the service's `operators` name them; else a 403 that says who may."""
    if caller.user not in config.operators:
        raise HTTPException(403, f"{what} is for the service's operators, and {caller.user!r} is not one "
                                 "(the `operators` setting, VMAGENT_OPERATORS, names them).")
    return caller
