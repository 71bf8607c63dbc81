"""vmd's own git repository of a project: the history that counts.

It is a bare repository at `repository_path(state_dir, owner, project)`, under
vmd's state dir, which no guest can reach; its config is the one `git init` wrote. A
commit is built from bytes vmd read itself (vmd/projects/tree.py) and written with
`git fast-import`: no git command ever runs with the guest's folder as its work tree or
reads anything the guest wrote as configuration (hooks, filters, fsmonitor, remotes,
`.git` files, alternates). Pushes go from here to a URL vmd builds.

Every git call gets an allow-listed environment (vmd/host_env.py) plus config given on
the command line's environment (`GIT_CONFIG_COUNT`, invisible in the process list) that
switches off what could run a program.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from vmd.contract.bounds import LOCAL_OWNER, name_problem
from vmd.host_env import clean_env
from vmd.private_fs import private_dir
from vmd.projects.tree import Walk, read_file

BRANCH = "main"
PENDING_REF = "refs/vmd/pending"

# Config for every git call here: nothing runs a program, nothing asks for credentials.
_SAFE_CONFIG = {
    "core.hooksPath": os.devnull,
    "core.fsmonitor": "false",
    "core.sshCommand": "false",
    "commit.gpgSign": "false",
    "credential.helper": "",
    "protocol.allow": "never",
    "protocol.https.allow": "always",
    "protocol.http.allow": "always",
    "protocol.file.allow": "always",
    "diff.external": "",
    "core.symlinks": "true",
    "safe.directory": "*",
}


def repository_path(state_dir, owner: str, project: str) -> Path:
    """vmd's own bare repository of a project, `<state_dir>/repos/<owner>/<project>.git`.
    vmd commits into it from bytes it reads itself; the guest never reaches it; the job
    service reads its history only through vmd (the `history` verb, vmd/session/handlers/history_verbs.py).
    Raises ValueError for a name that breaks the rule (vmd/contract/bounds.py name_problem)."""
    owner = owner or LOCAL_OWNER
    for what, value in (("owner", owner), ("project", project)):
        problem = name_problem(what, value)
        if problem:
            raise ValueError(problem)
    return Path(state_dir) / "repos" / owner / f"{project}.git"


class RepositoryError(Exception):
    """A git operation on vmd's repository failed; the message is a sentence."""


@dataclass
class Identity:
    name: str = "vmagent"
    email: str = "vmagent@localhost"


def git_env(config: dict[str, str] | None = None, extra: dict[str, str] | None = None) -> dict[str, str]:
    settings = {**_SAFE_CONFIG, **(config or {})}
    env = clean_env(extra)
    env["GIT_CONFIG_COUNT"] = str(len(settings))
    for i, (key, value) in enumerate(settings.items()):
        env[f"GIT_CONFIG_KEY_{i}"] = key
        env[f"GIT_CONFIG_VALUE_{i}"] = value
    return env


class Repository:
    def __init__(self, path: Path, timeout_s: float = 300.0, readers_gid: int | None = None):
        self.path = Path(path)
        self.timeout_s = timeout_s
        # A group that may read the owner's repositories (the job service's, for /ask).
        self.readers_gid = readers_gid

    # --- plumbing -------------------------------------------------------------------

    def git(self, *args: str, check: bool = True, config: dict[str, str] | None = None,
            extra_env: dict[str, str] | None = None, input: bytes | None = None,
            secret: str = "") -> subprocess.CompletedProcess:
        env = git_env(config, {**(extra_env or {}), "GIT_DIR": str(self.path)})
        try:
            result = subprocess.run(["git", *args], cwd=self.path, env=env, capture_output=True,
                                    input=input, timeout=self.timeout_s,
                                    stdin=None if input is not None else subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise RepositoryError(f"git {args[0]} did not finish within {self.timeout_s:.0f} s; check "
                                  "the network to the remote and the size of the project.") from None
        if check and result.returncode != 0:
            raise RepositoryError(f"git {args[0]} failed: {tail(result, secret)}")
        return result

    def exists(self) -> bool:
        return (self.path / "HEAD").is_file()

    def ensure(self) -> None:
        """The bare repository, made when missing, with its modes: vmd's alone (folders
        0700, files 0600), or also its readers' group (0750/0640, that group, never other
        users). Set on every use, so that a changed setting reaches repositories made
        before it; git keeps the modes on what it writes later (core.sharedRepository)."""
        gid = self.readers_gid
        for folder in (self.path.parent.parent, self.path.parent):  # repos/, repos/<owner>/
            private_dir(folder)
            if gid is not None:
                os.chown(folder, -1, gid)
                os.chmod(folder, 0o750)
        if not self.exists():
            tmp = Path(tempfile.mkdtemp(prefix=".init-", dir=self.path.parent))
            subprocess.run(["git", "init", "-q", "--bare", "-b", BRANCH, str(tmp)], check=True,
                           env=git_env(), capture_output=True, timeout=60)
            # Sample hooks are never run (hooksPath is off) but need not sit there either.
            shutil.rmtree(tmp / "hooks", ignore_errors=True)
            os.replace(tmp, self.path)
        self._keep_modes(gid)

    def _keep_modes(self, gid: int | None) -> None:
        """core.sharedRepository set to the file mode (0600, or 0640 for the readers' group):
        git then gives every file it writes that mode (read-only objects 0400/0440) and
        every folder 0700 (0750 with the setgid bit, so new entries take the group), whatever
        the umask. What is there already is given the same once, when the setting changes."""
        wanted = "0640" if gid is not None else "0600"
        seen = self.git("config", "--get", "core.sharedRepository", check=False).stdout.decode().strip()
        if seen == wanted:
            return
        self.git("config", "core.sharedRepository", wanted)
        dir_mode = 0o2750 if gid is not None else 0o700
        file_mode = 0o640 if gid is not None else 0o600
        for top, dirs, files in os.walk(self.path):
            for name in [top, *(os.path.join(top, f) for f in files)]:
                st = os.lstat(name)
                if stat.S_ISLNK(st.st_mode):
                    continue
                if gid is not None:
                    os.chown(name, -1, gid)
                if stat.S_ISDIR(st.st_mode):
                    os.chmod(name, dir_mode)
                else:  # git's own read-only files (objects, packs) stay read-only
                    os.chmod(name, file_mode if st.st_mode & stat.S_IWUSR else file_mode & ~0o222)

    def resolve(self, ref: str) -> str | None:
        result = self.git("rev-parse", "--verify", "-q", f"{ref}^{{commit}}", check=False)
        return result.stdout.decode().strip() or None if result.returncode == 0 else None

    def head(self) -> str | None:
        return self.resolve(f"refs/heads/{BRANCH}") if self.exists() else None

    def count(self, ref: str = f"refs/heads/{BRANCH}") -> int:
        result = self.git("rev-list", "--count", ref, check=False)
        return int(result.stdout.decode().strip()) if result.returncode == 0 else 0

    def is_ancestor(self, older: str, newer: str) -> bool:
        return self.git("merge-base", "--is-ancestor", older, newer, check=False).returncode == 0

    def set_branch(self, sha: str, old: str | None = None) -> None:
        args = ["update-ref", f"refs/heads/{BRANCH}", sha]
        if old:
            args.append(old)
        self.git(*args)

    # --- committing -----------------------------------------------------------------

    def commit(self, tree: Walk, message: str, identity: Identity | None = None,
               allow_empty: bool = False) -> tuple[str | None, bool]:
        """Commit exactly what `tree` holds on top of the branch. Returns (sha of the
        branch afterwards, whether a new commit was made). An unchanged tree makes no
        commit unless `allow_empty` (the close commit carries the verification even when
        the last checkpoint holds the same files); an empty tree on an empty branch never
        does: (None, False)."""
        self.ensure()
        parent = self.head()
        if parent is None and not tree.entries:
            return None, False
        who = identity or Identity()
        stamp = f"{_clean_ident(who.name)} <{_clean_ident(who.email)}> {int(time.time())} +0000"
        body = (message or "vmagent session").encode("utf-8", "replace")
        errors = tempfile.TemporaryFile()  # a file, so that a chatty stderr never blocks the writer
        proc = subprocess.Popen(
            ["git", "fast-import", "--quiet", "--done", "--force"], cwd=self.path,
            env=git_env(extra={"GIT_DIR": str(self.path)}), stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=errors)
        assert proc.stdin is not None
        try:
            w = proc.stdin.write
            w(f"reset {PENDING_REF}\ncommit {PENDING_REF}\nauthor {stamp}\ncommitter {stamp}\n".encode())
            w(b"data %d\n" % len(body) + body + b"\n")
            if parent:
                w(f"from {parent}\n".encode())
            w(b"deleteall\n")
            for entry in tree.entries:
                if entry.kind == "link":
                    w(b"M 120000 inline " + quote_path(entry.path) + b"\n")
                    w(b"data %d\n" % len(entry.target) + entry.target + b"\n")
                else:
                    mode = b"100755" if entry.executable else b"100644"
                    w(b"M " + mode + b" inline " + quote_path(entry.path) + b"\n")
                    w(b"data %d\n" % entry.size)
                    for chunk in read_file(entry):
                        w(chunk)
                    w(b"\n")
            w(b"\ndone\n")
            proc.stdin.close()
        except BrokenPipeError:
            pass  # fast-import stopped early; its exit code and stderr say why
        except Exception as exc:
            proc.kill()
            proc.wait()
            errors.close()
            raise RepositoryError(f"reading the project folder for the commit failed: "
                                  f"{type(exc).__name__}: {exc}") from None
        try:
            proc.wait(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise RepositoryError(f"git fast-import did not finish within {self.timeout_s:.0f} s.") from None
        finally:
            errors.seek(0)
            err = errors.read()[-4000:]
            errors.close()
        if proc.returncode != 0:
            self._clean_failed_import()
            # Its crash-report line names a file just removed: the cause is the rest.
            said = [line for line in err.decode(errors="replace").strip().splitlines()
                    if "dumping crash report" not in line]
            raise RepositoryError(f"git fast-import failed: {' '.join(said)[-600:]}")
        pending = self.resolve(PENDING_REF)
        assert pending
        try:
            if parent and not allow_empty and self._tree(pending) == self._tree(parent):
                return parent, False
            self.set_branch(pending, parent)
            return pending, True
        finally:
            self.git("update-ref", "-d", PENDING_REF, check=False)

    def _clean_failed_import(self) -> None:
        """What a fast-import that died leaves (its crash report, a half-written pack): the
        branch never moved, so nothing refers to them, and on a full disk they hold space."""
        for junk in [*self.path.glob("fast_import_crash_*"), *(self.path / "objects" / "pack").glob("tmp_pack_*")]:
            try:
                junk.unlink()
            except OSError:
                pass

    def _tree(self, sha: str) -> str:
        return self.git("rev-parse", f"{sha}^{{tree}}").stdout.decode().strip()

    def same_tree(self, a: str, b: str) -> bool:
        """Whether two commits hold exactly the same files."""
        return self._tree(a) == self._tree(b)

    def reword_head(self, message: str) -> str:
        """The branch's last commit again with another message (same files, same parent);
        the new sha. For the close's commit, whose words depend on what it holds."""
        head = self.head()
        if head is None:
            raise RepositoryError("the branch has no commit to reword.")
        parents = self.git("rev-list", "--parents", "-n", "1", head).stdout.decode().split()[1:]
        identity = Identity()
        stamp = {"GIT_AUTHOR_NAME": identity.name, "GIT_AUTHOR_EMAIL": identity.email,
                 "GIT_COMMITTER_NAME": identity.name, "GIT_COMMITTER_EMAIL": identity.email}
        args = ["commit-tree", self._tree(head)]
        for parent in parents:
            args += ["-p", parent]
        sha = self.git(*args, extra_env=stamp, input=message.encode("utf-8", "replace")).stdout.decode().strip()
        self.set_branch(sha, head)
        return sha

    # --- reading --------------------------------------------------------------------

    def changed_files(self, base: str | None, head: str | None) -> list[str]:
        """`status path` lines for what changed between two commits (everything when there
        is no base)."""
        if not head:
            return []
        if base:
            result = self.git("-c", "core.quotepath=false", "diff-tree", "-r", "--name-status",
                              "--no-renames", "--no-textconv", "--no-ext-diff", base, head, check=False)
            lines = result.stdout.decode(errors="replace").splitlines()
            return [" ".join(line.split("\t", 1)) for line in lines if line.strip()]
        result = self.git("-c", "core.quotepath=false", "ls-tree", "-r", "--name-only", head, check=False)
        return [f"A {line}" for line in result.stdout.decode(errors="replace").splitlines() if line.strip()]

    def check_out(self, folder: Path) -> None:
        """Write the branch's files into `folder`, which must not exist yet (so no guest
        has written there): a clone of this repository, with the remote that would name
        a host path removed. The guest may use that `.git` as it likes; vmd never reads it."""
        if folder.exists() or folder.is_symlink():
            raise RepositoryError(f"{folder} exists already; vmd checks out only into a new folder.")
        env = git_env(extra={})
        result = subprocess.run(
            ["git", "clone", "-q", "--no-hardlinks", "-b", BRANCH, str(self.path), str(folder)],
            env=env, capture_output=True, timeout=self.timeout_s, stdin=subprocess.DEVNULL)
        if result.returncode != 0:
            raise RepositoryError(f"git clone failed: {tail(result)}")
        subprocess.run(["git", "remote", "remove", "origin"], cwd=folder,
                       env={**env, "GIT_DIR": str(folder / ".git"), "GIT_WORK_TREE": str(folder)},
                       capture_output=True, timeout=60)
        shutil.rmtree(folder / ".git" / "hooks", ignore_errors=True)

    @staticmethod
    def init_work_tree(folder: Path) -> None:
        """A new, empty repository with a work tree at `folder` (which must not exist):
        a new project's folder, with a `.git` the guest may use."""
        if folder.exists() or folder.is_symlink():
            raise RepositoryError(f"{folder} exists already; vmd creates only new folders.")
        result = subprocess.run(["git", "init", "-q", "-b", BRANCH, str(folder)], env=git_env(),
                                capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
        if result.returncode != 0:
            raise RepositoryError(f"git init failed: {tail(result)}")
        shutil.rmtree(folder / ".git" / "hooks", ignore_errors=True)

    # --- remotes --------------------------------------------------------------------

    def fetch(self, url: str, branch: str, auth: dict[str, str] | None = None, secret: str = "") -> str | None:
        """Fetch `branch` of `url` into a private ref; its sha, or None when it has no such
        branch. Raises RepositoryError when the remote cannot be read."""
        self.ensure()
        ref = "refs/vmd/remote"
        self.git("update-ref", "-d", ref, check=False)
        self.git("fetch", "-q", "--no-tags", "--no-write-fetch-head", url, f"+refs/heads/{branch}:{ref}",
                 config=auth, secret=secret)
        return self.resolve(ref)

    def push(self, url: str, branch: str, auth: dict[str, str] | None = None,
             secret: str = "") -> subprocess.CompletedProcess:
        return self.git("push", "-q", "--no-verify", url, f"refs/heads/{BRANCH}:refs/heads/{branch}",
                        config=auth, secret=secret, check=False)


def quote_path(path: bytes) -> bytes:
    """A path in git's C-style quoting, which fast-import reads in every position (and
    needs for names with a newline, a quote or a leading quote)."""
    out = bytearray(b'"')
    for byte in path:
        if byte in (0x22, 0x5C):
            out += b"\\" + bytes([byte])
        elif byte < 0x20 or byte == 0x7F:
            out += b"\\%03o" % byte
        else:
            out.append(byte)
    out += b'"'
    return bytes(out)


def _clean_ident(text: str) -> str:
    return "".join(c for c in text if c not in "<>\n\r\0").strip() or "vmagent"


def tail(result: subprocess.CompletedProcess, secret: str = "") -> str:
    def text(value) -> str:
        return value.decode(errors="replace") if isinstance(value, bytes) else (value or "")
    lines = f"{text(result.stderr)}\n{text(result.stdout)}".splitlines()
    out = " ".join(" ".join(l for l in lines if not l.startswith("hint:")).split())
    if secret:
        out = out.replace(secret, "***")
    return out[-600:] or f"exit code {result.returncode}"
