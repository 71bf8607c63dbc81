"""An httpx transport that lets no JSON line deeper than JSON_MAX_DEPTH reach a parser.

The official `ollama` client parses each line of Ollama's stream (and each whole reply)
with json.loads inside its own code, where vmagent cannot measure the depth first. A
server (a broken one, or one that is not Ollama) that sent 10,000 '[' would raise a
RecursionError in the worker, and on CPython 3.11.2 that can corrupt the interpreter
(vmd/contract/json_depth.py). This transport sits under the client: every line of the body is
measured as it arrives, before the client's parser sees it, and a line too deep ends the
reply with TooDeep, which failures.py says in a sentence.
"""

from __future__ import annotations

from typing import Iterator

import httpx

from vmd.contract.json_depth import MAX_DEPTH as JSON_MAX_DEPTH, TooDeep, check as json_depth_check


class DepthBoundTransport(httpx.BaseTransport):
    def __init__(self, inner: httpx.BaseTransport | None = None, limit: int = JSON_MAX_DEPTH):
        self.inner = inner or httpx.HTTPTransport()
        self.limit = limit

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        # The lines are measured as the server sent them: a compressed body would have
        # to be decoded here first, so none is asked for.
        request.headers["Accept-Encoding"] = "identity"
        response = self.inner.handle_request(request)
        encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            response.close()
            raise httpx.DecodingError(f"the server compressed its reply ({encoding}) when asked not to",
                                      request=request)
        assert isinstance(response.stream, httpx.SyncByteStream)
        return httpx.Response(response.status_code, headers=response.headers,
                              stream=_MeasuredLines(response.stream, self.limit),
                              extensions=response.extensions, request=request)

    def close(self) -> None:
        self.inner.close()


class _MeasuredLines(httpx.SyncByteStream):
    def __init__(self, stream: httpx.SyncByteStream, limit: int):
        self.stream = stream
        self.limit = limit

    def __iter__(self) -> Iterator[bytes]:
        pending = bytearray()
        for chunk in self.stream:
            pending += chunk
            end = pending.rfind(b"\n")
            if end >= 0:
                # Each line this chunk completes is measured before the chunk is passed on:
                # the client parses a line only once its newline has arrived.
                for line in bytes(pending[:end]).split(b"\n"):
                    json_depth_check(line, self.limit)
                del pending[:end + 1]
            yield chunk
        json_depth_check(bytes(pending), self.limit)  # the last line, which has no newline

    def close(self) -> None:
        self.stream.close()


__all__ = ["DepthBoundTransport", "TooDeep"]
