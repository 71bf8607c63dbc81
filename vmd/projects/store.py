"""The project store, what a session reaches its project through: restored into its folder
at open (`ProjectStore.prepare`), and on its way out one `Publication`: the project's
`Remote` resolved once from vmd's configuration (vmd's repository, Gitea's place by the
owner mapping), then commit, then push, each through vmd/projects/publish.py. The history
lives in vmd's own repository, built from the folder's bytes (never from a git work tree in
the guest's folder)."""

from __future__ import annotations

from pathlib import Path

from vmd.config import VmdConfig
from vmd.contract.verdict import Verdict
from vmd.projects.publish import changed_files, commit_project, prepare_project, push_project
from vmd.projects.remote import Remote, remote_for
from vmd.projects.repository import Repository
from vmd.projects.tree import Limits, share_owner

# Gitea's commit status of a checkpoint: pushed before any check ran.
CHECKPOINT_STATUS = "checkpoint: not yet verified by vmd"


class ProjectStore:
    """Where a session's project comes from and goes: vmd's configuration, read for each
    project once (`publication`)."""

    def __init__(self, config: VmdConfig):
        self.config = config

    def prepare(self, project_dir: Path, owner: str, project: str, description: str) -> dict:
        """The project's history checked out into `project_dir` (at open). -> {text, base_commit, branch}"""
        prepared = prepare_project(project_dir, remote_for(self.config, owner, project, description),
                                   share_owner=share_owner(self.config.share_user))
        return prepared.model_dump()

    def publication(self, owner: str, project: str, description: str = "") -> "Publication":
        """`owner`'s `project` on its way out: where it lives on Gitea is the service's
        organisation or the person's mapped Gitea user (vmd/projects/owners.py); vmd's own
        repository keeps owner/project."""
        return Publication(self.config, remote_for(self.config, owner, project, description))


class Publication:
    """One project's way out of its folder, with its `Remote` resolved once: a close commits
    and then pushes through one of these, a checkpoint or a git_commit likewise, and the
    reads between (the files changed, whether two commits hold the same tree) ask the same
    repository."""

    def __init__(self, config: VmdConfig, remote: Remote):
        self.config = config
        self.remote = remote

    @property
    def uses_gitea(self) -> bool:
        return self.remote.uses_gitea

    def repository(self) -> Repository:
        return self.remote.repository()

    def commit(self, project_dir: Path, message: str, allow_empty: bool = False) -> dict:
        """What the folder holds, committed into vmd's repository. -> {sha, new, left_out}"""
        limits = Limits(max_file_bytes=int(self.config.commit_max_file_mib * 1024 * 1024),
                        max_total_bytes=int(self.config.commit_max_total_mib * 1024 * 1024))
        return commit_project(project_dir, self.remote, message, limits, allow_empty=allow_empty).model_dump()

    def last_commit(self) -> str | None:
        """The head of vmd's repository for the project: what stays committed when a
        commit now fails."""
        return self.repository().head()

    def changed_files(self, base: str | None) -> list[str]:
        return changed_files(self.remote, base)

    def same_tree(self, a: str, b: str) -> bool:
        return self.repository().same_tree(a, b)

    def reword_head(self, message: str) -> str:
        return self.repository().reword_head(message)

    def push(self, branch: str, outcome: dict | None, changed_after: str | None = None) -> dict:
        """vmd's branch pushed, with the verdict on the check as Gitea's commit status.
        `changed_after`: the verified commit, when the folder changed after it; the head
        pushed is then not verified, and its status says so."""
        verdict = Verdict.of_outcome(outcome)
        if changed_after:
            status, text = "pending", (f"vmd: not verified: the files changed after the verified commit "
                                       f"{changed_after[:10]}")
        elif outcome is None:
            status, text = "pending", "vmd did not verify this commit: the session did not finish"
        else:
            # Gitea's commit status: success only for a check that needs the work.
            status = {"passed": "success", "passed_not_proven": "warning"}.get(verdict.status, "failure")
            text = (f"vmd: {verdict.label()}: `{outcome['command']}` exited {outcome['exit_code']} "
                    f"(expected {outcome['expect_exit']})")
        return self._push(branch, status, text)

    def push_checkpoint(self, branch: str) -> dict:
        """A task's checkpoint pushed as soon as it is made, so that another host's vmd can
        open the project at it when this one is lost; its status stays pending: nothing
        has been verified yet."""
        return self._push(branch, "pending", CHECKPOINT_STATUS)

    def _push(self, branch: str, status: str, text: str) -> dict:
        result = push_project(self.remote, branch=branch or "main", status=status,
                              status_description=text[:140]).model_dump()
        web = self.config.gitea_web_url.rstrip("/")
        if web and result.get("web_url") and self.config.gitea_url:
            result["web_url"] = result["web_url"].replace(self.config.gitea_url.rstrip("/"), web, 1)
        return result
