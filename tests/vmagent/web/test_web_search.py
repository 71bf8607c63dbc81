"""web_search against a real search engine: Debian's searx on 127.0.0.1 with an offline
engine serving the test's rows through `/search?format=json`; Brave and Tavily against
stand-ins of their APIs' request and answer shapes (the key in its header, never shown)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler

import pytest
from pydantic import SecretStr

from tests.support.http_stand_in import StandInHTTPServer
from tests.support.searx_server import ENGINE, start_searx
from vmagent.web.search import Brave, SearchFailed, Searxng, Tavily, engine_from, results_text

PAGES = [
    ("https://frob.example/docs/api", "Frobnicate API reference", "How to call frobnicate(count, mode)."),
    ("https://frob.example/docs/install", "Installing frob", "pip install frob; frobnicate needs Python 3.11."),
    ("https://other.example/cooking", "Cooking pasta", "Boil water, add salt."),
] + [(f"https://frob.example/release/{n}", f"Frobnicate release 1.{n}", f"Release notes {n}.") for n in range(8)]


@pytest.fixture(scope="module")
def searx(tmp_path_factory):
    server = start_searx(tmp_path_factory.mktemp("searx"), PAGES)
    yield server
    server.close()


def test_searx_answers_results_with_title_url_snippet_and_engine(searx):
    results = Searxng(searx.url, timeout_s=20).search("frobnicate", max_results=5)
    assert len(results) == 5
    first = results[0]
    assert (first.title, first.url, first.snippet, first.engine) == (
        "Frobnicate API reference", "https://frob.example/docs/api", "How to call frobnicate(count, mode).", ENGINE)
    assert all("frob" in r.url for r in results)
    assert not Searxng(searx.url, timeout_s=20).search("no such words anywhere", max_results=5)


def test_search_results_are_framed_as_untrusted_text(searx):
    results = Searxng(searx.url, timeout_s=20).search("pasta", max_results=5)
    text = results_text("pasta", results)
    assert text.startswith("web_search 'pasta': 1 result.")
    assert "untrusted text from the web" in text and "Read a page with read_page(url)." in text
    assert "1. Cooking pasta\n   https://other.example/cooking\n   Boil water, add salt." in text
    assert results_text("zzz", []) == "web_search 'zzz': no results. Try other words."


def test_an_engine_that_is_not_there_is_a_sentence():
    with pytest.raises(SearchFailed, match=r"the search engine \(searxng\) could not be reached: ConnectError"):
        Searxng("http://127.0.0.1:9", timeout_s=5).search("x", 3)


class _ApiStandIn:
    """Brave's GET /res/v1/web/search and Tavily's POST /search, each with its key check."""

    def __init__(self, key: str) -> None:
        self.requests: list[dict] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _answer(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                stand_in.requests.append({"path": self.path, "headers": dict(self.headers)})
                if not self.path.startswith("/res/v1/web/search?"):
                    return self._answer(404, {})
                if self.headers.get("X-Subscription-Token") != key:
                    return self._answer(401, {"type": "ErrorResponse", "error": {"code": "SUBSCRIPTION_TOKEN_INVALID"}})
                self._answer(200, {"type": "search", "web": {"type": "search", "results": [
                    {"title": "<strong>Frob</strong> docs", "url": "https://frob.example/", "description": "All about <strong>frob</strong> &amp; co."},
                    {"title": "Second", "url": "https://two.example/", "description": "two"}]}})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stand_in.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                if self.headers.get("Authorization") != f"Bearer {key}":
                    return self._answer(401, {"detail": {"error": "Unauthorized"}})
                self._answer(200, {"query": body["query"], "answer": None, "response_time": 0.5, "results": [
                    {"title": "Frob guide", "url": "https://frob.example/guide", "content": "The guide.", "score": 0.9}
                    for _ in range(body["max_results"])]})

        self.httpd = StandInHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def api():
    stand_in = _ApiStandIn("k-123")
    yield stand_in
    stand_in.close()


def test_brave_sends_its_key_in_its_header_and_reads_web_results(api):
    results = Brave(SecretStr("k-123"), timeout_s=5, base_url=api.url).search("frob", max_results=30)
    assert [(r.title, r.url, r.snippet, r.engine) for r in results] == [
        ("Frob docs", "https://frob.example/", "All about frob & co.", "brave"),
        ("Second", "https://two.example/", "two", "brave")]
    assert "count=20" in api.requests[0]["path"] and "k-123" not in api.requests[0]["path"]


def test_tavily_sends_its_key_as_a_bearer_token(api):
    results = Tavily(SecretStr("k-123"), timeout_s=5, base_url=api.url).search("frob", max_results=3)
    assert len(results) == 3 and results[0].snippet == "The guide." and results[0].engine == "tavily"
    assert api.requests[0]["body"] == {"query": "frob", "max_results": 3}


@pytest.mark.parametrize("engine", [Brave, Tavily])
def test_a_wrong_key_is_said_and_never_shown(api, engine):
    with pytest.raises(SearchFailed) as failed:
        engine(SecretStr("wrong-key"), timeout_s=5, base_url=api.url).search("frob", 3)
    assert "answered HTTP 401 (is its key right?)" in str(failed.value)
    assert "wrong-key" not in str(failed.value)


def test_searxng_is_the_engine_when_several_are_set():
    key = SecretStr("k")
    assert engine_from("http://searx.lan", key, key, 20).name == "searxng"
    assert engine_from(None, key, key, 20).name == "brave"
    assert engine_from(None, None, key, 20).name == "tavily"
    assert engine_from(None, SecretStr(""), None, 20) is None
