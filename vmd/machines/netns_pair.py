"""Two connected TCP sockets in a network namespace of their own: smbd's end of an SMB
connection (smb_share.SmbRelay), reachable by nobody else on the host."""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct
import threading

_CLONE_NEWNET = 0x40000000  # <sched.h>
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1  # <linux/sockios.h>, <net/if.h>
_IFREQ = "16sH14x"  # struct ifreq: the name, then ifr_flags in the union


def private_tcp_pair() -> tuple[socket.socket, socket.socket]:
    """Two connected TCP sockets that no one else can reach: made in a network namespace
    of their own, which holds nothing else. smbd serves only an IP connection (on a Unix
    socket pair it stopped: `get_remote_hostname failed - Invalid argument`), and a pair
    made on the host's loopback would need a listener there, which every guest's forwards
    and every local user can reach while it waits. The namespace is a thread's own
    (unshare affects the calling thread only); the sockets keep working from any thread."""
    made: dict = {}

    def make() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.unshare(_CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"unshare(CLONE_NEWNET): {os.strerror(err)}")
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                flags = struct.unpack(_IFREQ, fcntl.ioctl(s, _SIOCGIFFLAGS, struct.pack(_IFREQ, b"lo", 0)))[1]
                fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack(_IFREQ, b"lo", flags | _IFF_UP))
            with socket.socket() as listener:
                listener.bind(("127.0.0.1", 0))
                listener.listen(1)
                ours = socket.create_connection(listener.getsockname(), timeout=10)
                theirs, _ = listener.accept()
            ours.settimeout(None)
            made["pair"] = (ours, theirs)
        except OSError as exc:
            made["error"] = exc

    thread = threading.Thread(target=make, name="smb-netns")
    thread.start()
    thread.join()
    if "error" in made:
        raise made["error"]
    return made["pair"]
