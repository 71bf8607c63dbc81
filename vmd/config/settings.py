"""vmd's configuration: an optional TOML file (VMD_CONFIG), then the environment.

Every number a person might tune lives here with the reason for its default, and only
`VmdConfig.load` reads settings from the environment: the rest of vmd is handed a config.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

from vmd.config.egress_allow import Allowed
from vmd.config.gitea_names import DEFAULT_ORG, GiteaOrgName, PersonMap

# Environment variable -> field. The environment wins over the file.
ENV_FIELDS = {
    "VMD_SOCKET": "socket",
    "VMD_STATE_DIR": "state_dir",
    "VMD_IMAGES_DIR": "images_dir",
    "VMD_PROJECTS_DIR": "projects_dir",
    "VMD_LIBVIRT_URI": "libvirt_uri",
    "VMD_DEFAULT_OS": "default_os",
    "VMD_BOOT_TIMEOUT_S": "boot_timeout_s",
    "VMD_VERIFY_TIMEOUT_S": "verify_timeout_s",
    "GITEA_URL": "gitea_url",
    "GITEA_TOKEN": "gitea_token",
    "GITEA_WEB_URL": "gitea_web_url",
    "GITEA_OWNER_MODE": "gitea_owner_mode",
    "GITEA_ORG": "gitea_org",
    "GITEA_USERS": "gitea_users",
    "GITEA_CREATE_USERS": "gitea_create_users",
    "GITEA_PRIVATE": "gitea_private",
    "VMD_SHARE_USER": "share_user",
    "VMD_REPOS_GROUP": "repos_group",
    "VMD_MAX_FAILED_VERIFICATIONS": "max_failed_verifications",
    "VMD_COMMIT_MAX_FILE_MIB": "commit_max_file_mib",
    "VMD_COMMIT_MAX_TOTAL_MIB": "commit_max_total_mib",
    "VMD_ORPHAN_GRACE_S": "orphan_grace_s",
    "VMD_QUESTION_KEEP_S": "question_keep_s",
    "VMD_REAPER_INTERVAL_S": "reaper_interval_s",
    "VMD_PUSH_RETRY_S": "push_retry_s",
    "VMD_PUSH_RETRY_BACKOFF_S": "push_retry_backoff_s",
    "VMD_PUSH_RETRY_BACKOFF_MAX_S": "push_retry_backoff_max_s",
    "VMD_ACCEL": "accel",
    "VMD_WARM_POOL_SIZE": "warm_pool_size",
    "VMD_WARM_PARKED": "warm_parked",
    "VMD_ROOM_TEMPLATES": "room_templates",
    "VMD_ROOM_TEMPLATES_DIR": "room_templates_dir",
    "VMD_ROOM_PARKED": "room_parked",
    "VMD_GUEST_MEMORY_MIB": "guest_memory_mib",
    "VMD_GUEST_VCPUS": "guest_vcpus",
    "VMD_SLOT_READY_S": "slot_ready_s",
    "VMD_SLOT_MAKE_S": "slot_make_s",
    "VMD_OUTPUT_HEAD_BYTES": "output_head_bytes",
    "VMD_OUTPUT_TAIL_BYTES": "output_tail_bytes",
    "VMD_INTERNET_PROBE": "internet_probe",
    "VMD_EGRESS_ALLOW": "egress_allow",
    "VMD_SOCKET_GROUP": "socket_group",
    "GITEA_TOKEN_FILE": "gitea_token_file",
    "OLLAMA_HOST": "ollama_host",
    "VMAGENT_MODEL": "ollama_model",
    "VMAGENT_MODEL_API": "model_api",
    "VMAGENT_MODEL_URL": "model_url",
    "VMAGENT_MODEL_KEY": "model_key",
    "VMAGENT_MODEL_VISION": "model_vision",
}


class VmdConfigError(ValueError):
    """The configuration cannot be used; the message names each setting (its variable when
    the environment gave it) and what is wrong with it."""


class VmdConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    socket: Path = Field(Path("/run/vmd/vmd.sock"), description=(
        "vmd's Unix socket: where vmd listens, and where `vmagent run` and each job's worker connect"))
    state_dir: Path = Field(Path("/var/lib/vmagent/state"), description=(
        "session records, project folders, and vmd's own repository of each project "
        "(`repos/<owner>/<project>.git`); the job service reads none of it: `/jobs/{id}/ask` asks vmd "
        "(`history`)"))
    images_dir: Path = Field(Path("/var/lib/vmagent/images"), description=(
        "built guest images (a cache outside the clone)"))
    projects_dir: Path | None = Field(None, description=(
        "the host folders shared into guests as their project"),
        json_schema_extra={"shown_default": "`<state dir>/projects`"})
    libvirt_uri: str = Field("qemu:///system", description="libvirt connection")
    gitea_url: str = Field("", description=(
        "where `session_close` pushes vmd's repository (Gitea's address as vmd reaches it); unset: the "
        "project lives in vmd's repository only"))
    gitea_token: SecretStr = Field(SecretStr(""), description="Gitea's token for those pushes; a secret")
    gitea_web_url: str = Field("", description=(
        "where people browse the repositories, when it differs from `GITEA_URL` (the API reached inside a"
        " compose network, people using a public name): the links in reports use it"),
        json_schema_extra={"shown_default": "`GITEA_URL`"})
    # vmd/projects/owners.py. A job's owner is an Open WebUI user id or a terminal user's name,
    # rarely a Gitea account: hence "org" unless told otherwise.
    gitea_owner_mode: Literal["org", "user"] = Field("org", description=(
        "where a person's projects go on Gitea: `org`: one organisation of the service (`GITEA_ORG`) "
        "holds every project, named `<person>-<project>` with a topic naming the person, so nobody needs "
        "an account; `user`: the owner is a Gitea user or organisation name (terminal setups whose users "
        "are named like their Gitea logins)"))
    gitea_org: GiteaOrgName = Field(DEFAULT_ORG, description=(
        "the service's organisation in the `org` mode; vmd creates it (private) on the first push when it"
        " is missing. Not `vmagent`: that is the compose setup's admin user, and Gitea users and "
        "organisations share one namespace"))
    gitea_users: PersonMap = Field({}, description=(
        "people with a Gitea account: a person's id to a Gitea username or e-mail, whose projects go "
        "there under the project's own name; a JSON object or `id=name,id=mail@host` (a TOML table in the"
        " file)"))
    # Off: vmd creates no accounts unless told to.
    gitea_create_users: bool = Field(False, description=(
        "create a mapped person's Gitea user (by e-mail) when none has that address; needs a site admin's"
        " token"))
    # A person's work is theirs to publish.
    gitea_private: bool = Field(True, description=(
        "new repositories are private (a project holds whatever a guest wrote); existing ones keep what "
        "their owners chose"))
    default_os: str = Field("debian", description="the guest image a session gets when it names none")
    # Timeouts are given for a KVM host and multiplied by vmd.machines.machine.timeout_scale()
    # (4 without KVM). The Debian guest with its desktop boots in ~10 s with KVM and in
    # 30-40 s under TCG; 150 s (600 s under TCG) leaves room for a loaded host.
    boot_timeout_s: float = Field(default=150, gt=0, description=(
        "how long a guest's boot may take, in KVM seconds (x4 under TCG)"))
    # "auto" asks QEMU (vmd/machines/accel.py); the others force one without asking: for a host
    # whose probe is wrong, or a KVM host made to show how a TCG-only one behaves.
    accel: Literal["auto", "kvm", "qemu", "tcg"] = Field("auto", description=(
        "`auto` probes; `kvm`, or `qemu`/`tcg` (TCG), forces one; any other value is refused at start "
        "with a sentence"))
    # The verification command vmd re-runs at finish: a project's test suite can take
    # minutes; past this (x4 under TCG) it counts as failed (timed out).
    verify_timeout_s: float = Field(default=300, gt=0, description=(
        "how long the check vmd runs again at `finish` may take, in KVM seconds (x4 under TCG); past it "
        "the check failed (timed out)"))
    # Enough for a test runner's summary and the last failure.
    output_tail_chars: int = Field(default=4000, gt=0, description=(
        "characters of the check's output kept as its tail in the outcome and the report"))
    # Output of one `run` returned to the agent and kept in the record is capped by the
    # guest layer; the record keeps this many characters of each stream.
    record_output_chars: int = Field(default=2000, gt=0, description=(
        "characters of each output stream of a command that the session record keeps"))
    # Connections served at once; each holds a thread. Past this a client gets one error
    # line saying so and is closed. An agent or a watcher holds one or two, so 256 is
    # many busy jobs; without a cap, a flood of idle connections grew threads unbounded.
    max_connections: int = Field(default=256, gt=0, description=(
        "connections vmd serves at once (a thread each); past it a client gets one error line and is "
        "closed"))

    # A failed verification is work left: finish is refused and the agent goes on, until
    # this many have failed (models often get their first check wrong; three is plenty to
    # fix a check, and stops a loop that cannot).
    max_failed_verifications: int = Field(default=3, ge=1, description=(
        "failed checks at `finish` before the session may end with its check failed; until then each "
        "failure refuses `finish` and the agent goes on"))
    # QEMU runs as this unprivileged user (libvirt's DAC label on every guest), and the
    # project share stores the guest's owners and modes as metadata on files it owns: a
    # guest's root can then make neither root-owned nor setuid files on the host.
    share_user: str = Field("libvirt-qemu", description=(
        "the unprivileged user QEMU runs as; it owns the project folders on the host (the guest's owners "
        "and modes are xattr metadata)"))
    # vmd's repositories are its own (0700). Naming a group (a name or a gid) gives that
    # group read access to repos/ (the job service no longer needs it: /ask asks vmd's
    # `history` verb; setup.sh --start still names the service's user here):
    # folders 0750, files 0640, kept so by git (core.sharedRepository). Empty: vmd's user
    # only (0700/0600). The guest never reaches repos/ either way.
    repos_group: str = Field("", description=(
        "a group (name or gid) that may read vmd's repositories (folders 0750, files 0640, that group), "
        "for tools of the operator's (the job service no longer needs it: `/ask` asks vmd); empty: vmd's "
        "alone (0700/0600). The rest of vmd's state is 0700/0600 whatever the umask"))
    # One git command of the `history` verb (vmd/session/handlers/history_verbs.py, the job service's /ask):
    # a log of a large project on a slow disk takes seconds; past this the answer is what
    # git wrote so far, cut, and says so.
    history_timeout_s: float = Field(default=20, gt=0, description=(
        "how long one git command of the `history` verb (the job service's `/ask`) may take; past it the "
        "answer is what git wrote so far, cut, and says so"))
    # What one commit takes from the project folder. 100 MiB is where GitHub refuses a
    # file and far past any source file; a larger one (a build output, a disk image) is
    # left out with a note in the report instead of failing the close.
    commit_max_file_mib: float = Field(default=100, gt=0, description=(
        "the largest file one commit takes from the project folder; a larger one is left out with a note "
        "in the report"))
    commit_max_total_mib: float = Field(default=1024, gt=0, description=(
        "what one commit takes from the project folder in all; files past it are left out with a note"))
    # How long the desktop may take after SSH answers, for a KVM host (x4 under TCG, like
    # the timeouts above); it took 5-8 s under TCG here. A desktop that misses it leaves a
    # shell-only machine, not a failed boot.
    desktop_wait_s: float = Field(default=30, gt=0, description=(
        "how long the desktop may take after SSH answers, in KVM seconds (x4 under TCG); one that misses "
        "it leaves a shell-only machine, not a failed boot"))
    # Any public host answering on port 80 will do (another for a host behind a proxy).
    internet_probe: str = Field(default="example.com", min_length=1, description=(
        "the host `check_internet` connects to on port 80"))
    # Approved egress reaches public addresses only (vmd/machines/egress_guard.py): never the host,
    # its networks, or private and link-local ranges. An operator lets guests reach a range
    # here anyway, each with its reason: `CIDR[:PORT]=why` entries, separated by `;` in the
    # variable (a package mirror or a proxy on the LAN). The reason is kept in the rules.
    egress_allow: list[str] = Field(default_factory=list, description=(
        "ranges a guest with approved egress may reach although they are private (a package mirror, a "
        "proxy): `CIDR[:PORT]=reason;…`. Otherwise approved egress reaches public addresses only, never "
        "this host, its networks or private ranges: vmd keeps an nftables table for QEMU's user (`vmd "
        "guard install|check|show`, `vmd doctor`), and refuses egress where it cannot (no nftables, no "
        "`CAP_NET_ADMIN`)"))
    # The record cuts long strings to record_output_chars; the verification's output tail
    # gets this larger budget there, enough for a test runner's summary and a failure.
    record_output_tail_chars: int = Field(default=8000, gt=0, description=(
        "characters of the check's output tail that the session record keeps"))

    # vmd owns the end of every session (vmd/server/lifecycle.py). A session whose clients have
    # all gone is closed by vmd (commit, push, destroy) once none came back for this long.
    # It must outlast the agent's own reconnecting (vmagent's vmd_reconnect_s, 180 s: a
    # worker restarted by the service, a vmd restart) so that vmd never closes a session
    # that is coming back.
    orphan_grace_s: float = Field(default=600, gt=0, description=(
        "a session whose clients have all gone is closed by vmd (commit, push, destroy) once none came "
        "back for this long; it outlasts the agent's `vmd_reconnect_s`"))
    # A session waiting for a person (a question, an unfreeze request) keeps its suspended
    # guest this long, then is closed the same way: people answer after a weekend, but a
    # guest nobody answers for must not hold the host's memory and disk forever.
    question_keep_s: float = Field(default=7 * 24 * 3600, gt=0, description=(
        "a session waiting for a person (a question, an unfreeze request) keeps its suspended guest this "
        "long, then is closed the same way"), json_schema_extra={"shown_default": "`604800` (a week)"})
    # How often vmd looks for such sessions and for guests no session owns. A few seconds
    # is instant next to the grace above and costs a libvirt listing.
    reaper_interval_s: float = Field(default=5, gt=0, description=(
        "how often vmd looks for such sessions and for guests no session owns"))
    # How often the egress guard is asked while a guest has egress (vmd/server/guard_watch.py):
    # the longest a firewall reload leaves such a guest unguarded.
    guard_watch_s: float = Field(default=2, gt=0, description=(
        "how often the egress guard is checked while a guest has egress: the longest a firewall reload "
        "leaves such a guest unguarded"))
    # The most smbd processes one machine's SMB share starts (vmd/machines/smb_share.py): one
    # per SMB connection of the guest. An honest guest reconnects after a restore, a vmd
    # restart or an idle drop, a few dozen times in a long session; a guest that negotiates
    # in a loop gets this many smbd starts on the host, then its share is refused.
    smb_max_starts: int = Field(default=256, ge=1, description=(
        "the most smbd processes one machine's SMB share starts (one per SMB connection of the guest); "
        "past it the share is refused"))
    # A push that fails at close for a reason that may pass (Gitea down, a network error)
    # is retried in the background for this long; the commit is safe in vmd's repository
    # meanwhile. A day covers a Gitea upgrade or a weekend outage; after it the report
    # says the push gave up and the commit waits in vmd's repository.
    push_retry_s: float = Field(default=24 * 3600, gt=0, description=(
        "how long a push that failed at close for a reason that may pass (Gitea down, a network error) is"
        " tried again in the background; the commit waits in vmd's repository meanwhile"),
        json_schema_extra={"shown_default": "`86400` (a day)"})
    # The first wait between push retries, doubled after each failed one up to the cap:
    # quick when Gitea was only restarting, and at most a few minutes late once it is back.
    push_retry_backoff_s: float = Field(default=30, gt=0, description=(
        "the first wait between push retries, doubled after each failed one"))
    push_retry_backoff_max_s: float = Field(default=300, gt=0, description=(
        "the longest wait between push retries"))

    # Warm machines (vmd/machines/warm_pool.py): this many guests of the default image booted ahead
    # and saved, each handed out by a restore in seconds instead of a cold boot. Each
    # costs a boot in the background and its memory image on disk (~the guest's memory).
    # "auto" sizes the pool for the host (vmd/machines/host_room.py host_pool_size: one slot per two
    # cores, within memory, at most 4); 0 turns it off and every session boots cold.
    warm_pool_size: int | Literal["auto"] = Field("auto", description=(
        "guests of the default image booted ahead and saved, each handed out by a restore (~3.6-3.9 s "
        "under TCG to the first command), or, parked (`VMD_WARM_PARKED`), by a resume (0.3-0.6 s), "
        "instead of a cold boot (~30-45 s); the refill runs in the background at low priority and waits "
        "while a session boots cold. Each slot holds its memory image on disk. `session_status` and the "
        "job API say how the machine came (warm or cold, seconds). `auto` sizes it for the host: one slot"
        " per two cores, within a quarter of the memory, at most 4 (1 on a 2-core host); `0` turns it off"
        " and removes an earlier pool's slots"))
    # vmd/machines/parked_slot.py; a parked slot holds memory where a saved one holds only disk.
    warm_parked: int = Field(default=1, ge=0, le=16, description=(
        "how many of the warm pool's slots wait restored, woken and paused: the share mounted, the clock "
        "set, an SSH connection and a command runner open, so that a hand-out is a resume and the project"
        " moved into place (0.3-0.6 s from the request to the first command answered on a 2-core TCG "
        "host, against 3.6-3.9 s for a saved slot's restore and 27-35 s for a cold boot to its desktop: "
        "`bench/machine.py`). Each holds a guest's memory (`VMD_GUEST_MEMORY_MIB`) while it waits and "
        "lives only as long as the vmd that parked it; at most `VMD_WARM_POOL_SIZE`; Linux guests on 9p "
        "only (Windows and SMB guests are restored); `0`: every warm hand-out restores a saved slot"))
    # Clean rooms (vmd/machines/room_templates.py). Two: two sessions of a host finishing at
    # once both get one; a test suite shares one templates folder among its vmds.
    room_templates: int = Field(default=2, ge=0, le=8, description=(
        "how many clean rooms of one image (the finish's check, its baseline, the eval's hidden check: "
        "each on a fresh machine) may run at once restored from a saved template (~3.5 s under TCG) "
        "instead of booting cold (~40 s); each template is made on first use and holds its memory image "
        "on disk; `0`: every room boots cold"))
    room_templates_dir: Path | None = Field(None, description=(
        "where the templates are kept, keyed by the image's build and the guest's settings (old keys are "
        "removed)"), json_schema_extra={"shown_default": "`<state dir>/room-templates`"})
    # Two: a finish's candidate and its baseline (vmd/machines/parked_rooms.py).
    room_parked: int = Field(default=2, ge=0, le=8, description=(
        "how many clean rooms of an image wait restored from a room template, woken and paused (as parked "
        "warm slots do), so that a check's room is a resume and the commit moved into place instead of a "
        "restore and a wake; parked once a session's machine has come and a template exists (the first "
        "finish makes the templates), refilled in the background at low priority after each check; a room "
        "is used for one check and destroyed, never parked again; one that fails at its hand-out is "
        "destroyed and the room is restored from a template (else booted cold) as without it. Each holds a "
        "guest's memory (`VMD_GUEST_MEMORY_MIB`) and one template while it waits; at most "
        "`VMD_ROOM_TEMPLATES`; Linux guests on 9p only; `0`: every room is restored or booted"))

    # A guest's memory and vCPUs (vmd/machines/domain_life.py). 2 GiB runs the Debian desktop, a
    # browser and a test suite without swapping; the warm pool sizes itself by the memory
    # (vmd/machines/host_room.py: a quarter of the host's memory in guests being made). Two
    # vCPUs let a build and the desktop run side by side; under TCG each vCPU is a host
    # thread, so more would take the cores the other sessions' guests need.
    guest_memory_mib: int = Field(default=2048, ge=512, description=(
        "each guest's memory; the warm pool's `auto` size counts it"))
    guest_vcpus: int = Field(default=2, ge=1, le=64, description=(
        "each guest's vCPUs (under TCG each is a host thread)"))
    # The longest a session waits for a slot being made (vmd/machines/warm_pool.py): a cold
    # boot to a ready desktop took 30-45 s under TCG here; 75 (300 under TCG) leaves room.
    slot_ready_s: float = Field(default=75, gt=0, description=(
        "how long a warm slot's boot to a ready desktop may take, in KVM seconds (x4 under TCG)"))
    slot_make_s: float = Field(default=90, gt=0, description=(
        "how long a warm slot's whole making (boot, identity, save) may take, in KVM seconds (x4 under "
        "TCG)"))
    # What one command's output may return to the caller before its middle is cut, per
    # stream (vmd/guests/output.py): a model cannot use 5 MB of build log; it can use the
    # first and last few thousand lines.
    output_head_bytes: int = Field(default=32 * 1024, ge=0, description=(
        "what one command returns of the start of each output stream before its middle is cut"))
    output_tail_bytes: int = Field(default=32 * 1024, ge=0, description=(
        "what one command returns of the end of each output stream before its middle is cut"))

    # --- read by `vmd doctor` only, which checks the whole setup from vmd's side ----------
    # The vmd container's entrypoint gives the socket's folder this group.
    socket_group: str = Field("", description=(
        "`vmd doctor` only: the job service's group (a name or gid) that must reach vmd's socket; empty: "
        "not checked"))
    # Where the compose setup keeps Gitea's token for vmd (its entrypoint reads the file into
    # GITEA_TOKEN for vmd serve); the doctor reads it when GITEA_TOKEN is empty.
    gitea_token_file: Path | None = Field(None, description=(
        "`vmd doctor` only: a file holding Gitea's token (the compose setup's), read when `GITEA_TOKEN` "
        "is empty"))
    # The agent's Ollama and model, named as vmagent reads them (OLLAMA_HOST, VMAGENT_MODEL)
    # with vmagent's defaults (vmagent/config.py): vmd does not import vmagent.
    ollama_host: str = Field("http://127.0.0.1:11434", description=(
        "`vmd doctor` only: the agent's Ollama, named as the agent reads it"))
    ollama_model: str = Field("qwen3-vl:32b", description=(
        "`vmd doctor` only: the agent's model, named as the agent reads it"))
    # Which protocol that server speaks ("ollama", or "openai" for an OpenAI-compatible one
    # at model_url, with model_key as its bearer key), and whether the model is known to see
    # images where the server does not say: vmagent's settings of the same names.
    model_api: Literal["ollama", "openai"] = Field("ollama", description=(
        "`vmd doctor` only: the agent's model server protocol, named as the agent reads it"))
    model_url: str = Field("", description=(
        "`vmd doctor` only: the agent's model server, named as the agent reads it"))
    model_key: SecretStr = Field(SecretStr(""), description=(
        "`vmd doctor` only: the agent's model server key, named as the agent reads it"))
    model_vision: bool | None = Field(None, description=(
        "`vmd doctor` only: whether the agent's model sees images, named as the agent reads it"))

    @field_validator("model_vision", mode="before")
    @classmethod
    def _vision_unset_when_blank(cls, value):
        # An empty variable (a blank line in a compose file) means "not said": /v1/models decides.
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("accel", mode="before")
    @classmethod
    def _accel_in_any_case(cls, value):
        # VMD_ACCEL=KVM means kvm, and an empty line in a compose file means "not set".
        if isinstance(value, str):
            return value.strip().lower() or "auto"
        return value

    @field_validator("warm_pool_size", mode="before")
    @classmethod
    def _pool_size(cls, value):
        # From the environment every value is text: "2" is two slots, "" (a compose file's
        # unset variable) is auto.
        if isinstance(value, str):
            value = value.strip().lower() or "auto"
            if value != "auto":
                try:
                    value = int(value)
                except ValueError:
                    raise ValueError("give a number of warm machines (0 turns the pool off) or auto") from None
        if isinstance(value, int) and not isinstance(value, bool) and not 0 <= value <= 16:
            raise ValueError("give between 0 (no pool) and 16 warm machines, or auto")
        return value

    @field_validator("egress_allow", mode="before")
    @classmethod
    def _egress_allow(cls, value):
        # From the environment: "10.1.2.0/24=the apt mirror; 10.1.2.3:3128=the proxy".
        if isinstance(value, str):
            value = [entry.strip() for entry in value.split(";") if entry.strip()]
        return value

    @field_validator("egress_allow")
    @classmethod
    def _egress_allow_entries(cls, value):
        for entry in value:
            Allowed.parse(entry)
        return value

    @model_validator(mode="after")
    def _default_projects_dir(self) -> "VmdConfig":
        if self.projects_dir is None:
            self.projects_dir = self.state_dir / "projects"
        return self

    @property
    def sessions_dir(self) -> Path:
        return self.state_dir / "sessions"

    @classmethod
    def load(
        cls,
        path: str | os.PathLike | None = None,
        env: Mapping[str, str] | None = None,
        **overrides,
    ) -> "VmdConfig":
        """File (`path`, else $VMD_CONFIG if set), then the environment, then `overrides`
        (command-line flags); None overrides are ignored."""
        env = os.environ if env is None else env
        values: dict = {}
        path = path or env.get("VMD_CONFIG")
        if path:
            file = Path(path)
            if not file.is_file():
                raise FileNotFoundError(f"vmd config file {file} does not exist (from VMD_CONFIG or --config).")
            with open(file, "rb") as fh:
                values.update(tomllib.load(fh))
        for var, field in ENV_FIELDS.items():
            if env.get(var):
                values[field] = env[var]
        values.update({k: v for k, v in overrides.items() if v is not None})
        # projects_dir follows state_dir unless it was set on its own.
        try:
            return cls(**values)
        except ValidationError as e:
            from_env = {field: var for var, field in ENV_FIELDS.items()
                        if env.get(var) and overrides.get(field) is None}
            raise VmdConfigError(_problems(e, from_env, path)) from None


def _problems(error: ValidationError, from_env: Mapping[str, str], path) -> str:
    """"vmd's configuration is invalid: VMD_ACCEL (accel): Input should be ...": the
    variable is named when the environment set the field (`from_env`: field -> variable)."""
    said = []
    for err in error.errors():
        field = str(err["loc"][0]) if err["loc"] else "config"
        where = f"{from_env[field]} ({field})" if field in from_env else field
        said.append(f"{where}: {err['msg']}")
    source = f" (file {path} and environment)" if path else " (environment)"
    return f"vmd's configuration is invalid{source}: " + "; ".join(said) + "."
