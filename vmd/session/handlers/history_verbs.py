"""The `history` verb: vmd's own repository of one owner's project, read (log, show, diff),
bounded, for the job service's /ask, so that it never opens vmd's folders itself.

It needs no session and acts on none (POLICY: `session=False`): its handler takes vmd's live
sessions (`Sessions`) for vmd's config alone, and vmd/server/rpc.py answers it on any
connection from the handlers' `SESSIONLESS` table.

Read-only and safe on a repository whatever it holds: the revision is checked by the
contract (vmd/contract/params.py History) and resolved to one commit id before anything else is read;
git runs with vmd's allow-listed environment and safe config (vmd/projects/repository.py
`git_env`: no hooks, no fsmonitor, no external diff), with textconv, external diffs,
signatures, mailmap and replace objects off, no pager, no optional locks (nothing is
written), and paths read literally. Its output is bounded in bytes and time; the messages
and files in it came from the agent and the guest, so the answer is made printable
(vmd/contract/shown_text.py).
"""

from __future__ import annotations

import subprocess
import tempfile
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vmd.contract.bounds import LOCAL_OWNER
from vmd.contract.errors import FAILED, INVALID_PARAMS
from vmd.contract.params import History
from vmd.contract.shown_text import one_line, printable
from vmd.errors import VerbError
from vmd.projects.repository import git_env, repository_path

if TYPE_CHECKING:
    from vmd.session.registry import Sessions

# Read-only git: what a repository's own config or attributes could make git run stays off.
_READ_CONFIG = {"log.showSignature": "false", "log.mailmap": "false", "core.pager": "cat", "color.ui": "false"}
_READ_ENV = {"GIT_OPTIONAL_LOCKS": "0", "GIT_LITERAL_PATHSPECS": "1", "GIT_NO_REPLACE_OBJECTS": "1",
             "GIT_ATTR_NOSYSTEM": "1", "GIT_PAGER": "cat"}
_DIFF_FLAGS = ["--no-textconv", "--no-ext-diff", "--no-color"]
_LOG_FLAGS = [*_DIFF_FLAGS, "--no-show-signature", "--format=medium", "--date=iso"]
# What git may say on stderr that reaches the error sentence.
_STDERR_CHARS = 600


def history(sessions: Sessions, p: History) -> dict:
    config = sessions.config
    owner = p.owner or LOCAL_OWNER
    where = f"{owner}/{p.project}"
    repo = repository_path(config.state_dir, owner, p.project)
    if not (repo / "HEAD").is_file():
        raise VerbError(f"vmd has no project {where}: no session of owner {owner!r} has committed project "
                        f"{p.project!r} on this host. Check the owner and project names.", INVALID_PARAMS)
    git = _Git(repo, config.history_timeout_s)
    commit = git.resolve(p.rev)
    if commit is None:
        if git.resolve("HEAD") is None:
            raise VerbError(f"project {where} has no commits yet: there is no history to read.", INVALID_PARAMS)
        raise VerbError(f"rev {p.rev!r} names no commit of {where}: give a commit id from its log, or a "
                        "branch or tag name (HEAD, main).", INVALID_PARAMS)
    base = git.resolve(p.base) if p.base else None
    if p.base and base is None:
        raise VerbError(f"base {p.base!r} names no commit of {where}: give a commit id from its log, or a "
                        "branch or tag name.", INVALID_PARAMS)
    paths = ["--", p.path] if p.path else []
    cut_commits, commits = False, 1
    if p.what == "log":
        # One id and a newline per commit (40 or 64 hex digits): the count is never cut.
        listed = git.run(["rev-list", f"--max-count={p.max_commits + 1}", commit, *paths], (p.max_commits + 1) * 65)
        commits = min(len(listed.text.split()), p.max_commits)
        cut_commits = len(listed.text.split()) > p.max_commits
        args = ["log", *_LOG_FLAGS, "--stat", *(["--patch"] if p.patch else []), f"--max-count={p.max_commits}",
                commit, *paths]
    elif p.what == "show":
        args = ["show", *_LOG_FLAGS, "--stat", "--patch", commit, *paths]
    elif base:
        args = ["diff", *_DIFF_FLAGS, "--stat", "--patch", base, commit, *paths]
    else:  # what the commit changed (a first commit: against the empty tree)
        args = ["show", *_LOG_FLAGS, "--format=", "--stat", "--patch", commit, *paths]
    out = git.run(args, p.max_bytes)
    notes = []
    if cut_commits:
        notes.append(f"(the log stops at max_commits={p.max_commits} commits; there are older ones: ask with "
                     f"a larger max_commits, or rev= the last commit shown)")
    if out.cut_bytes:
        notes.append(f"(cut at max_bytes={p.max_bytes} bytes of git's output: ask with path= for one file, "
                     "or a larger max_bytes)")
    if out.timed_out:
        notes.append(f"(cut: git did not finish within {config.history_timeout_s:g} s; this is what it wrote "
                     "so far)")
    text = printable(out.text).rstrip("\n")
    if not text:
        text = f"(nothing in {where} at {commit[:12]}" + (f" touches {p.path})" if p.path else ")")
    return {"owner": owner, "project": p.project, "what": p.what, "commit": commit, "commits": commits,
            "cut": bool(notes), "text": "\n".join([text, *notes])}


@dataclass
class _Output:
    text: str
    cut_bytes: bool  # git wrote more than the bound; the rest was not read
    timed_out: bool  # git was stopped at history_timeout_s


class _Git:
    """git on one bare repository, read-only, each command bounded in bytes and seconds."""

    def __init__(self, repo, timeout_s: float):
        self.repo = repo
        self.timeout_s = timeout_s

    def resolve(self, rev: str) -> str | None:
        # --end-of-options: the contract let no option through, and git is told so too.
        out = self.run(["rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}"], 1024,
                       check=False)
        sha = out.text.strip()
        return sha if len(sha) in (40, 64) and all(c in "0123456789abcdef" for c in sha) else None

    def run(self, args: list[str], max_bytes: int, check: bool = True) -> _Output:
        env = git_env(_READ_CONFIG, {**_READ_ENV, "GIT_DIR": str(self.repo)})
        with tempfile.TemporaryFile() as stderr:
            proc = subprocess.Popen(["git", "--no-pager", *args], cwd=self.repo, env=env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=stderr)
            timed_out = threading.Event()

            def kill() -> None:
                timed_out.set()
                proc.kill()

            timer = threading.Timer(self.timeout_s, kill)
            timer.start()
            try:
                data = proc.stdout.read(max_bytes + 1)
            finally:
                timer.cancel()
                cut = len(data) > max_bytes
                if cut:
                    proc.kill()  # the rest is not read: git stops here
                proc.stdout.close()
                code = proc.wait()
            stderr.seek(0)
            said = stderr.read(_STDERR_CHARS * 4).decode("utf-8", errors="replace")
        if check and code != 0 and not cut and not timed_out.is_set():
            raise VerbError(f"git {args[0]} failed on vmd's repository: "
                            f"{one_line(said)[-_STDERR_CHARS:] or f'exit code {code}'}", FAILED)
        return _Output(data[:max_bytes].decode("utf-8", errors="replace"), cut, timed_out.is_set())


# Served without a session: verb -> handler(sessions, params) -> dict (handlers/table.py).
SESSIONLESS = {"history": history}
