"""The operator's allow-list for read_page: hosts or address ranges that are not public
(a docs mirror on the LAN) but may be read anyway, each with its reason.

The same shape as vmd's VMD_EGRESS_ALLOW, `CIDR[:PORT]=reason` entries separated by `;`,
and a host name in place of the range: `10.1.2.0/24=the docs mirror; docs.lan:8080=the
wiki`. A range admits the addresses in it (on that port only, when one is given); a host
admits whatever its name resolves to (the operator vouches for the name, not the address).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

# What a host name may be: letters, digits, '-', '.', as DNS writes them.
_HOST = re.compile(r"^(?=.{1,253}$)[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$")


@dataclass(frozen=True)
class Allowed:
    """One entry: a range (`network`) or a host name (`host`), an optional port, the reason."""
    reason: str
    network: ipaddress.IPv4Network | ipaddress.IPv6Network | None = None
    host: str | None = None
    port: int | None = None

    @classmethod
    def parse(cls, entry: str) -> "Allowed":
        """`CIDR[:PORT]=reason` or `HOST[:PORT]=reason` (IPv6 with a port: `[CIDR]:PORT=reason`)."""
        where, sep, reason = entry.partition("=")
        reason = " ".join(reason.split())
        if not sep or not reason:
            raise ValueError(f"web allow-list entry {entry!r} has no reason: write it as CIDR[:PORT]=why or "
                             f"HOST[:PORT]=why (for example 10.1.2.0/24=the docs mirror)")
        if len(reason) > 100:
            raise ValueError(f"web allow-list entry {entry!r}: the reason must be at most 100 characters")
        where, port = _split_port(entry, where.strip())
        try:
            return cls(reason, network=ipaddress.ip_network(where, strict=False), port=port)
        except ValueError:
            pass
        host = where.lower().rstrip(".")
        if not _HOST.fullmatch(host):
            raise ValueError(f"web allow-list entry {entry!r}: {where!r} is neither an address, a CIDR range "
                             "nor a host name")
        return cls(reason, host=host, port=port)

    def admits(self, host: str, address: str, port: int) -> bool:
        if self.port is not None and self.port != port:
            return False
        if self.host is not None:
            return self.host == host
        ip = ipaddress.ip_address(address)
        return ip.version == self.network.version and ip in self.network

    def __str__(self) -> str:
        where = self.host or str(self.network)
        if self.port is not None:
            where = f"[{where}]:{self.port}" if ":" in where else f"{where}:{self.port}"
        return f"{where}={self.reason}"


def _split_port(entry: str, where: str) -> tuple[str, int | None]:
    port: str | None = None
    if where.startswith("["):
        where, _, rest = where[1:].partition("]")
        port = rest.lstrip(":") or None
    elif where.count(":") == 1:
        where, port = where.split(":")
    if port is None:
        return where, None
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"web allow-list entry {entry!r}: the port must be 1-65535")
    return where, int(port)


def parse_allow_list(value: str | list[str] | None) -> list[Allowed]:
    """Entries from a setting: a `;`-separated string (the environment) or a list (a file)."""
    if value is None:
        return []
    entries = value.split(";") if isinstance(value, str) else value
    return [Allowed.parse(e.strip()) for e in entries if e and e.strip()]


def admitted_by(allow: list[Allowed], host: str, address: str, port: int) -> Allowed | None:
    """The entry that admits `address` (which `host` resolved to) on `port`, if any."""
    return next((a for a in allow if a.admits(host, address, port)), None)
