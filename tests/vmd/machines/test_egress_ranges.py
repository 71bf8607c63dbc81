"""Every special-purpose range of IANA's IPv4 and IPv6 registries against the egress guard's
sets (vmd/machines/egress_guard.py): each range that is not globally reachable is refused,
and so is every blocked IPv4 range spelled inside NAT64's well-known prefix or 6to4; on this
host the installed nftables table holds the same elements.

The registries as of 2026 (iana.org/assignments/iana-ipv4-special-registry and
iana-ipv6-special-registry): range, name, globally reachable. The documentation ranges are
open on purpose (no one routes them; the tests' stand-in internet lives in them)."""

from __future__ import annotations

import ipaddress
import shutil
import subprocess

import pytest

from vmd.machines.egress_guard import BLOCKED_V4, BLOCKED_V6, TABLE, EgressGuard

IPV4_SPECIAL = [
    ("0.0.0.0/8", "this network", False), ("0.0.0.0/32", "this host on this network", False),
    ("10.0.0.0/8", "private-use", False), ("100.64.0.0/10", "shared address space", False),
    ("127.0.0.0/8", "loopback", False), ("169.254.0.0/16", "link local", False),
    ("172.16.0.0/12", "private-use", False), ("192.0.0.0/24", "IETF protocol assignments", False),
    ("192.0.0.0/29", "IPv4 service continuity prefix", False), ("192.0.0.8/32", "IPv4 dummy address", False),
    ("192.0.0.170/32", "NAT64/DNS64 discovery", False), ("192.0.0.171/32", "NAT64/DNS64 discovery", False),
    ("192.0.2.0/24", "documentation (TEST-NET-1)", None), ("192.31.196.0/24", "AS112-v4", True),
    ("192.52.193.0/24", "AMT", True), ("192.88.99.0/24", "deprecated 6to4 relay anycast", True),
    ("192.168.0.0/16", "private-use", False), ("192.175.48.0/24", "direct delegation AS112 service", True),
    ("198.18.0.0/15", "benchmarking", False), ("198.51.100.0/24", "documentation (TEST-NET-2)", None),
    ("203.0.113.0/24", "documentation (TEST-NET-3)", None), ("240.0.0.0/4", "reserved", False),
    ("255.255.255.255/32", "limited broadcast", False),
]
IPV6_SPECIAL = [
    ("::1/128", "loopback", False), ("::/128", "unspecified", False),
    ("::ffff:0:0/96", "IPv4-mapped", False), ("64:ff9b:1::/48", "local-use IPv4/IPv6 translation", False),
    ("100::/64", "discard-only", False), ("100:0:0:1::/64", "dummy IPv6 prefix", False),
    ("2001::/32", "TEREDO", False), ("2001:2::/48", "benchmarking", False),
    ("2001:1::1/128", "port control protocol anycast", True), ("2001:1::2/128", "TURN anycast", True),
    ("2001:3::/32", "AMT", True), ("2001:4:112::/48", "AS112-v6", True),
    ("2001:20::/28", "ORCHIDv2", True), ("2001:30::/28", "drone remote ID", True),
    ("2001:db8::/32", "documentation", None), ("3fff::/20", "documentation", None),
    ("2620:4f:8000::/48", "direct delegation AS112 service", True),
    ("5f00::/16", "segment routing SIDs", False), ("fc00::/7", "unique-local", False),
    ("fe80::/10", "link-local unicast", False),
    # Not in the registry, refused all the same: multicast, and deprecated site-local.
    ("ff00::/8", "multicast", False), ("fec0::/10", "site-local", False),
]
V4 = [ipaddress.ip_network(n) for n in BLOCKED_V4]
V6 = [ipaddress.ip_network(n) for n in BLOCKED_V6]


def _blocked(network: str) -> bool:
    net = ipaddress.ip_network(network)
    return any(net.subnet_of(b) for b in (V4 if net.version == 4 else V6))


def _reachable(network: str) -> bool:
    net = ipaddress.ip_network(network)
    return not any(net.overlaps(b) for b in (V4 if net.version == 4 else V6))


@pytest.mark.parametrize("network, name, global_", IPV4_SPECIAL + IPV6_SPECIAL,
                         ids=[f"{n} {name}" for n, name, _ in IPV4_SPECIAL + IPV6_SPECIAL])
def test_each_special_purpose_range(network, name, global_):
    if global_ is False:
        assert _blocked(network), f"{network} ({name}) is not globally reachable and must be refused"
    else:  # globally reachable, or documentation: the guest may reach it
        assert _reachable(network), f"{network} ({name}) is refused, though a guest may reach it"


def _nat64(v4: str) -> str:
    return str(ipaddress.IPv6Address(int(ipaddress.IPv6Address("64:ff9b::")) | int(ipaddress.IPv4Address(v4))))


def _6to4(v4: str) -> str:
    return str(ipaddress.IPv6Address((0x2002 << 112) | (int(ipaddress.IPv4Address(v4)) << 80) | 1))


@pytest.mark.parametrize("v4", ["127.0.0.1", "10.0.2.2", "169.254.169.254", "192.168.1.1", "172.17.0.1",
                                "100.64.0.1", "0.0.0.0", "224.0.0.1", "255.255.255.255", "198.18.0.1"])
def test_a_blocked_ipv4_address_inside_nat64_or_6to4_is_refused(v4):
    assert _blocked(f"{_nat64(v4)}/128") and _blocked(f"{_6to4(v4)}/128")


@pytest.mark.parametrize("v4", ["8.8.8.8", "1.1.1.1", "203.0.113.2", "151.101.1.1"])
def test_a_public_ipv4_address_inside_nat64_or_6to4_stays_reachable(v4):
    assert _reachable(f"{_nat64(v4)}/128") and _reachable(f"{_6to4(v4)}/128")


@pytest.mark.skipif(shutil.which("nft") is None, reason="nftables is not installed (setup.sh installs it)")
def test_the_installed_table_holds_the_embedded_ranges():
    EgressGuard("libvirt-qemu").install()
    for address, blocked in ((_nat64("127.0.0.1"), True), (_6to4("10.1.2.3"), True),
                             (_nat64("8.8.8.8"), False), ("fec0::1", True)):
        found = subprocess.run(["nft", "get", "element", "inet", TABLE, "blocked_v6", "{", address, "}"],
                               capture_output=True, text=True)
        assert (found.returncode == 0) == blocked, (address, found.stdout, found.stderr)
