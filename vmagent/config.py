"""The agent's settings: one validated object, read from an optional file and the environment.

Order of precedence, lowest first: the defaults below, a TOML or YAML file (the path
given to `AgentConfig.load`, else the one named by VMAGENT_CONFIG), then environment
variables (VMAGENT_<FIELD> for any field, and the names in ENV_ALIASES). Nothing else of
vmagent reads a setting from the environment.
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from vmagent.web.allow_list import parse_allow_list

CONFIG_ENV = "VMAGENT_CONFIG"
PROMPTS_ENV = "VMAGENT_PROMPTS"
# Names people already set, read for a field besides its VMAGENT_<FIELD> form and winning
# over it: Ollama's own, the agent's short ones, and vmd's, so that one variable sets both
# sides of a setup.
ENV_ALIASES = {
    "OLLAMA_HOST": "ollama_host",
    "VMAGENT_MODEL": "model",
    PROMPTS_ENV: "prompts_dir",
    "VMD_DEFAULT_OS": "default_os",
}


# llama.cpp's llama-server listens here unless told otherwise.
OPENAI_DEFAULT_URL = "http://127.0.0.1:8080/v1"


class ConfigError(ValueError):
    """The configuration cannot be used; the message says which setting and why."""


class AgentConfig(BaseModel):
    # A typo in a config file should be an error, not a setting silently ignored.
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # --- the model -----------------------------------------------------------------
    # vmagent/models/backends.py picks the client by it (Ollama speaks "openai" too).
    model_api: Literal["ollama", "openai"] = Field("ollama", description=(
        "the model server's protocol: `ollama` (`/api/chat`) or `openai` (`/v1/chat/completions`: vLLM, "
        "llama.cpp, SGLang, LM Studio; see Model servers)"))
    # Unset, for "openai": llama-server's own default.
    model_url: str | None = Field(None, description=(
        "the model server; for `openai` its base URL ending in `/v1`; for `ollama` it wins over "
        "`OLLAMA_HOST`"),
        json_schema_extra={"shown_default": "`http://127.0.0.1:8080/v1` (`openai`), `OLLAMA_HOST` (`ollama`)"})
    model_key: SecretStr | None = Field(None, description=(
        "the `openai` server's API key, sent as a bearer header; a secret: never logged, stored in a "
        "transcript or shown in a report or event"))
    # Whether the model takes images, for an OpenAI-compatible server that does not say so
    # in /v1/models (vLLM does not). None: what /v1/models says, else no (a text-only
    # model sent an image refuses the request; the screen is then read as text).
    model_vision: bool | None = Field(None, description=(
        "whether an `openai` server's model takes images, where `/v1/models` does not say (vLLM)"),
        json_schema_extra={"shown_default": "what `/v1/models` says, else no"})
    # Fields added to every OpenAI-compatible request (VMAGENT_MODEL_EXTRA_BODY, JSON), as
    # the OpenAI client's extra_body: sampling (temperature, top_k), or {"tool_choice":
    # "required"} for a small model that answers in prose, which makes llama.cpp and vLLM
    # constrain every reply with tools to a call. tool_choice and parallel_tool_calls go
    # only with tools; the fields vmagent sets itself (model, messages, stream) are kept;
    # a max_tokens here caps every reply, the compaction's summary too.
    model_extra_body: dict[str, Any] = Field(default_factory=dict, description=(
        "JSON fields added to every `openai` request: sampling (`{\"temperature\": 0.6, \"top_k\": 20}`), or "
        "`{\"tool_choice\": \"required\"}` to make the server hold a small model to tool calls"))
    ollama_host: str = Field("http://127.0.0.1:11434", description="Ollama's address")
    # A model with tool calling (the agent works only through tools) and vision (the
    # screen verbs answer with screenshots; Ollama drops images for a text-only model).
    model: str = Field("qwen3-vl:32b", description=(
        "the model as the server names it (`--model` for one run); it needs tool calling, and vision lets"
        " it see screenshots"))
    # Ollama's default context (2048 tokens before 0.6, 4096 after) silently drops the
    # start of longer prompts -- the system prompt and the task go first. An agent prompt
    # with tool schemas is several thousand tokens before any work, so num_ctx is always
    # sent explicitly. 32768 fits a 32B model at Q4 with its KV cache on one 48 GB card.
    num_ctx: int = Field(32768, ge=2048, description=(
        "the context: sent to Ollama with every request; for `openai`, used when `/v1/models` does not "
        "say (vLLM's `max_model_len` and llama.cpp's `n_ctx` win)"))
    # Think before answering when the model can (None: ask Ollama whether it can).
    think: bool | None = Field(None, description=(
        "whether the model thinks before answering"),
        json_schema_extra={"shown_default": "where Ollama says it can"})
    # How long Ollama keeps the model loaded between calls. Tool calls on a slow guest
    # can take minutes; reloading a 32B model costs tens of seconds each time.
    keep_alive: str = Field("30m", description="how long Ollama keeps the model loaded between calls")
    # Seconds Ollama may stay silent (before the first chunk or between chunks). A long
    # prompt on a busy GPU takes minutes to evaluate before the first token.
    request_timeout_s: float = Field(600, gt=0, description=(
        "seconds the model server may stay silent (before the first chunk or between chunks)"))
    # Tries after the first one at most, for a server that is away (connection refused or
    # reset, a stream cut before it was done), busy (429) or failing (5xx), made only while
    # nothing of the reply was shown. model_retry_s ends them first with the defaults; this
    # caps the count (0: no retries, as the tests' scripted servers want).
    retries: int = Field(20, ge=0, description=(
        "retries of a model request at most, for a server that is away, busy (429) or failing (5xx), made"
        " only while nothing of the reply was shown; `0`: none"))
    # Wait before retry n is retry_backoff_s * 2**(n-1), at most 30 s: 2, 4, 8 s lets a
    # restarted Ollama come back quickly, and a long outage is not hammered.
    retry_backoff_s: float = Field(2.0, ge=0, description=(
        "the wait before retry n is this times 2^(n-1), at most 30 s"))
    # Seconds a request is asked again after its first failure, within the job's deadline:
    # an Ollama restart, or a runner reloading a 32B model after a crash, takes a minute or
    # two. Past it the job ends failed with its report. The first contact (the model's
    # capabilities, before a session opens) gives up after 3 retries instead: a server that
    # is not there at the start is a setting to fix.
    model_retry_s: float = Field(180, ge=0, description=(
        "seconds a model request is tried again after its first failure, within the job's deadline; past "
        "it the job ends failed with its report"))

    # --- the job ---------------------------------------------------------------------
    # Where prompt.md and its parts are looked for first (vmagent/prompts.py), before the
    # repository's configs/agent: rewording the prompt of an installed agent (the compose
    # image sets it) is then an edit and a restart. None: the repository's only.
    prompts_dir: Path | None = Field(None, description=(
        "a folder with `prompt.md` (and optional `prompt.<os>.md`, `prompt.screen.md`), looked in before "
        "the clone's `configs/agent/`"), json_schema_extra={"shown_default": "`configs/agent/`"})
    # The guest image `vmagent run` asks for when --os is not given; read from VMD_DEFAULT_OS,
    # the name of vmd's own default, so that one variable names it for both.
    default_os: str = Field("debian", min_length=1, description=(
        "the guest image `vmagent run` asks for when `--os` is not given"))

    # --- compaction ----------------------------------------------------------------
    # Compact when the estimated prompt passes this fraction of num_ctx. The rest is
    # room for the reply (a long file write can be thousands of tokens), the next tool
    # result, and the error of a chars-per-token estimate.
    compact_at: float = Field(0.7, gt=0.1, lt=1.0, description=(
        "compact the history when the estimated prompt passes this share of `num_ctx`"))
    # Messages kept verbatim at the end of the history: about the last five tool calls
    # with their results, enough to carry on mid-task without re-reading files.
    keep_tail_messages: int = Field(12, ge=2, description=(
        "messages kept word for word at the end of the history when it is compacted"))
    # A tool result longer than this keeps its head and tail only when it enters the
    # history: ~1500 tokens, so one `cat` of a big log cannot fill the context.
    tool_result_cap_chars: int = Field(6000, ge=500, description=(
        "a tool result longer than this keeps only its head and tail when it enters the history"))
    # Screenshots kept in the history after old ones are dropped (they become a text note).
    # Each costs about image_tokens, and only the newest show the screen as it is.
    keep_images: int = Field(2, ge=0, description="screenshots kept in the history when old ones are dropped")
    # Screenshots the history holds at most. Old ones are dropped in a batch, down to
    # keep_images, when a new one would pass this (and at a compaction), not one per new
    # look: dropping one rewrites an old message, and the model server evaluates the prompt
    # again from there. 6 x image_tokens is ~7800 tokens, a quarter of the default num_ctx,
    # and a batch drop then comes once every 4 looks instead of at every look.
    max_images: int = Field(6, ge=1, description=(
        "screenshots the history holds at most; past it old ones are dropped in a batch, down to "
        "`keep_images`"))
    # What one screenshot costs in the prompt: a 1280x800 PNG is ~1300 tokens for
    # Qwen2.5-VL (28x28 pixel patches). Used by the estimate, corrected by calibration.
    image_tokens: int = Field(1300, ge=0, description=(
        "what one screenshot costs in the prompt, for the estimate (corrected by calibration)"))

    # --- guards --------------------------------------------------------------------
    # Model turns (calls of the model) before the loop stops with a report, the turn cap: 110
    # covered every task of the bench that finished at all; sessions past it were going in
    # circles. The name is older than the word.
    max_steps: int = Field(110, ge=1, description=(
        "the turn cap: model turns before the loop stops with a report"))
    # Wall-clock limit of a session in seconds (2 h): the promise made to the person.
    deadline_s: float = Field(7200, gt=0, description=(
        "a job's wall-clock limit"), json_schema_extra={"shown_default": "`7200` (2 h)"})
    # Prose-only replies in a row before the loop gives up: each gets a nudge; three
    # ignored nudges mean the model has lost the tool protocol.
    max_prose_replies: int = Field(3, ge=1, description=(
        "replies in a row without a tool call (each gets a nudge) before the loop gives up"))
    # The same command with the same result this many times gets a notice appended, so
    # the model stops polling something that will not change.
    repeat_notice_after: int = Field(3, ge=2, description=(
        "the same command with the same result this many times gets a notice appended"))
    stall_reminder_steps: int = Field(12, ge=1, description=(
        "model turns without the task list moving before a reminder shows it again"))
    # The stuck detector (vmagent/loop/guards.py), over the tool calls of the whole job.
    # The same call with the same answer this many times in a row: a poll of something
    # that does not change. Output that changes (a build log tailed every 30 s) is not one.
    stuck_same_answer: int = Field(3, ge=2, description=(
        "the stuck detector: the same call with the same answer this many times in a row"))
    # The same call refused (REFUSED or ERROR) this many times in a row: a finish while a
    # task is open was refused 100 times in a row until the turn cap, before this guard.
    stuck_refused: int = Field(3, ge=2, description=(
        "the stuck detector: the same call refused this many times in a row"))
    # Calls in an A-B-A-B run of two calls whose answers do not change (OpenHands: 6).
    stuck_alternation: int = Field(6, ge=4, description=(
        "the stuck detector: calls in an A-B-A-B run of two calls whose answers do not change"))
    # A run of up to this many calls repeated stuck_cycle_repeats times in a row, each call
    # answered the same each time: a model that lost its place (a screen job repeated six
    # calls 17 times, to the turn cap, before this; OpenHands catches repeating patterns too).
    stuck_cycle_len: int = Field(8, ge=3, description=(
        "the stuck detector: the longest run of calls that, repeated `stuck_cycle_repeats` times in a row"
        " with the same answers, counts"))
    stuck_cycle_repeats: int = Field(3, ge=2, description=(
        "the stuck detector: how many times in a row such a run must repeat"))
    # Hits of one pattern that end the job: the first is told to the model with what to do
    # instead; a model that goes on after that will not get out by itself.
    stuck_hits_to_end: int = Field(2, ge=1, description=(
        "hits of one stuck pattern that end the job (the first is told to the model with what to do "
        "instead)"))
    # A repeated call that waits (`wait`, or a `sleep N` in a command) is a poll: an
    # installer or a build watched through the screen or a log can show nothing new for
    # minutes, and six calls of wait + screenshot ended such a job in under a minute. A
    # poll counts as stuck only once it has waited this long with no answer changing.
    stuck_poll_s: float = Field(900.0, ge=0, description=(
        "a repeated call that waits (`wait`, a `sleep N`) is stuck only once it has waited this long with"
        " no answer changing"))

    # --- the machine and the watchers ------------------------------------------------
    # How long phase two waits for the guest at most: a cold TCG boot of the Debian guest
    # took ~60 s, a desktop several minutes; vmd gives up on its own after its
    # boot_timeout_s (600 s under TCG by default) and then says why.
    boot_wait_s: float = Field(900, gt=0, description="how long a job waits for its guest at most")
    # Seconds between looks at the screen for the live preview (VMAGENT_SCREEN_WATCH_S);
    # 0 or less turns it off. A look is a screenshot, ~45 ms of the guest's time.
    screen_watch_s: float = Field(5.0, description=(
        "seconds between looks at the screen for the live preview (0: off)"))
    # How long the loop waits for vmd to come back when the connection to it is lost (a
    # vmd restart: systemd has it back in seconds, re-binding the guest takes a few more).
    # The session is re-attached and the work goes on; a call in flight is answered to the
    # model as interrupted, never run again. Past it the job ends failed, and vmd closes the
    # session itself once it is back.
    vmd_reconnect_s: float = Field(180, ge=0, description=(
        "how long a job waits for vmd to come back when the connection to it is lost (a vmd restart); "
        "past it the job ends failed"))
    # What is in flight when a job is cancelled (a command in the guest, the model's
    # answer) gets this long to end by itself, so a quick step's work is kept whole; then
    # it is broken off and the session closes (vmd destroys the machine, which ends the
    # command). A person pressing Ctrl-C or stop expects seconds, not the rest of a build.
    cancel_grace_s: float = Field(3.0, ge=0, description=(
        "what is in flight when a job is cancelled (a command, the model's answer) gets this long to end "
        "by itself before it is broken off"))

    # --- the web, read on the host (vmagent/web/) -------------------------------------
    # Whether the agent is offered web_search and read_page (VMAGENT_WEB_TOOLS). None: on
    # when a search engine is set below; false: off; true: on (read_page alone when no
    # engine is set). Decided when a job starts: its tool list stays the same all job long.
    web_tools: bool | None = Field(None, description=(
        "`auto`: the web tools when an engine is set; `false`: never; `true`: also `read_page` alone "
        "without an engine. Decided when a job starts; the Open WebUI tool's `web_tools` user valve turns"
        " them off for a person's jobs"), json_schema_extra={"shown_default": "`auto`"})
    # A SearXNG (or searx) answering /search?format=json (VMAGENT_SEARXNG_URL); the engine
    # used when several are set.
    searxng_url: str | None = Field(None, description=(
        "a SearXNG (or searx) with the JSON format on: the agent gets `web_search` and `read_page`, run "
        "by vmagent on the host while the guest stays offline; each search and page read is in the live "
        "feed, vmd's record and the report's \"Sources read on the web\""))
    # Brave Search and Tavily keys (VMAGENT_BRAVE_API_KEY, VMAGENT_TAVILY_API_KEY): secrets,
    # sent in a header only; never logged, dumped, recorded or shown in an error.
    brave_api_key: SecretStr | None = Field(None, description=(
        "a Brave Search key, instead of SearXNG (SearXNG wins when several engines are set); a secret, "
        "sent in a header only"))
    tavily_api_key: SecretStr | None = Field(None, description=(
        "a Tavily key, instead of SearXNG or Brave (SearXNG, then Brave, win when several are set); a "
        "secret, sent in a header only"))
    # Hosts or ranges read_page may read although they are not public (VMAGENT_WEB_ALLOW), as
    # vmd's VMD_EGRESS_ALLOW: `CIDR[:PORT]=reason` or `HOST[:PORT]=reason`, `;` between them
    # in the variable (a docs mirror on the LAN). Everything else must be a public address.
    web_allow: list[str] = Field(default_factory=list, description=(
        "hosts or ranges `read_page` may read although they are not public (a docs mirror on the LAN): "
        "`CIDR[:PORT]=reason;HOST[:PORT]=reason;…`. Otherwise every address a URL or a redirect resolves "
        "to must be public, and the connection goes to the address checked"))
    # The most of a page read_page reads: any documentation page fits in 2 MiB of HTML (the
    # Python docs' longest library pages are ~1 MiB), and it bounds the host's memory per read.
    web_page_bytes: int = Field(2 * 1024 * 1024, ge=64 * 1024, description=(
        "the most of a page `read_page` reads; a longer page is cut and says so"),
        json_schema_extra={"shown_default": "2 MiB"})
    # Seconds one search or page read takes at most, redirects included (a slow page is cut
    # there, and says so); other agents' page fetchers use 20-30 s.
    web_timeout_s: float = Field(20, gt=0, description=(
        "seconds one search or page read may take, redirects included; a slower page is cut and says so"))
    # Redirects read_page follows, each checked like the first URL; documentation sites use
    # one or two (http -> https, a moved page).
    web_max_redirects: int = Field(5, ge=0, le=20, description=(
        "redirects `read_page` follows, each checked like the first URL; a longer chain is refused"))
    # How long a page read stays cached: reading on with offset, or again after a
    # compaction, fetches nothing within it.
    web_cache_s: float = Field(900, ge=0, description=(
        "how long a page read stays cached, for reading on with `offset`"))

    @field_validator("searxng_url", mode="before")
    @classmethod
    def _blank_searxng_url_is_none(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.strip().rstrip("/")
            if value and "://" not in value:
                raise ValueError(f"searxng_url {value!r} needs a scheme, such as http://searxng:8080")
            return value or None
        return value

    @field_validator("brave_api_key", "tavily_api_key", mode="before")
    @classmethod
    def _blank_key_is_none(cls, value: Any) -> Any:
        return (value.strip() or None) if isinstance(value, str) else value

    @field_validator("web_tools", mode="before")
    @classmethod
    def _web_tools_from_text(cls, value: Any) -> Any:
        return _tristate(value)

    @field_validator("web_allow", mode="before")
    @classmethod
    def _web_allow_entries(cls, value: Any) -> Any:
        if isinstance(value, str):  # from the environment: "10.1.2.0/24=the docs mirror; docs.lan=the wiki"
            value = [entry.strip() for entry in value.split(";") if entry.strip()]
        if isinstance(value, list):
            parse_allow_list([str(v) for v in value])  # a ValueError names the entry and its fault
        return value

    @field_validator("ollama_host")
    @classmethod
    def _host_has_a_scheme(cls, value: str) -> str:
        value = value.strip().rstrip("/")
        if not value:
            raise ValueError("ollama_host is empty")
        # Kept as written ("host", "host:port" or a URL): the ollama package completes it
        # the way Ollama's own CLI does (port 11434 when none is given).
        return value

    @field_validator("model_url", mode="before")
    @classmethod
    def _blank_model_url_is_none(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.strip().rstrip("/")
            if value and "://" not in value:
                raise ValueError(f"model_url {value!r} needs a scheme, such as http://127.0.0.1:8080/v1")
            return value or None
        return value

    @field_validator("model_key", mode="before")
    @classmethod
    def _blank_model_key_is_none(cls, value: Any) -> Any:
        if isinstance(value, str):
            return value.strip() or None
        return value

    @field_validator("model_extra_body", mode="before")
    @classmethod
    def _extra_body_from_json(cls, value: Any) -> Any:
        if isinstance(value, str):
            if not value.strip():
                return {}
            try:
                return json.loads(value)
            except ValueError as e:
                raise ValueError(f"model_extra_body is not JSON ({e})") from None
        return value

    @field_validator("model_vision", mode="before")
    @classmethod
    def _vision_from_text(cls, value: Any) -> Any:
        return _tristate(value)

    def model_server(self) -> str:
        """The URL of the model server in use: model_url, else the backend's default."""
        if self.model_url:
            return self.model_url
        return OPENAI_DEFAULT_URL if self.model_api == "openai" else self.ollama_host

    @field_validator("prompts_dir", mode="before")
    @classmethod
    def _blank_prompts_dir_is_none(cls, value: Any) -> Any:
        # A variable set to spaces (an empty line in a compose file) means "not set".
        if isinstance(value, str):
            return value.strip() or None
        return value

    @field_validator("think", mode="before")
    @classmethod
    def _think_from_text(cls, value: Any) -> Any:
        return _tristate(value)

    @classmethod
    def load(cls, path: str | os.PathLike | None = None, env: dict[str, str] | None = None) -> "AgentConfig":
        """Defaults, then the file (`path`, else $VMAGENT_CONFIG, else none), then the environment.

        A file may hold the settings at its top level or under an `agent` table.
        """
        env = dict(os.environ if env is None else env)
        values: dict[str, Any] = {}
        file_path = path or env.get(CONFIG_ENV) or None
        if file_path:
            values.update(_read_file(Path(file_path)))
        values.update(_from_env(env))
        try:
            return cls(**values)
        except ValidationError as e:
            where = f" (file {file_path} and environment)" if file_path else " (environment)"
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'config'}: {err['msg']}" for err in e.errors()
            )
            raise ConfigError(f"The agent configuration is invalid{where}: {problems}.") from None


def _tristate(value: Any) -> Any:
    """A yes/no/auto setting written as text (an environment variable): None for auto."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("", "auto", "none", "default"):
            return None
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
    return value


def _read_file(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"The agent configuration file {path} does not exist; fix {CONFIG_ENV} or the path given.")
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix.lower() == ".toml":
            data = tomllib.loads(text)
        elif path.suffix.lower() in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text) or {}
        else:
            raise ConfigError(f"The agent configuration file {path} must end in .toml, .yaml or .yml.")
    except ConfigError:
        raise
    except Exception as e:  # tomllib.TOMLDecodeError, yaml.YAMLError
        raise ConfigError(f"The agent configuration file {path} cannot be parsed: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"The agent configuration file {path} must hold a table of settings.")
    section = data.get("agent")
    return dict(section) if isinstance(section, dict) else data


def _from_env(env: dict[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name in AgentConfig.model_fields:
        raw = env.get(f"VMAGENT_{name.upper()}")
        if raw is not None and raw != "":
            values[name] = raw
    for var, name in ENV_ALIASES.items():
        if env.get(var):
            values[name] = env[var]
    return values


def dump(config: AgentConfig) -> str:
    """The settings in effect, for a log line or `vmagent config`."""
    return json.dumps(config.model_dump(mode="json"), indent=2)
