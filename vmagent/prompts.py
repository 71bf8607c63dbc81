"""The agent's system prompt, read from files so that rewording it is a restart, not a build.

    prompt.md          required: the rules of the job
    prompt.<os>.md     optional: the guest's shell, paths and packages (linux, windows)
    prompt.screen.md   optional, only for a desktop session: how to use the screen tools
                       (joined when the desktop is known at the start; else `Prompts.screen`,
                       which the loop sends in a message once the machine has a desktop)

They are looked for in the directory given by the caller, else in the configured one
(AgentConfig.prompts_dir, from $VMAGENT_PROMPTS), then in this repository's own
configs/agent/. Parts are joined in the order above.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from vmagent.config import PROMPTS_ENV, AgentConfig
from vmagent.os_family import os_family_of

# The variable's name, for the job service's list of what a worker may inherit.
ENV_VAR = PROMPTS_ENV
REPO_PROMPTS_DIR = Path(__file__).resolve().parent.parent / "configs" / "agent"


class PromptMissing(FileNotFoundError):
    """prompt.md was not found (or is empty) in any of the places looked in."""


@dataclass
class Prompts:
    system: str
    warnings: list[str] = field(default_factory=list)
    # Where the parts were read from, for a startup log line.
    sources: list[Path] = field(default_factory=list)
    # prompt.screen.md when it was not joined into `system` (desktop=False): a desktop
    # found only once the machine is up gets it in a message, and the system prompt, the
    # head of every request, is never written again.
    screen: str | None = None


def _candidates(prompts_dir: str | os.PathLike | None, config: AgentConfig | None) -> list[tuple[Path, str]]:
    if prompts_dir is not None:
        return [(Path(prompts_dir), "the prompts directory given")]
    places = []
    # A caller without the job's config (the turn loop today) gets the one in effect.
    configured = (config or AgentConfig.load()).prompts_dir
    if configured is not None:
        places.append((configured, f"prompts_dir, ${ENV_VAR}"))
    places.append((REPO_PROMPTS_DIR, "the repository's configs/agent"))
    return places


def _read(path: Path) -> str | None:
    """The file's text, stripped; None when it is missing or blank."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    return text.strip() or None


def load_prompts(
    os_family: str, desktop: bool, prompts_dir: str | os.PathLike | None = None,
    config: AgentConfig | None = None,
) -> Prompts:
    """Build the system prompt for a guest OS family ("linux" or "windows"; a name like
    "debian" or "win11" is read as its family) and whether the session has a desktop.

    `prompts_dir` is the only place looked in when given; else `config`'s prompts_dir
    (the configuration in effect when None), then the repository's. Raises PromptMissing
    when no prompt.md is found; optional parts that are missing become warnings.
    """
    family = os_family_of(os_family)
    looked: list[str] = []
    warnings: list[str] = []
    for directory, label in _candidates(prompts_dir, config):
        main_file = directory / "prompt.md"
        try:
            main = _read(main_file)
        except OSError as exc:
            looked.append(f"{main_file} ({label}): unreadable: {exc}")
            continue
        if main is None:
            state = "empty" if main_file.is_file() else "not found"
            looked.append(f"{main_file} ({label}): {state}")
            continue
        if looked:
            warnings.append(
                "prompts: using " + str(main_file) + " because " + "; ".join(looked) + "."
            )
        parts, sources = [main], [main_file]
        optional = [directory / f"prompt.{family}.md"]
        screen_file = directory / "prompt.screen.md"
        if desktop:
            optional.append(screen_file)
        for path in optional:
            try:
                text = _read(path)
            except OSError as exc:
                warnings.append(f"prompts: {path} could not be read ({exc}); going on without it.")
                continue
            if text is None:
                warnings.append(f"prompts: {path} is missing or empty; going on without it.")
                continue
            parts.append(text)
            sources.append(path)
        screen = None
        if not desktop:
            try:
                screen = _read(screen_file)
            except OSError:  # as a missing part: the job goes on without the screen's rules
                screen = None
        return Prompts(system="\n\n".join(parts) + "\n", warnings=warnings, sources=sources, screen=screen)

    raise PromptMissing(
        "The agent's system prompt prompt.md was not found, so no job can start. Looked in: "
        + "; ".join(looked)
        + f". Put prompt.md in one of those places, or set {ENV_VAR} to a directory that "
        "holds it (the repository ships one in configs/agent/)."
    )
