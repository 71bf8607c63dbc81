"""The environment of every program vmd starts on the host.

vmd runs as root next to secrets (the Gitea token) and starts git, qemu-img and image
builds. A child inherits nothing by default: only an allow-list (PATH, the locale), a
private empty HOME (so no `~/.gitconfig` or other dotfile of root's is read), and git's
system and global config switched off. What a child needs beyond that (the token for one
push, an image build's mirror) is handed to that child alone by its caller.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

_ALLOWED = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR")
_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_home: Path | None = None


def private_home() -> Path:
    """An empty folder only vmd's user can read, made once per process."""
    global _home
    if _home is None or not _home.is_dir():
        _home = Path(tempfile.mkdtemp(prefix="vmd-home-"))
        os.chmod(_home, 0o700)
    return _home


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    # Not a setting read: the child gets the host's own PATH and locale, as any program
    # started from this one would; vmd's settings come from vmd/config/.
    env = {k: os.environ[k] for k in _ALLOWED if k in os.environ}
    env.setdefault("PATH", _DEFAULT_PATH)
    env.setdefault("LANG", "C.UTF-8")
    env.update({
        "HOME": str(private_home()),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ASKPASS": "true",  # never a configured askpass program
        "SSH_ASKPASS": "true",
    })
    env.update(extra or {})
    return env
