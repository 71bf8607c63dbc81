"""A real search engine for web_search's tests: Debian's `searx` package (1.1), run on
127.0.0.1 with one offline engine, its `sqlite` engine, over a database the test fills.
It answers `/search?format=json` in the shape SearXNG still answers (results with title,
url, content, engine). No other engine is configured, so it sends nothing anywhere.

setup.sh installs the package (`apt-get install searx`); a test without it skips, and
fails under CI=true, where every test must run."""

from __future__ import annotations

import os
import shutil
import socket
import sqlite3
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml

SEARX_RUN = "/usr/bin/searx-run"
EXAMPLE_SETTINGS = Path("/usr/share/doc/searx/examples/settings.yml")
ENGINE = "testdocs"
# Only rows whose title or content holds the query: searx's sqlite engine binds :query.
QUERY = ("SELECT url, title, content FROM pages WHERE title LIKE '%' || :query || '%' "
         "OR content LIKE '%' || :query || '%' ORDER BY rowid")


class SearxMissing(RuntimeError):
    pass


def start_searx(folder: Path, pages: list[tuple[str, str, str]]) -> "SearxServer":
    """A running searx serving `pages`, or a skip (outside CI) or a failure (in CI, where the
    web search tests must run) that names what to install."""
    try:
        return SearxServer(folder, pages)
    except SearxMissing as exc:
        if os.environ.get("CI"):
            pytest.fail(f"web search tests must run in CI, but {exc}", pytrace=False)
        pytest.skip(str(exc))


class SearxServer:
    """searx-run in its own process group, with settings and a database under `folder`."""

    def __init__(self, folder: Path, pages: list[tuple[str, str, str]]) -> None:
        if not os.access(SEARX_RUN, os.X_OK) or not EXAMPLE_SETTINGS.is_file():
            raise SearxMissing("Debian's searx package is not installed (apt-get install searx)")
        folder.mkdir(parents=True, exist_ok=True)
        self.database = folder / "pages.db"
        with sqlite3.connect(self.database) as db:
            db.execute("CREATE TABLE pages (url TEXT, title TEXT, content TEXT)")
            db.executemany("INSERT INTO pages VALUES (?, ?, ?)", pages)
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        settings = folder / "settings.yml"
        settings.write_text(yaml.safe_dump(self._settings()))
        self.log = (folder / "searx.log").open("wb")
        env = {"PATH": "/usr/bin:/bin", "HOME": str(folder), "SEARX_SETTINGS_PATH": str(settings),
               "SEARX_DEBUG": "0", "LANG": "C.UTF-8"}
        self.process = subprocess.Popen([SEARX_RUN], env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        self._wait_ready(folder)

    def _settings(self) -> dict:
        # The package's example settings, every engine replaced by one offline engine.
        text = EXAMPLE_SETTINGS.read_text()
        head, _, rest = text.partition("\nengines:")
        settings = yaml.safe_load(head + "\n" + rest[rest.index("\nlocales:"):])
        settings["server"].update(port=self.port, bind_address="127.0.0.1", secret_key=os.urandom(16).hex(),
                                  method="GET")
        settings["search"]["autocomplete"] = ""
        settings.pop("checker", None)
        settings["engines"] = [{"name": ENGINE, "engine": "sqlite", "shortcut": "td", "categories": "general",
                                "database": str(self.database), "query_str": QUERY}]
        return settings

    def _wait_ready(self, folder: Path) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"searx-run exited with {self.process.returncode}: "
                                   f"{(folder / 'searx.log').read_text(errors='replace')[-2000:]}")
            try:
                if httpx.get(f"{self.url}/search", params={"q": "ping", "format": "json"}, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.close()
        raise RuntimeError("searx did not answer within 60 s")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def searx_installed() -> bool:
    return shutil.which("searx-run") is not None or os.access(SEARX_RUN, os.X_OK)
