"""Who is calling: bearer tokens, Open WebUI's forwarded user headers, and preview links.

- A user token (config `tokens`: token -> user) names its user; forwarded headers are ignored.
- The service token (Open WebUI's) names the user given in `X-OpenWebUI-User-Id` (or
  `-Email`); those headers are honoured only together with it, since anyone can send them.
- A preview link carries `exp.sig`, an HMAC of the job id and expiry under the job's own
  secret: it opens that one job's page, screen and events, and nothing else, with no cookie.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from dataclasses import dataclass

from fastapi import HTTPException, Request

from .config import ServiceConfig

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
    if config.service_token and hmac.compare_digest(token, config.service_token):
        user = (request.headers.get(USER_ID_HEADER) or request.headers.get(USER_EMAIL_HEADER) or "").strip()
        if not user:
            raise HTTPException(401, f"The service token needs the {USER_ID_HEADER} header naming "
                                "the person; turn on ENABLE_FORWARD_USER_INFO_HEADERS in Open WebUI.")
        return Caller(user=user, email=request.headers.get(USER_EMAIL_HEADER, ""),
                      name=request.headers.get(USER_NAME_HEADER, ""), via_service=True)
    for known, user in config.tokens.items():
        if hmac.compare_digest(token, known):
            return Caller(user=user)
    raise HTTPException(401, "This token is not known to the job service.",
                        headers={"WWW-Authenticate": "Bearer"})


def _signature(secret: str, job_id: str, expires: int) -> str:
    return hmac.new(secret.encode(), f"{job_id}.{expires}".encode(), hashlib.sha256).hexdigest()


def sign_preview(job: dict, ttl_s: int, now: float | None = None) -> str:
    expires = int((now or time.time()) + ttl_s)
    return f"{expires}.{_signature(job['preview_secret'], job['id'], expires)}"


def preview_token_valid(job: dict, token: str, now: float | None = None) -> bool:
    expires_text, _, signature = (token or "").partition(".")
    if not expires_text.isdigit() or not signature:
        return False
    expires = int(expires_text)
    if expires < (now or time.time()):
        return False
    return hmac.compare_digest(signature, _signature(job["preview_secret"], job["id"], expires))
