"""Where vmd's smbd runs (vmd/machines/smb_share.py): in a sandbox of its own, as the share's
own uid (vmd/machines/smb_account.py), with the share as the only host folder it can write.

bubblewrap (Debian's `bubblewrap`), run by vmd as root, gives each smbd new network, PID, IPC,
UTS and mount namespaces and no_new_privs; util-linux's setpriv then drops to the share's uid
and gid with no supplementary groups and no capability left (bounding set empty too). What
smbd then sees of the host:

- /usr, read-only (its programs and libraries; /bin, /lib, /sbin are links into it);
- in /etc only what vmd wrote for it (a passwd and group with the share's account, an
  nsswitch.conf that reads them, a hosts file, the configuration) and the host's ld.so.cache,
  all read-only;
- its own state at STATE_IN_JAIL (the share's uid's folder: logs, locks, tdbs) and the share
  at SHARE_IN_JAIL, the only two places it can write;
- a private /tmp, a minimal /dev and a /proc of its own PID namespace: no host process is
  visible or can be signalled;
- a network namespace with a loopback only: no address of the host or the guests, nothing
  to connect to or listen on. Its one connection is the socket it is handed as stdin.

Short paths inside also keep smbd's messaging sockets (`<lock dir>/msg.sock/<pid>`) under a
Unix socket's 107 bytes however deep vmd's state_dir is.
"""

from __future__ import annotations

from pathlib import Path

from vmd.machines.smb_account import SmbAccount

BWRAP = "/usr/bin/bwrap"
SETPRIV = "/usr/bin/setpriv"
SMBD = "/usr/sbin/smbd"
STATE_IN_JAIL = "/smb"
SHARE_IN_JAIL = "/share"
CONF_IN_JAIL = "/etc/vmd-smb.conf"
# The files vmd writes for smbd's /etc (smb_share.prepare_smb_share), by their name there.
ETC_FILES = ("passwd", "group", "nsswitch.conf", "hosts")
NSSWITCH = "passwd: files\ngroup: files\nshadow: files\nhosts: files\n"
HOSTS = "127.0.0.1 localhost\n"
HOSTNAME = "vmd-smb"


def missing_tools() -> list[str]:
    """The programs the sandbox needs that this host lacks (`apt-get install bubblewrap samba`)."""
    return [tool for tool in (BWRAP, SETPRIV, SMBD) if not Path(tool).is_file()]


def jailed_smbd(vmd_folder: Path, state: Path, account: SmbAccount) -> list[str]:
    """The command line that runs smbd in inetd mode (its stdin the connection, no listener)
    in its sandbox: `vmd_folder` holds the configuration and the /etc files vmd wrote,
    `state` is smbd's own folder (the share's uid's), `account` names the share and the uid."""
    etc = []
    for name in ETC_FILES:
        etc += ["--ro-bind", str(vmd_folder / name), f"/etc/{name}"]
    if Path("/etc/ld.so.cache").is_file():
        etc += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    return [
        BWRAP,
        "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
        "--hostname", HOSTNAME,
        "--die-with-parent", "--new-session",
        "--ro-bind", "/usr", "/usr",
        "--symlink", "usr/bin", "/bin", "--symlink", "usr/sbin", "/sbin",
        "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
        "--dir", "/etc", *etc,
        "--ro-bind", str(vmd_folder / "smb.conf"), CONF_IN_JAIL,
        "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--dir", "/run", "--dir", "/var",
        "--bind", str(state), STATE_IN_JAIL,
        "--bind", account.share, SHARE_IN_JAIL,
        "--chdir", "/",
        # Root in the sandbox only long enough for setpriv to become the share's uid.
        "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP",
        "--",
        SETPRIV, f"--reuid={account.uid}", f"--regid={account.gid}", "--clear-groups",
        "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs",
        SMBD, f"--configfile={CONF_IN_JAIL}",
    ]
