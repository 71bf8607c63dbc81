"""The egress guard: a guest whose egress a person approved reaches the internet, never the
host.

A guest's egress NIC is QEMU user networking (slirp): every connection the guest makes is
a `connect()` by the QEMU process on the host. Unguarded, its gateway forwards to the
host's 127.0.0.1, where every guest's SSH forward, Ollama and the job service listen, and
the host's other addresses and networks are one hop away (measured on a real guest before
this guard: 10.0.3.2:5900 answered `RFB 003.008`, another guest's screen, no password).

QEMU runs as one unprivileged user (`share_user`, libvirt's DAC label on every guest), so
an nftables table on the host's output hook refuses *new* connections from that user to:
the host's own addresses of any kind (nft's `fib daddr type local`: loopback, every
interface's address), broadcast and multicast, and the private, shared, link-local and
reserved ranges (`BLOCKED_V4`, `BLOCKED_V6`). Replies on connections made to QEMU (vmd's
SSH to the forward) are established, not new, and pass. Two holes are opened on purpose,
before the refusals: the host's own DNS servers on port 53 (slirp answers the guest's DNS
by asking the resolvers in the host's resolv.conf, often a loopback or LAN address), and
the ranges an operator allow-lists, each with its reason (`VMD_EGRESS_ALLOW`).

Why nftables and not the alternatives: passt's `--no-map-gw` removes only the gateway
mapping, not the host's other addresses; a network namespace per guest would need libvirt
to start QEMU inside it. One table keyed on QEMU's uid holds for every guest, for the
egress NIC present at boot and the one hot-plugged later, and for warm guests restored.

vmd installs the table at start (it runs as root), `vmd doctor` checks it and tries it, and
vmd refuses to open egress where it is missing or stale (`require`): an approval is not
turned into an unguarded network.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import pwd
import shutil
import socket
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from vmd.config.egress_allow import Allowed
from vmd.host_env import clean_env

TABLE = "vmagent_egress"
NFT_TIMEOUT_S = 10.0
MARK = "vmagent egress guard"

# What a guest may not reach even with egress open (besides the host's own addresses).
# IANA's special-purpose registries, less the documentation ranges (TEST-NET-1/2/3,
# 2001:db8::/32), which no one routes and which the tests' stand-in internet uses.
BLOCKED_V4 = (
    "0.0.0.0/8",        # "this network"
    "10.0.0.0/8",       # private (RFC 1918)
    "100.64.0.0/10",    # shared address space (carrier NAT, many VPNs)
    "127.0.0.0/8",      # loopback
    "169.254.0.0/16",   # link-local: cloud metadata services live at 169.254.169.254
    "172.16.0.0/12",    # private (RFC 1918): Docker's bridges
    "192.0.0.0/24",     # IETF protocol assignments
    "192.168.0.0/16",   # private (RFC 1918)
    "198.18.0.0/15",    # benchmarking
    "224.0.0.0/4",      # multicast
    "240.0.0.0/4",      # reserved, and the broadcast address
)
_BLOCKED_V6 = (
    "::/127",           # unspecified and loopback
    "::ffff:0:0/96",    # IPv4-mapped: the IPv4 rules above, spelled another way
    "64:ff9b:1::/48",   # local-use NAT64
    "100::/64",         # discard
    "100:0:0:1::/64",   # dummy prefix (RFC 9780)
    "2001::/32",        # Teredo: carries IPv4 endpoints in the address
    "2001:2::/48",      # benchmarking
    "5f00::/16",        # SRv6 SIDs
    "fc00::/7",         # unique local
    "fe80::/10",        # link-local
    "fec0::/10",        # site-local (deprecated, still routed by some stacks)
    "ff00::/8",         # multicast
)


def _embedded(prefix: str, shift: int, v4: str) -> str:
    """The v6 range whose addresses carry the IPv4 range `v4` at bit `shift` from the right."""
    net, head = ipaddress.ip_network(v4), ipaddress.ip_network(prefix)
    first = int(head.network_address) | (int(net.network_address) << shift)
    return str(ipaddress.IPv6Network((first, head.prefixlen + net.prefixlen)))


# The well-known NAT64 prefix (RFC 6052: 64:ff9b::a.b.c.d, the IPv4 address in the last 32
# bits) and 6to4 (RFC 3056: 2002:AABB:CCDD::/48) carry an IPv4 address: a NAT64 gateway or
# a 6to4 relay on the host's network turns a connection to one into one to that IPv4
# address. The IPv4 rules hold for the address inside them; the rest of both stays open
# (through NAT64 an IPv6-only host reaches the IPv4 internet).
BLOCKED_V6 = _BLOCKED_V6 + tuple(_embedded("64:ff9b::/96", 0, v4) for v4 in BLOCKED_V4) \
    + tuple(_embedded("2002::/16", 80, v4) for v4 in BLOCKED_V4)


class EgressGuardError(RuntimeError):
    """The guard cannot be installed or does not hold; the message says what to do."""


def host_dns_servers(resolv_conf: Path = Path("/etc/resolv.conf")) -> list[str]:
    """The resolvers slirp forwards the guest's DNS to (libslirp reads resolv.conf)."""
    try:
        lines = resolv_conf.read_text(errors="replace").splitlines()
    except OSError:
        return []
    servers = []
    for line in lines:
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "nameserver":
            try:
                servers.append(str(ipaddress.ip_address(parts[1].split("%")[0])))
            except ValueError:
                continue
    return servers


def _family(address: str) -> str:
    return "ip6" if ipaddress.ip_network(address, strict=False).version == 6 else "ip"


@dataclass(frozen=True)
class Ruleset:
    """The guard's nftables table for QEMU's uid: rendered text and the digest it carries."""
    uid: int
    allowed: tuple[Allowed, ...] = ()
    dns_servers: tuple[str, ...] = ()

    def render(self) -> str:
        body = [
            f"    meta skuid != {self.uid} accept",
            "    ct state established,related accept",
        ]
        for server in self.dns_servers:
            body.append(f"    {_family(server)} daddr {server} meta l4proto {{ tcp, udp }} th dport 53 accept"
                        f' comment "the host\'s resolver: slirp asks it for the guest"')
        for allowed in self.allowed:
            port = f" meta l4proto {{ tcp, udp }} th dport {allowed.port}" if allowed.port else ""
            body.append(f'    {_family(allowed.network)} daddr {allowed.network}{port} accept comment "{allowed.reason}"')
        reject = "reject with icmpx type admin-prohibited"
        body += [
            f"    meta l4proto tcp fib daddr type {{ local, broadcast, multicast, anycast }} counter reject with tcp reset",
            f"    fib daddr type {{ local, broadcast, multicast, anycast }} counter {reject}",
            "    meta l4proto tcp ip daddr @blocked_v4 counter reject with tcp reset",
            f"    ip daddr @blocked_v4 counter {reject}",
            "    meta l4proto tcp ip6 daddr @blocked_v6 counter reject with tcp reset",
            f"    ip6 daddr @blocked_v6 counter {reject}",
        ]
        # The sets are part of what is installed: a table with an older list is stale too.
        sets = [", ".join(BLOCKED_V4), ", ".join(BLOCKED_V6)]
        digest = hashlib.sha256("\n".join(sets + body).encode()).hexdigest()[:16]
        body.append(f'    counter comment "{MARK} {digest}"')
        return "\n".join([
            f"table inet {TABLE} {{",
            f"  set blocked_v4 {{ type ipv4_addr; flags interval; elements = {{ {', '.join(BLOCKED_V4)} }}; }}",
            f"  set blocked_v6 {{ type ipv6_addr; flags interval; elements = {{ {', '.join(BLOCKED_V6)} }}; }}",
            "  chain guest_egress {",
            # Before the usual filter priority, so a permissive rule elsewhere cannot accept first.
            "    type filter hook output priority filter - 10; policy accept;",
            *body,
            "  }",
            "}",
        ]) + "\n"

    def digest(self) -> str:
        return self.render().rsplit(MARK + " ", 1)[1].split('"', 1)[0]


class EgressGuard:
    """Install, check and require the guard for QEMU's user."""

    def __init__(self, qemu_user: str, allow: list[str] | tuple[str, ...] = (),
                 resolv_conf: Path = Path("/etc/resolv.conf"), nft: str | None = None):
        self.qemu_user = qemu_user
        self.allowed = tuple(Allowed.parse(entry) for entry in allow)
        self.resolv_conf = resolv_conf
        self.nft = nft or shutil.which("nft") or ""
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, config) -> "EgressGuard":
        return cls(config.share_user, config.egress_allow)

    def ruleset(self) -> Ruleset:
        try:
            uid = pwd.getpwnam(self.qemu_user).pw_uid
        except KeyError:
            raise EgressGuardError(f"QEMU's user {self.qemu_user!r} (VMD_SHARE_USER) does not exist on this host: "
                                   f"install libvirt-daemon-system, which creates it") from None
        if uid == 0:
            raise EgressGuardError("QEMU runs as root (VMD_SHARE_USER), so the egress guard cannot tell its "
                                   "connections from vmd's: run QEMU as libvirt-qemu")
        return Ruleset(uid, self.allowed, tuple(host_dns_servers(self.resolv_conf)))

    def _run(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        if not self.nft:
            raise EgressGuardError("nftables is not installed, so vmd cannot keep an approved guest off the "
                                   "host's loopback and networks: install it (apt-get install nftables) and "
                                   "restart vmd")
        try:
            return subprocess.run([self.nft, *args], input=stdin, capture_output=True, text=True,
                                  timeout=NFT_TIMEOUT_S, env=clean_env())
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise EgressGuardError(f"nft did not run ({exc}); the egress guard is not installed") from None

    def install(self) -> str:
        """Put the table in place, replacing an older one in the same transaction."""
        rules = self.ruleset()
        script = f"table inet {TABLE}\ndelete table inet {TABLE}\n" + rules.render()
        with self._lock:
            done = self._run("-f", "-", stdin=script)
        if done.returncode != 0:
            hint = ("vmd needs CAP_NET_ADMIN for it (in a container: cap_add NET_ADMIN)"
                    if "Operation not permitted" in done.stderr else "see nft's message")
            raise EgressGuardError(f"nft refused the egress guard ({' '.join(done.stderr.split())[:300]}): {hint}")
        return rules.digest()

    def installed_digest(self) -> str | None:
        done = self._run("-j", "list", "table", "inet", TABLE)
        if done.returncode != 0:
            return None
        try:
            items = json.loads(done.stdout).get("nftables", [])
        except ValueError:
            return None
        for item in items:
            comment = (item.get("rule") or {}).get("comment") or ""
            if comment.startswith(MARK + " "):
                return comment[len(MARK) + 1:]
        return None

    def problem(self) -> str | None:
        """None when the table in force is the one this configuration asks for; else why not."""
        try:
            expected = self.ruleset().digest()
            found = self.installed_digest()
        except EgressGuardError as exc:
            return str(exc)
        if found is None:
            return ("the egress guard (nftables table inet vmagent_egress) is not installed: restart vmd, "
                    "or run vmd guard install")
        if found != expected:
            return ("the egress guard in force is not this configuration's (the allow-list, the host's "
                    "resolvers or QEMU's user changed): run vmd guard install")
        return None

    def require(self) -> None:
        """Raise unless the guard holds; a stale or missing one is installed first (vmd is root)."""
        if self.problem() is None:
            return
        self.install()
        problem = self.problem()
        if problem:
            raise EgressGuardError(problem)

    def probe(self) -> str | None:
        """Try it: a process running as QEMU's user connects to a listener on this host's
        loopback. None when that is refused (and vmd's own connection is not); else why."""
        try:
            user = pwd.getpwnam(self.qemu_user)
        except KeyError:
            return f"QEMU's user {self.qemu_user!r} does not exist"
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", 0))
            listener.listen(4)
            port = listener.getsockname()[1]
            read, write = os.pipe()
            # Load the codec a connect() needs now: the child, as QEMU's user, may not be
            # able to read the import path to load it.
            "127.0.0.1".encode("idna")
            pid = os.fork()
            if pid == 0:  # the child: become QEMU's user and try the host's loopback
                code = 2  # could not become QEMU's user
                try:
                    os.close(read)
                    os.setgroups([])
                    os.setgid(user.pw_gid)
                    os.setuid(user.pw_uid)
                    try:
                        with socket.create_connection(("127.0.0.1", port), timeout=5):
                            code = 1
                    except OSError:
                        code = 0
                except OSError:
                    pass
                finally:
                    os.write(write, bytes([code]))
                    os._exit(0)
            os.close(write)
            try:
                verdict = os.read(read, 1)
            finally:
                os.close(read)
                os.waitpid(pid, 0)
        if verdict == b"\x00":
            return None
        if verdict == b"\x01":
            return (f"a process running as {self.qemu_user} reached a listener on this host's 127.0.0.1: "
                    f"approved egress would reach the host")
        return "the probe could not run as QEMU's user"
