"""Calling vmd for one tool call and turning its answer into what the model reads next:
`call(vmd, name, arguments)` raises nothing but `VmdUnavailable`.

vmd words its results for the model (each carries a `text`, vmd/contract/results.py): that text is
what the model reads, so that each thing is said once. Only where vmd answers with more
than words (a picture, a task list beside the sentence, a pause or the end of the
session) is there a formatter here. A refusal is vmd's error with code REFUSED, and its
message, which starts with "REFUSED:", is the model's text as it is."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable

from vmagent.link import VmdError, VmdUnavailable
from vmagent.tools.parsing import ParsedArguments, parse_arguments, unknown_tool_text, verb_of
from vmagent.tools.table import PLANNING_TOOLS, SCREEN_TEXT_TOOLS, SCREEN_TOOLS, TOOLS, WEB_TOOLS
from vmd.contract.errors import REFUSED
from vmd.contract.policy import SessionStateName, WAITING_STATES

# The first line a model that cannot see images reads of a screenshot.
SCREEN_AS_TEXT = ("NOTE: the model you run on cannot see images, so this screenshot is not shown "
                  "to you; this is the screen read as text instead (the guest's windows, and the "
                  "words OCR found on screen).")
# ... and what it reads when vmd gave no text (a vmd older than the `text` param).
SCREEN_UNSEEN = (
    "NOTE: the model you run on cannot see images, so this screenshot was not shown to you. "
    "Learn the screen's state from the shell instead: window titles (e.g. `xdotool search --name . "
    "getwindowname %@` or `wmctrl -l`; on Windows `Get-Process | Where-Object MainWindowTitle | "
    "Select MainWindowTitle`), the program's output and log files."
)


@dataclass
class ToolOutcome:
    """What one tool call gave: the text (and image) for the model, and for the loop
    whether it worked and whether the session stops here."""
    text: str
    # The screenshot, for the live preview, and for the model only when it sees images:
    # `call(..., sees_images=False)` keeps it here for the preview and puts the screen
    # read as text in `text`; the loop attaches it to the model's message only when
    # the model sees images.
    image_b64: str | None = None
    verb: str = ""
    ok: bool = True
    # vmd's result; for a refusal, the error's data (a refused finish's check: {"attempt": ...}).
    result: dict | None = None
    # "question" / "unfreeze" (WAITING_STATES) when the verb paused the session; "finished"
    # when finish was accepted. None otherwise.
    state: SessionStateName | None = None


def call(vmd: Any, name: Any, arguments: Any, offered: Iterable[str] | None = None,
         sees_images: bool = True, web: Any = None) -> ToolOutcome:
    """Run one tool call against vmd and format the result for the model.

    `arguments`: as the model sent them, or the ParsedArguments `parse_arguments` made of
    them already (the loop reads them once: it shows the command before it runs).
    `offered`: the tool names offered this turn; a call to any other gets an error text.
    `sees_images`: False for a model without vision: the screen tools are asked for the
    screen read as text, and that text is what the model reads.
    `web`: the job's WebTools (vmagent/web/agent_tools.py), which run web_search and
    read_page on the host; their outcome's `result` is the source vmd records.
    Raises only VmdUnavailable.
    """
    verb = verb_of(name)
    try:
        offered_names = list(offered) if offered is not None else None
        if verb not in TOOLS:
            return ToolOutcome("ERROR: " + unknown_tool_text(name, offered_names),
                               verb=verb, ok=False)
        if offered_names is not None and verb not in offered_names:
            return ToolOutcome("ERROR: " + _not_offered_text(verb, offered_names), verb=verb, ok=False)
        parsed = arguments if isinstance(arguments, ParsedArguments) else parse_arguments(verb, arguments)
        if not parsed.ok:
            return ToolOutcome(_join(["ERROR: " + parsed.error, *parsed.notes]), verb=verb, ok=False)
        params = dict(parsed.params)
        if verb in WEB_TOOLS:
            if web is None or verb not in web.names:
                return ToolOutcome(f"ERROR: {verb} is not available in this job.", verb=verb, ok=False)
            answer = web.call(verb, params)
            return ToolOutcome(_join([answer.text, *parsed.notes]), verb=verb, ok=answer.ok, result=answer.source)
        if not sees_images and verb in SCREEN_TEXT_TOOLS:
            params["text"] = True  # OCR only for the model that needs it: it takes a second
        try:
            result = vmd.call(verb, **params)
        except VmdError as exc:
            return ToolOutcome(_join([_error_text(exc), *parsed.notes]), verb=verb, ok=False, result=exc.data)
        outcome = _outcome(verb, result.model_dump())  # shown to the model and kept as a dict
        if not sees_images and outcome.image_b64:
            outcome.text = _screen_unseen(outcome)
        if parsed.notes:
            outcome.text = _join([outcome.text, *parsed.notes])
        return outcome
    except VmdUnavailable:
        raise
    except Exception as exc:
        return ToolOutcome(f"ERROR: internal: {type(exc).__name__}: {exc}", verb=verb, ok=False)


def _error_text(exc: VmdError) -> str:
    # A refusal's message is a sentence for the model that starts with "REFUSED:" already.
    return exc.message if exc.code == REFUSED else f"ERROR: {exc.message or exc}"


def _not_offered_text(verb: str, offered: list[str]) -> str:
    """Why a known tool is not offered now, and when it will be: the planning phase offers
    fewer tools, and a model that calls one early must learn it is a matter of time."""
    available = f"Available now: {', '.join(offered)}."
    if verb in SCREEN_TOOLS and "run" in offered:
        return (f"{verb} is a screen tool and this session has no desktop; it will not become "
                f"available. Use run and the file tools instead. {available}")
    if set(offered) <= set(PLANNING_TOOLS):
        return (f"{verb} is not available yet: it becomes available once the task list is written "
                f"(call plan_tasks) and the machine is up, which the next message will say. {available}")
    return f"{verb} is not available at this point. {available}"


def _screen_unseen(outcome: ToolOutcome) -> str:
    """What a model that cannot see images reads of a verb that answered with a picture."""
    screen_text = (outcome.result or {}).get("screen_text")
    if isinstance(screen_text, str) and screen_text.strip():
        return _join([SCREEN_AS_TEXT, screen_text])
    return _join([outcome.text, SCREEN_UNSEEN])


def _join(parts: Iterable[str]) -> str:
    return "\n".join(p for p in parts if p)


def _outcome(verb: str, result: Any) -> ToolOutcome:
    if not isinstance(result, dict):
        result = {"result": result}
    formatter = _FORMATTERS.get(verb, _format_text)
    try:
        outcome = formatter(result)
    except Exception:
        # vmd answered but not in the shape expected; its own text still helps the model.
        outcome = _format_text(result)
    outcome.verb = verb
    outcome.result = result
    if outcome.state is None and result.get("state") in WAITING_STATES:
        outcome.state = result["state"]  # ask_user, request_unfreeze: the session waits for a person
    if outcome.image_b64 is None and isinstance(result.get("png_base64"), str):
        outcome.image_b64 = result["png_base64"]  # any verb that answers with a picture
    return outcome


def _format_text(r: dict) -> ToolOutcome:
    """vmd's text as it is (run, read_file, list_dir and the rest); the result itself only
    when vmd gave no text."""
    text = r.get("text")
    if not isinstance(text, str) or not text:
        shown = {k: v for k, v in r.items() if k != "png_base64"}
        text = json.dumps(shown, ensure_ascii=False, default=str) if shown else "ok"
    return ToolOutcome(text)


def _format_screenshot(r: dict) -> ToolOutcome:
    image = r.get("png_base64") or None
    screen_text = r.get("screen_text") if isinstance(r.get("screen_text"), str) else ""
    if image is None and not screen_text:
        return ToolOutcome(_format_text(r).text, ok=False)
    size = f"{r.get('width')}x{r.get('height')}" if r.get("width") else "the screen"
    return ToolOutcome(
        _join([f"screenshot of {size}; click, move and scroll take pixel coordinates in this image.",
               screen_text]),
        image_b64=image,
    )


def _format_tasks(r: dict) -> ToolOutcome:
    text = r.get("text") if isinstance(r.get("text"), str) else ""
    tasks = r.get("tasks") if isinstance(r.get("tasks"), str) else ""
    if tasks and tasks not in text:
        text = _join([text, tasks])
    return ToolOutcome(text or _format_text(r).text)


def _format_finish(r: dict) -> ToolOutcome:
    # A refused finish is a REFUSED error; `accepted: false` is how vmd refused it before,
    # read the same way until no vmd answers so.
    accepted = bool(r.get("accepted"))
    text = r.get("text") if isinstance(r.get("text"), str) and r.get("text") else (
        "finish accepted." if accepted else "REFUSED: finish was not accepted."
    )
    return ToolOutcome(text, ok=accepted, state="finished" if accepted else None)


_FORMATTERS = {
    "screenshot": _format_screenshot,
    "plan_tasks": _format_tasks,
    "add_task": _format_tasks,
    "update_task": _format_tasks,
    "finish": _format_finish,
}
