"""The project store: a session's project restored, committed and pushed through
vmd/projects/publish.py, whose history lives in vmd's own repository, built from the folder's
bytes (never from a git work tree in the guest's folder)."""

from __future__ import annotations

from pathlib import Path

from vmd.config import VmdConfig
from vmd.contract.verdict import Verdict
from vmd.projects.publish import changed_files, commit_project, prepare_project, push_project, remote_for
from vmd.projects.tree import Limits, share_owner

# Gitea's commit status of a checkpoint: pushed before any check ran.
CHECKPOINT_STATUS = "checkpoint: not yet verified by vmd"


class ProjectStore:
    """Restores, commits and pushes a session's project through vmd/projects/publish.py: the
    history lives in vmd's own repository, built from the folder's bytes."""

    def __init__(self, config: VmdConfig):
        self.config = config

    def remote(self, owner: str, project: str, description: str = ""):
        # Where the person's project lives on Gitea: the service's organisation or their
        # mapped Gitea user (vmd/projects/owners.py); vmd's own repository keeps owner/project.
        return remote_for(self.config, owner, project, description)

    def prepare(self, project_dir: Path, owner: str, project: str, description: str) -> dict:
        """-> {text, base_commit, branch}"""
        prepared = prepare_project(project_dir, self.remote(owner, project, description),
                                   share_owner=share_owner(self.config.share_user))
        return prepared.model_dump()

    def commit(self, project_dir: Path, owner: str, project: str, message: str,
               allow_empty: bool = False) -> dict:
        """-> {sha, new, left_out}"""
        limits = Limits(max_file_bytes=int(self.config.commit_max_file_mib * 1024 * 1024),
                        max_total_bytes=int(self.config.commit_max_total_mib * 1024 * 1024))
        return commit_project(project_dir, self.remote(owner, project), message, limits,
                              allow_empty=allow_empty).model_dump()

    def last_commit(self, owner: str, project: str) -> str | None:
        """The head of vmd's repository for the project: what stays committed when a
        commit now fails."""
        return self.remote(owner, project).repository().head()

    def changed_files(self, owner: str, project: str, base: str | None) -> list[str]:
        return changed_files(self.remote(owner, project), base)

    def same_tree(self, owner: str, project: str, a: str, b: str) -> bool:
        return self.remote(owner, project).repository().same_tree(a, b)

    def reword_head(self, owner: str, project: str, message: str) -> str:
        return self.remote(owner, project).repository().reword_head(message)

    def push(self, owner: str, project: str, description: str, branch: str,
             outcome: dict | None, changed_after: str | None = None) -> dict:
        """`changed_after`: the verified commit, when the folder changed after it; the head
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
        return self._push(owner, project, description, branch, status, text)

    def uses_gitea(self, owner: str, project: str) -> bool:
        return self.remote(owner, project).uses_gitea

    def push_checkpoint(self, owner: str, project: str, description: str, branch: str) -> dict:
        """A task's checkpoint pushed as soon as it is made, so that another host's vmd can
        open the project at it when this one is lost; its status stays pending: nothing
        has been verified yet."""
        return self._push(owner, project, description, branch, "pending", CHECKPOINT_STATUS)

    def _push(self, owner: str, project: str, description: str, branch: str, status: str,
              text: str) -> dict:
        result = push_project(self.remote(owner, project, description), branch=branch or "main",
                              status=status, status_description=text[:140]).model_dump()
        web = self.config.gitea_web_url.rstrip("/")
        if web and result.get("web_url") and self.config.gitea_url:
            result["web_url"] = result["web_url"].replace(self.config.gitea_url.rstrip("/"), web, 1)
        return result
