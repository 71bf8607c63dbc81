"""Where a project lives: vmd's own repository of it, keyed by owner and project under the
state dir, and its place on Gitea when `gitea_url` and `gitea_token` are set, by the owner
mapping's plan (vmd/projects/owners.py). A value, made once for a session's publication
(`remote_for`, from vmd's configuration); the I/O through it is vmd/projects/publish.py's.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, SecretStr, field_validator

from vmd.contract.bounds import name_problem
from vmd.projects.owners import GiteaPlace, OwnerPolicy, plan_place
from vmd.projects.repository import Repository, repository_path


class Remote(BaseModel):
    """Where a project lives: vmd's repository under `state_dir`, and Gitea when
    `gitea_url` and `gitea_token` are set."""

    model_config = ConfigDict(extra="forbid")

    owner: str = ""  # the person; empty: LOCAL_OWNER in vmd's repositories
    project: str
    # How the owner maps to a Gitea owner (vmd/projects/owners.py). vmd passes its configured
    # policy (`remote_for`); a Remote made by hand treats the owner as the Gitea owner itself
    # (an empty one as the token's user).
    people: OwnerPolicy = OwnerPolicy(mode="user")
    description: str = ""
    gitea_url: str | None = None
    gitea_token: SecretStr | None = None
    state_dir: Path
    # A push of a large project over a slow link is the longest git call here.
    git_timeout_s: float = 300.0
    # The group given read access to vmd's repository folders (VmdConfig.repos_group); None: none.
    repos_gid: int | None = None
    # API calls: tries in all and the first backoff; see GiteaClient.
    gitea_retries: int = 4
    gitea_backoff_s: float = 0.5

    @field_validator("owner", "project")
    @classmethod
    def _safe_name(cls, value: str, info) -> str:
        if value == "" and info.field_name == "owner":
            return value
        problem = name_problem(info.field_name, value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("gitea_url")
    @classmethod
    def _plain_url(cls, value: str | None) -> str | None:
        if not value:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"gitea_url {value!r} must be an http:// or https:// URL")
        if parts.username or parts.password:
            raise ValueError("gitea_url must not carry credentials; put the token in gitea_token")
        return value.rstrip("/")

    @property
    def uses_gitea(self) -> bool:
        return bool(self.gitea_url and self.gitea_token and self.gitea_token.get_secret_value())

    @property
    def repo_path(self) -> Path:
        return repository_path(self.state_dir, self.owner, self.project)

    def repository(self) -> Repository:
        return Repository(self.repo_path, timeout_s=self.git_timeout_s, readers_gid=self.repos_gid)

    def token(self) -> str:
        return self.gitea_token.get_secret_value() if self.gitea_token else ""

    def auth(self) -> dict[str, str]:
        """Git config for the one process that talks to Gitea: the token as a header,
        scoped to Gitea's URL, and no redirects followed. git applies the header to every
        request of the process, so after a redirect to another host it would go there too;
        vmd asks the API for the repository's current name instead (`place`)."""
        if not self.uses_gitea:
            return {}
        return {f"http.{self.gitea_url}/.extraHeader": f"Authorization: token {self.token()}",
                "http.followRedirects": "false"}

    def place(self) -> GiteaPlace:
        """Where the project goes on Gitea, by the policy alone (no network)."""
        return plan_place(self.people, self.owner, self.project)


def remote_for(config, owner: str, project: str, description: str = "") -> Remote:
    """The Remote of `owner`'s `project` under vmd's configuration (`VmdConfig`): vmd's
    repository keyed by owner and project, Gitea's place by the configured owner mapping."""
    token = config.gitea_token.get_secret_value()
    return Remote(owner=owner, project=project, description=description[:250],
                  gitea_url=config.gitea_url or None,
                  gitea_token=config.gitea_token if token else None,
                  state_dir=config.state_dir, people=OwnerPolicy.from_config(config),
                  repos_gid=group_id(config.repos_group))


def group_id(group: str) -> int | None:
    """A group name or number as a gid; None for none. An unknown name is a setting to fix,
    said when the first repository is written."""
    if not group:
        return None
    if group.isdigit():
        return int(group)
    import grp
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise ValueError(f"VMD_REPOS_GROUP names the group {group!r}, which this host does not have: "
                         "give a group name that exists or a numeric gid.") from None
