"""Questions about a job, answered from what it left behind, without booting a machine.

The sources are the job's row (task, state, question), its report, its events (commands
and their output) and the project's git history, which vmd reads from its own repository of
the job's owner and project and answers through its `history` verb (the service opens none
of vmd's folders, so vmd may run on another host). With a model configured, the model
answers from those sources only; without one (or when it fails) the answer is the lines of
the record that match the question, and it says so.
"""

from __future__ import annotations

import re

from vmagent.config import AgentConfig, ConfigError
from vmagent.link import VmdCall, VmdUnavailable
from vmd.contract.bounds import LOCAL_OWNER, name_problem
from vmd.contract.results import HistoryResult
from vmd.contract.shown_text import fence

from .config import ServiceConfig
from .job_vmd import JobVmd, job_vmd, local_vmd
from .store import Store

# The model sees at most this much of the record; the report and the tail matter most.
MAX_CONTEXT_CHARS = 40000
_STOPWORDS = set("""the a an and or of to in on for with did does do you your was were is are
what why how when where which who this that it its from at by be been have has had not
can could would should about into than then them they there their job""".split())
# A file name in a question ("what changed in src/app.py?"): ASCII, starting with a letter,
# digit or '_' (never '-', which git would read as an option), with an extension.
_FILE_PATTERN = re.compile(r"(?<![\w./-])[A-Za-z0-9_][A-Za-z0-9_./-]*\.[A-Za-z0-9]{1,8}\b", re.ASCII)
# Files of one question whose history is read, and what one history answer may hold
# (vmd cuts it there and says so).
MAX_FILES = 3
MAX_GIT_OUTPUT = 64 * 1024


def gather_sources(store: Store, job: dict, question: str, config: ServiceConfig) -> list[tuple[str, str]]:
    sources: list[tuple[str, str]] = [
        ("job", f"Task: {job['task']}\nOS: {job['os']}\nProject: {job['project'] or '(none)'}\n"
                f"State: {job['state']}\nModel turns: {job['steps']}; tool calls: {job.get('tool_calls') or 0}\n"
                f"Verification passed: {job['verification_passed']}; proven (it failed on the "
                f"project before the job): {job['verification_proven']}; check runs: "
                f"{job['verification_attempts']}"),
    ]
    if job.get("question"):
        sources.append(("question", job["question"]))
    if job.get("report"):
        sources.append(("report", job["report"]))
    if job.get("tasks_text"):
        sources.append(("tasks", job["tasks_text"]))
    terminal: list[str] = []
    for _, event in store.iter_events(job["id"]):
        kind = event.get("type")
        if kind == "command":
            terminal.append(f"$ {event.get('command', '')}")
        elif kind == "output":
            terminal.append(str(event.get("line", "")))
        elif kind == "speech":
            terminal.append(f"(agent said) {event.get('text', '')}")
    if terminal:
        sources.append(("terminal", "\n".join(terminal[-600:])))
    history = project_history(config, job, question, vmd=job_vmd(config, store.job_dir(job["id"])))
    if history:
        sources.append(("git", history))
    return sources


def project_history(config: ServiceConfig, job: dict, question: str, vmd: JobVmd | None = None) -> str:
    """The recent history of the job's project, as vmd's `history` verb reads it from vmd's
    repository of that owner and project (the owner the worker gave session_open: the
    job's own): the last commits with their files, and the changes of each file the
    question names. "" when the job has no project or vmd has none of that name. `vmd`: the
    job's (job_vmd.py: with the Ray executor, its host's); None: the service's own."""
    if not job.get("project"):
        return ""
    owner, project = job.get("owner") or "", job["project"]
    if name_problem("owner", owner or LOCAL_OWNER) or name_problem("project", project):
        return ""  # a name vmd would refuse (a job stored before names were checked)
    asks = [("log --stat -n 10", {"max_commits": 10})]
    for name in project_files_in(question):
        asks.append((f"log -p -n 3 -- {name}", {"max_commits": 3, "patch": True, "path": name}))
    vmd = vmd or local_vmd(config.vmd_socket)
    calls = [VmdCall(verb="history", params={"owner": owner, "project": project, "what": "log",
                                             "max_bytes": MAX_GIT_OUTPUT, **params}) for _, params in asks]
    try:
        answers = vmd(calls, config.ask_git_timeout_s, False)
    except (VmdUnavailable, OSError, ValueError) as exc:
        return (f"(vmd could not be asked for this project's history ({exc}), so it is not part of "
                "this answer.)")
    if not answers or answers[0].error:
        return ""  # vmd has no such project (no session of it committed)
    parts = []
    for (label, _), answer in zip(asks, answers):
        if answer.error:
            continue
        # The contract's model, from vmd's dict.
        text = HistoryResult.model_validate(answer.result).text
        if text.strip():
            parts.append(f"$ git {label}\n{text[:8000]}")
    return "\n\n".join(parts)


def project_files_in(question: str) -> list[str]:
    names = []
    for name in _FILE_PATTERN.findall(question):
        if ".." not in name.split("/") and name not in names:
            names.append(name)
    return names[:MAX_FILES]


def answer_question(store: Store, job: dict, question: str, config: ServiceConfig) -> dict:
    sources = gather_sources(store, job, question, config)
    note = ""
    if config.ask_model and (config.ollama_url or _agent_settings().model_api == "openai"):
        try:
            return {"answer": _ask_model(config, question, sources), "method": "model",
                    "sources": [name for name, _ in sources]}
        except Exception as exc:  # any failure of the model falls back to the record itself
            note = f"(The model could not be asked: {exc}. These are the matching lines instead.)\n\n"
    return {"answer": note + extractive_answer(question, sources), "method": "extractive",
            "sources": [name for name, _ in sources]}


def _ask_model(config: ServiceConfig, question: str, sources: list[tuple[str, str]]) -> str:
    context = "\n\n".join(f"=== {name} ===\n{text}" for name, text in sources)
    if len(context) > MAX_CONTEXT_CHARS:
        context = context[:MAX_CONTEXT_CHARS // 4] + "\n…\n" + context[-(MAX_CONTEXT_CHARS * 3 // 4):]
    messages = [
        {"role": "system", "content": (
            "You answer questions about a finished coding job that ran in a virtual machine. "
            "Use only the record below. If the record does not say, answer that it does not say. "
            "Quote commands and file names exactly. Be brief.\n\n" + context)},
        {"role": "user", "content": question},
    ]
    # Imported here: the service runs (extractive answers) without the model client.
    from vmagent.models import open_model

    content = open_model(_ask_settings(config)).chat(messages, think=False).content.strip()
    if not content:
        raise ValueError("the model returned an empty answer")
    return content


def _agent_settings():
    """The agent's settings (its config file and environment), else its defaults."""
    try:
        return AgentConfig.load()
    except ConfigError:
        return AgentConfig()


def _ask_settings(config: ServiceConfig):
    """The model server the jobs use (VMAGENT_MODEL_API, VMAGENT_MODEL_URL, VMAGENT_MODEL_KEY)
    with the answer model; for Ollama at OLLAMA_URL, as before. One num_ctx for every call
    to the same model: Ollama reloads a model whose num_ctx changes."""
    agent = _agent_settings()
    update = {"model": config.ask_model, "num_ctx": config.ask_num_ctx or agent.num_ctx,
              "request_timeout_s": config.ask_timeout_s, "retries": 1}
    if agent.model_api == "ollama":
        update |= {"ollama_host": config.ollama_url, "model_url": None}
    return type(agent).model_validate({**agent.model_dump(), **update})


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9_.]{3,}", text.lower()) if w not in _STOPWORDS}


def extractive_answer(question: str, sources: list[tuple[str, str]], limit: int = 15) -> str:
    wanted = _words(question)
    scored = []
    order = 0
    for name, text in sources:
        for line in text.splitlines():
            if not line.strip():
                continue
            score = len(wanted & _words(line))
            scored.append((score, order, name, line.strip()))
            order += 1
    hits = sorted((s for s in scored if s[0] > 0), key=lambda s: (-s[0], s[1]))[:limit]
    if not hits:
        report = next((text for name, text in sources if name == "report"), "")
        summary = "\n".join(report.splitlines()[:20]) if report else "(this job has no report yet)"
        return ("Nothing in this job's record matches the question directly. "
                "No model is configured to interpret it; here is the start of the report:\n\n" + summary)
    lines = [f"[{name}] {line[:500]}" for _, _, name, line in sorted(hits, key=lambda s: s[1])]
    # The lines are the guest's and the model's text: fenced, they stay data in a chat.
    return ("No model is configured for questions, so these are the lines of the job's record "
            "(report, terminal, tasks, git history) that match the question:\n\n" + fence("\n".join(lines)))
