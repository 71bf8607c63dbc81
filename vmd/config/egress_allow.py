"""An entry of the egress allow-list (`egress_allow`): a range an operator lets guests with
approved egress reach although the guard blocks it (a package mirror or a proxy on the
LAN), with its reason. vmd's settings check each entry when they are read (settings.py);
the egress guard writes them into its rules (vmd/machines/egress_guard.py).

Stdlib only.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass


@dataclass(frozen=True)
class Allowed:
    """A range an operator lets guests reach (a package mirror, a proxy), with its reason."""
    network: str
    reason: str
    port: int | None = None

    @classmethod
    def parse(cls, entry: str) -> "Allowed":
        """`CIDR[:PORT]=reason` (IPv6 with a port: `[CIDR]:PORT=reason`)."""
        where, sep, reason = entry.partition("=")
        reason = " ".join(reason.split())
        if not sep or not reason:
            raise ValueError(f"egress allow-list entry {entry!r} has no reason: write it as CIDR[:PORT]=why "
                             f"(for example 10.1.2.3:3128=the office proxy)")
        where = where.strip()
        port = None
        if where.startswith("["):
            addr, _, rest = where[1:].partition("]")
            where, port = addr, rest.lstrip(":") or None
        elif where.count(":") == 1:
            where, port = where.split(":")
        try:
            network = ipaddress.ip_network(where, strict=False)
        except ValueError:
            raise ValueError(f"egress allow-list entry {entry!r}: {where!r} is not an address or a CIDR range") from None
        if port is not None:
            if not str(port).isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"egress allow-list entry {entry!r}: the port must be 1-65535")
            port = int(port)
        if '"' in reason or "\\" in reason or len(reason) > 100:
            raise ValueError(f"egress allow-list entry {entry!r}: the reason must be plain text, at most 100 "
                             f"characters, without quotes or backslashes")
        return cls(str(network), reason, port)
