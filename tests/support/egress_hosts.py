"""Test hosts for the egress tests, all on this machine: a stand-in "internet" web server
in a network namespace of the test's own making, reached over a veth pair.

The stand-in sits at an address of the documentation range TEST-NET-3 (203.0.113.0/24,
RFC 5737): public-shaped, so the egress guard treats it as the internet, and routed
nowhere, so traffic to it can only ever reach the namespace made here. A second namespace
holds a server at a private address (192.168.x, RFC 1918) that the host itself can reach:
the guard, not a missing route, is what keeps a guest from it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass

SERVER = """
import http.server, sys
class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(sys.argv[2].encode())
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer((sys.argv[1], 80), Hello).serve_forever()
"""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@dataclass
class NamespaceHost:
    netns: str
    host_side: str  # the root namespace's address on the veth: one of this host's own
    address: str  # the server's, inside the namespace
    answer: str  # what its web server says


@contextmanager
def namespace_host(tag: str, subnet: str, answer: str):
    """A namespace `vmt-<tag>-<pid>` with a web server at <subnet>.2:80 answering `answer`,
    and <subnet>.1 on this host's end of the veth."""
    netns = f"vmt-{tag}-{os.getpid()}"[:15]
    outer, inner = f"vo{tag}{os.getpid()}"[:15], f"vi{tag}{os.getpid()}"[:15]
    host_side, address = f"{subnet}.1", f"{subnet}.2"
    server = None
    try:
        _ip("netns", "add", netns)
        _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", netns)
        _ip("addr", "add", f"{host_side}/24", "dev", outer)
        _ip("link", "set", outer, "up")
        _ip("-n", netns, "addr", "add", f"{address}/24", "dev", inner)
        _ip("-n", netns, "link", "set", inner, "up")
        _ip("-n", netns, "link", "set", "lo", "up")
        server = subprocess.Popen(["ip", "netns", "exec", netns, sys.executable, "-c", SERVER, address, answer],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            probe = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c",
                                    f"import socket; socket.create_connection(('{address}', 80), 1)"],
                                   capture_output=True)
            if probe.returncode == 0:
                break
            time.sleep(0.2)
        else:
            raise RuntimeError(f"the test host in {netns} did not come up")
        yield NamespaceHost(netns, host_side, address, answer)
    finally:
        if server is not None:
            server.kill()
            server.wait()
        subprocess.run(["ip", "link", "del", outer], capture_output=True)
        subprocess.run(["ip", "netns", "del", netns], capture_output=True)


def host_addresses() -> list[str]:
    """This host's own IPv4 addresses outside loopback (its interfaces, found, not named)."""
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True,
                         text=True).stdout
    return [line.split()[3].split("/")[0] for line in out.splitlines() if len(line.split()) > 3]
