"""The SSRF guard refuses, before any connection is made, every URL that would reach this
machine, a private network, link-local or cloud metadata addresses, in any spelling; a
redirect to one is refused the same way; the one connection goes to the address checked.

No test here sends a packet past loopback: the connector spy connects to 127.0.0.1 only
and records every attempt, and the names are answered by a resolver spy."""

from __future__ import annotations

import ipaddress

import httpcore
import pytest

from tests.support.web_pages import Listener, PageServer
from vmagent.web.allow_list import Allowed, parse_allow_list
from vmagent.web.fetch import FetchLimits, fetch
from vmagent.web.guard import Guard, PinnedBackend, Refused
from vmagent.web.page import PageReader

LIMITS = FetchLimits(max_bytes=2 * 1024 * 1024, timeout_s=10, max_redirects=5)
NAMES = {
    "intranet.test": ["10.1.2.3"],
    "router.test": ["192.168.1.1"],
    "metadata.test": ["169.254.169.254"],
    "metadata6.test": ["fd00:ec2::254"],
    "linklocal6.test": ["fe80::1"],
    "loopback6.test": ["::1"],
    "mapped.test": ["::ffff:127.0.0.1"],
    "nat64.test": ["64:ff9b::7f00:1"],
    "sixtofour.test": ["2002:a01:203::1"],
    "cgnat.test": ["100.64.0.1"],
    "mixed.test": ["93.184.216.34", "127.0.0.1"],  # one public answer does not carry a local one
    "docs.example": ["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946"],
}


class SpyResolver:
    def __init__(self, names: dict[str, list[str]]) -> None:
        self.names, self.asked = names, []

    def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append(host)
        if host not in self.names:
            raise OSError(f"no such name {host}")
        return self.names[host]


class SpyBackend(PinnedBackend):
    """Records every connection attempt; connects to loopback only, whatever a bug asks."""

    def __init__(self) -> None:
        super().__init__()
        self.attempts: list[tuple[str, int]] = []

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        address = self._pins.get((host, port), host)
        self.attempts.append((address, port))
        if not ipaddress.ip_address(address).is_loopback:
            raise httpcore.ConnectError(f"the test connects to loopback only, not {address}")
        return super().connect_tcp(host, port, timeout, local_address, socket_options)


@pytest.fixture
def server():
    s = PageServer()
    yield s
    s.close()


@pytest.fixture
def listener():
    spot = Listener()
    yield spot
    spot.close()


def _reader(server: PageServer, spy: SpyBackend, resolver=None) -> PageReader:
    allow = parse_allow_list(f"127.0.0.1:{server.port}=the test's page server")
    guard = Guard(allow=allow, resolver=resolver or SpyResolver(NAMES))
    return PageReader(guard, LIMITS, cache_s=900,
                      fetcher=lambda url, g, limits: fetch(url, g, limits, backend=spy))


BLOCKED = [
    "http://127.0.0.1:{port}/",
    "http://localhost:{port}/",  # the system's resolver: /etc/hosts
    "http://LOCALHOST.:{port}/",
    "http://[::1]:{port}/",
    "http://[::ffff:127.0.0.1]:{port}/",
    "http://[::ffff:7f00:1]:{port}/",
    "http://[fe80::1%25lo]:{port}/",
    "http://2130706433:{port}/",  # decimal
    "http://0177.0.0.1:{port}/",  # octal
    "http://017700000001:{port}/",
    "http://0x7f.1:{port}/",  # hex, short form
    "http://127.1:{port}/",
    "http://0.0.0.0:{port}/",
    "http://169.254.169.254/latest/meta-data/",
    "http://[fd00:ec2::254]/latest/meta-data/",
    "http://intranet.test:{port}/",
    "http://router.test/",
    "http://metadata.test/latest/meta-data/",
    "http://metadata6.test/",
    "http://linklocal6.test/",
    "http://loopback6.test:{port}/",
    "http://mapped.test:{port}/",
    "http://nat64.test:{port}/",
    "http://sixtofour.test/",
    "http://cgnat.test/",
    "http://mixed.test:{port}/",
    "http://224.0.0.1/",
    "file:///etc/passwd",
    "gopher://127.0.0.1:{port}/_GET%20/",
    "ftp://127.0.0.1:{port}/",
    "http://user:secret@127.0.0.1:{port}/",
    "javascript:alert(1)",
]


@pytest.mark.parametrize("url", BLOCKED)
def test_a_local_private_or_odd_url_is_refused_before_any_connection(url, server, listener):
    spy = SpyBackend()
    url = url.format(port=listener.port)
    answer = _reader(server, spy, resolver=_resolver_with_system()).read(url, max_chars=1000)
    assert not answer.ok
    assert answer.text.startswith("REFUSED:"), answer.text
    assert spy.attempts == []
    assert listener.accepted() == 0


def _resolver_with_system():
    from vmagent.web.guard import system_resolver

    spy = SpyResolver(NAMES)

    def resolve(host: str, port: int) -> list[str]:
        return spy(host, port) if host in NAMES else system_resolver(host, port)
    return resolve


@pytest.mark.parametrize("to", [
    "http://127.0.0.1:{port}/", "http://2130706433:{port}/", "http://[::1]:{port}/",
    "http://169.254.169.254/latest/meta-data/", "http://intranet.test/", "file:///etc/passwd",
    "gopher://127.0.0.1:{port}/",
])
def test_a_redirect_to_a_refused_url_is_refused_before_its_connection(to, server, listener):
    spy = SpyBackend()
    to = to.format(port=listener.port)
    answer = _reader(server, spy).read(f"{server.base}/to?u={to}", max_chars=1000)
    assert answer.text.startswith("REFUSED:") and "redirects to" in answer.text, answer.text
    assert spy.attempts == [("127.0.0.1", server.port)]  # the page server only
    assert listener.accepted() == 0


def test_the_allow_list_admits_its_port_only(server, listener):
    spy = SpyBackend()
    reader = _reader(server, spy)
    assert reader.read(f"{server.base}/text", max_chars=1000).ok
    assert not reader.read(f"http://127.0.0.1:{listener.port}/text", max_chars=1000).ok
    assert listener.accepted() == 0


def test_public_addresses_pass_and_the_first_is_pinned():
    guard = Guard(resolver=SpyResolver(NAMES))
    target = guard.check("https://docs.example/guide?q=1")
    assert (target.host, target.port, target.target, target.address) == ("docs.example", 443, "/guide?q=1",
                                                                          "93.184.216.34")
    assert guard.check("http://[2606:2800:220:1:248:1893:25c8:1946]/").address == "2606:2800:220:1:248:1893:25c8:1946"
    assert guard.check("http://8.8.8.8/").address == "8.8.8.8"


def test_the_name_is_resolved_once_and_the_connection_goes_to_that_address(server):
    """DNS rebinding: a second answer (a private address) is never asked for."""
    answers = iter([["127.0.0.1"], ["10.9.9.9"]])
    asked = []

    def rebinding(host: str, port: int) -> list[str]:
        asked.append(host)
        return next(answers)

    spy = SpyBackend()
    answer = _reader(server, spy, resolver=rebinding).read(f"http://pages.test:{server.port}/text", max_chars=1000)
    assert answer.ok, answer.text
    assert "plain words" in answer.text
    assert asked == ["pages.test"]
    assert spy.attempts == [("127.0.0.1", server.port)]
    assert server.hosts == [f"pages.test:{server.port}"]  # the Host header names the URL's host


def test_a_host_entry_admits_what_its_name_resolves_to():
    guard = Guard(allow=parse_allow_list("docs.lan=the docs mirror"), resolver=SpyResolver({"docs.lan": ["10.1.2.3"]}))
    target = guard.check("http://docs.lan/x")
    assert target.address == "10.1.2.3" and target.admitted_by.reason == "the docs mirror"
    with pytest.raises(Refused):
        Guard(allow=guard.allow, resolver=SpyResolver(NAMES)).check("http://intranet.test/")


@pytest.mark.parametrize("entry, problem", [
    ("10.0.0.0/8", "has no reason"),
    ("10.0.0.0/8=", "has no reason"),
    ("10.0.0.1:99999=x", "the port must be 1-65535"),
    ("bad_host!=x", "neither an address"),
])
def test_an_allow_list_entry_without_its_reason_or_shape_is_an_error(entry, problem):
    with pytest.raises(ValueError, match=problem):
        Allowed.parse(entry)


def test_allow_list_entries_read_from_the_setting():
    entries = parse_allow_list("10.1.2.0/24=the docs mirror; [fd00::1]:8080=the v6 wiki; docs.lan:8443=the wiki")
    assert [str(e) for e in entries] == ["10.1.2.0/24=the docs mirror", "[fd00::1/128]:8080=the v6 wiki",
                                         "docs.lan:8443=the wiki"]
    assert entries[1].admits("x", "fd00::1", 8080) and not entries[1].admits("x", "fd00::1", 80)


def test_https_goes_to_the_pinned_address_with_the_names_sni_and_certificate():
    from tests.support.web_pages import TlsPageServer

    server = TlsPageServer("docs.test")
    try:
        spy = SpyBackend()
        guard = Guard(allow=parse_allow_list(f"127.0.0.1:{server.port}=the test's TLS page server"),
                      resolver=SpyResolver({"docs.test": ["127.0.0.1"]}))
        reader = PageReader(guard, LIMITS, cache_s=0, fetcher=lambda url, g, limits: fetch(
            url, g, limits, backend=spy, context=server.client_context))
        answer = reader.read(f"https://docs.test:{server.port}/text", max_chars=1000)
        assert answer.ok, answer.text
        assert "plain words" in answer.text
        assert spy.attempts == [("127.0.0.1", server.port)]
        assert server.names == ["docs.test"]  # SNI names the URL's host, not the address
        assert server.hosts == [f"docs.test:{server.port}"]
        # The certificate is checked against the URL's host: by address it does not fit.
        by_address = reader.read(f"https://127.0.0.1:{server.port}/text", max_chars=1000)
        assert not by_address.ok and "CERTIFICATE_VERIFY_FAILED" in by_address.text, by_address.text
    finally:
        server.close()


def test_a_path_as_a_person_writes_it_goes_percent_encoded_and_the_fragment_stays_home():
    target = Guard(resolver=SpyResolver(NAMES)).check("https://docs.example/wiki/Straße a?q=ü&x=%20#part")
    assert target.target == "/wiki/Stra%C3%9Fe%20a?q=%C3%BC&x=%20"
