"""The SSRF guard: every URL the host fetches on a model's or a person's behalf passes here
before any connection is made.

`Guard.check(url)` reads the URL (http and https only, no user name or password in it),
finds every address its host means (an IP literal in any spelling the C library accepts:
`2130706433`, `0177.0.0.1`, `0x7f.1`, `127.1`, IPv6 forms; else the resolver), and refuses
unless every one of them is public (`ipaddress` `is_global`, not multicast, and for IPv6
that carries an IPv4 address, that address public too) or admitted by the operator's
allow-list (vmagent/web/allow_list.py). The answer is a `Target` holding the address the
connection must go to: `PinnedBackend` connects there and nowhere else, so the name is
resolved once (a DNS answer that changes between the check and the connect, DNS
rebinding, reaches nothing) while the URL's host still names the server for TLS (SNI,
certificate) and the Host header.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Callable

import httpcore

from vmagent.web.allow_list import Allowed, admitted_by

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
# host, port -> the addresses the name resolves to. Tests pass a spy.
Resolver = Callable[[str, int], list[str]]

SCHEMES = {"http": 80, "https": 443}
# A host that inet_aton reads as an IPv4 address: one to four parts, each decimal, octal
# (leading 0) or hex (0x). getaddrinfo reads these as addresses, never as names.
_NUMERIC_HOST = re.compile(r"^(0x[0-9a-f]*|[0-9]+)(\.(0x[0-9a-f]*|[0-9]+)){0,3}\.?$")
# NAT64 prefixes (RFC 6052 well-known, RFC 8215 local use): the last 32 bits are an IPv4
# address a translator would connect to.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
_METADATA = {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254"),
             ipaddress.ip_address("100.100.100.200")}


class Refused(Exception):
    """The guard says no: the message is a sentence for the model (what and why)."""


@dataclass(frozen=True)
class Target:
    """A checked URL: where the one connection for it goes."""
    url: str
    scheme: str
    host: str  # as the URL names it: SNI and the Host header
    port: int
    target: str  # path and query
    address: str  # the pinned address
    admitted_by: Allowed | None = None  # the allow-list entry that let a non-public address in

    @property
    def host_header(self) -> str:
        name = f"[{self.host}]" if ":" in self.host else self.host
        return name if self.port == SCHEMES[self.scheme] else f"{name}:{self.port}"


def system_resolver(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]).split("%")[0] for info in infos))


@dataclass
class Guard:
    allow: list[Allowed] = field(default_factory=list)
    resolver: Resolver = system_resolver

    def check(self, url: str) -> Target:
        """The target `url` may be fetched at, or Refused saying why."""
        scheme, host, port, target = _read_url(url)
        literal = _literal_address(host)
        if literal is not None:
            addresses = [literal]
        else:
            try:
                addresses = [ipaddress.ip_address(a) for a in self.resolver(host, port)]
            except (OSError, UnicodeError, ValueError) as exc:
                raise Refused(f"{url} cannot be read: the name {host} does not resolve ({exc}).") from None
            if not addresses:
                raise Refused(f"{url} cannot be read: the name {host} resolves to no address.")
        entry = None
        for address in addresses:
            entry = admitted_by(self.allow, host, str(address), port)
            problem = None if entry else not_public(address)
            if problem:
                named = (f"resolves to {address}, which is" if literal is None else
                         "is" if str(address) == host else f"means {address}, which is")
                raise Refused(f"{url} is refused: {host} {named} {problem}. read_page reads public "
                              "addresses only (an operator can allow a host or range in the web "
                              "allow-list setting, VMAGENT_WEB_ALLOW, with its reason).")
        return Target(url=url, scheme=scheme, host=host, port=port, target=target,
                      address=str(addresses[0]), admitted_by=entry)


def not_public(address: Address) -> str | None:
    """None for an address anyone on the internet reaches, else what kind it is instead."""
    if address in _METADATA:
        return "a cloud metadata address"
    if address.version == 6:
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            problem = not_public(embedded)
            return f"an IPv6 form of {embedded}, {problem}" if problem else None
    for attribute, words in (("is_loopback", "a loopback address"), ("is_link_local", "a link-local address"),
                             ("is_unspecified", "the unspecified address"),
                             ("is_multicast", "a multicast address"), ("is_private", "a private address")):
        if getattr(address, attribute):
            return words
    if address.version == 6 and (address in _NAT64_LOCAL or address in ipaddress.ip_network("::/96")):
        return "a translated IPv6 address that may reach a local network"
    if not address.is_global:
        return "not a public address"
    return None


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def _read_url(url: str) -> tuple[str, str, int, str]:
    if not isinstance(url, str) or not url.strip():
        raise Refused("read_page needs a URL, such as https://docs.python.org/3/.")
    url = url.strip()
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise Refused(f"{url} is not a URL read_page can read ({exc}).") from None
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        shown = f"a {scheme}: URL" if scheme else "a URL without http:// or https://"
        raise Refused(f"{url} is refused: {shown}. read_page reads http and https URLs only.")
    if parts.username is not None or parts.password is not None:
        raise Refused(f"{url} is refused: a URL with a user name or password in it is not read.")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise Refused(f"{url} is refused: it names no host.")
    if "%" in host:
        raise Refused(f"{url} is refused: an IPv6 address with a zone is a link-local address.")
    try:
        host = host.encode("idna").decode("ascii").lower() if not host.isascii() else host.lower()
    except UnicodeError:
        raise Refused(f"{url} is refused: {host!r} is not a valid host name.") from None
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    # A path as a person writes it (spaces, non-ASCII) goes on the request line percent-encoded;
    # what is encoded already stays as it is.
    target = urllib.parse.quote(target, safe="/?&=%:@!$'()*+,;-._~")
    return scheme, host, port or SCHEMES[scheme], target


def _literal_address(host: str) -> Address | None:
    """The address an IP literal means, in any spelling the C library reads as one."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    if _NUMERIC_HOST.fullmatch(host):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host.rstrip(".")))
        except OSError:
            raise Refused(f"{host} is refused: a number that is not an IP address is not a host name.") from None
    return None


class PinnedBackend(httpcore.NetworkBackend):
    """httpcore's connections for checked targets only: a host and port connect to the
    address the guard pinned for them, and anything else is refused without a connection."""

    def __init__(self, deadline: float | None = None) -> None:
        self._inner = httpcore.SyncBackend()
        self._pins: dict[tuple[str, int], str] = {}
        self.connects: list[tuple[str, int]] = []  # the addresses connected to, in order
        # time.monotonic() past which no read or write waits: httpcore's timeouts hold per
        # read, so a page that sends a byte a second would otherwise never end.
        self.deadline = deadline

    def pin(self, target: Target) -> None:
        self._pins[(target.host, target.port)] = target.address

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        address = self._pins.get((host, port))
        if address is None:  # no path here: every request is made for a pinned target
            raise httpcore.ConnectError(f"{host}:{port} was not checked by the guard")
        self.connects.append((address, port))
        stream = self._inner.connect_tcp(address, port, timeout=self._left(timeout), local_address=local_address,
                                         socket_options=socket_options)
        return _DeadlineStream(stream, self)

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        raise httpcore.ConnectError("read_page does not connect to Unix sockets")

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)

    def _left(self, timeout: float | None) -> float | None:
        if self.deadline is None:
            return timeout
        left = max(0.001, self.deadline - time.monotonic())
        return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose every wait ends by the backend's deadline."""

    def __init__(self, inner: httpcore.NetworkStream, backend: PinnedBackend) -> None:
        self._inner, self._backend = inner, backend

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, self._backend._left(timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, self._backend._left(timeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None):
        tls = self._inner.start_tls(ssl_context, server_hostname, self._backend._left(timeout))
        return _DeadlineStream(tls, self._backend)

    def get_extra_info(self, info: str):
        return self._inner.get_extra_info(info)
