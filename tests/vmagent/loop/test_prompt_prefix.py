"""A prompt prefix that stays put: model servers (Ollama, llama.cpp) reuse the KV of the
longest prefix a request shares with the one before, so a turn costs what follows it.

What the (fake) Ollama server received is checked: the tool list and the system message
are the same bytes in every request of a job; what becomes known later (the machine, its
desktop) arrives as a message at the end; screenshots are dropped in batches, not one per
look; a compaction keeps the system prompt and the task byte-identical at the head. The
long replay with figures is bench/context.py."""

from __future__ import annotations

import json

from tests.support.loop_harness import agent_config, call, calls, is_summary_request, user_texts
from tests.support.ollama_server import Turn, start_ollama
from tests.support.vmd_fakes import LocalMachines, make_config
from vmagent.loop.compact import COMPACTED_HEADER, MACHINE_HEADER, Calibration
from vmagent.config import AgentConfig
from vmagent.models import SCREENSHOT_DROPPED, image_count
from vmagent.loop import JobSpec, run_job
from vmagent.prompts import load_prompts
from vmagent.tools import OFFERED_TOOLS
from vmd.server.rpc import VmdServer

TITLES = ["look at the screen", "write notes.txt"]
CHECK = {"command": "test -s notes.txt"}


class DesktopMachines(LocalMachines):
    """Stand-in machines whose guest reports a desktop once it is up, as the Debian image's
    openbox desktop does: only then does the loop learn that the screen tools work."""

    def create(self, spec):
        machine = super().create(spec)
        ready = machine.ready
        machine.ready = lambda timeout, desktop=False: {**ready(timeout, desktop), "desktop": True}
        return machine


class Model:
    """Plays `turns` in order; the compactor's summary requests get a summary and are not turns."""

    def __init__(self, turns: list[Turn]) -> None:
        self.turns = list(turns)
        self.summaries = 0

    def __call__(self, body: dict) -> Turn:
        if is_summary_request(body):
            self.summaries += 1
            return Turn(content=f"Summary {self.summaries}: looked at the screen, ran commands, all exit 0.")
        return self.turns.pop(0) if self.turns else Turn(status=400, error="the script has no more turns")


def screen_work(looks: int) -> list[Turn]:
    """Screenshots, each followed by a click somewhere else (a stuck detector sees no loop)."""
    out: list[Turn] = []
    for n in range(looks):
        out += [call("screenshot"), call("click", {"x": n, "y": n})]
    return out


def job_script(middle: list[Turn]) -> list[Turn]:
    return [
        call("run", {"command": "ls"}),  # before the plan: vmd refuses it and says to plan first
        call("plan_tasks", {"tasks": TITLES}),
        call("update_task", {"id": 1, "status": "in_progress"}),
        *middle,
        calls(("update_task", {"id": 1, "status": "done", "note": "seen"}),
              ("run", {"command": "echo seen > notes.txt"})),
        call("update_task", {"id": 2, "status": "done", "note": "written"}),
        call("finish", {"summary": "notes written", "verification": CHECK}),
    ]


def play(tmp_path, turns: list[Turn], machines: type[LocalMachines] = DesktopMachines, **config):
    model = Model(turns)
    server_of_vmd = VmdServer(make_config(tmp_path), machines()).start()
    try:
        with start_ollama([], default=model) as server:
            outcome = run_job(JobSpec(task="Look at the screen and write notes.", project="notes"),
                              on_event=lambda e: None, transcript_path=tmp_path / "t.json",
                              config=agent_config(server, **config), vmd_socket=str(server_of_vmd.config.socket))
    finally:
        server_of_vmd.stop()
    assert outcome.state == "done" and outcome.verification_passed is True, outcome.report
    return [body for body in server.chat_requests if not is_summary_request(body)], model


def dumped(value) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def extends(before: dict, after: dict) -> bool:
    """Whether `after`'s messages start with every message of `before`, byte for byte."""
    old, new = before["messages"], after["messages"]
    return len(new) > len(old) and all(dumped(a) == dumped(b) for a, b in zip(old, new))


def test_the_tool_list_and_system_message_are_byte_identical_in_every_request(tmp_path):
    turns, _ = play(tmp_path, job_script(screen_work(3)))
    assert len(turns) == 3 + 6 + 3
    tools, system = dumped(turns[0]["tools"]), dumped(turns[0]["messages"][0])
    assert [t["function"]["name"] for t in turns[0]["tools"]] == list(OFFERED_TOOLS)
    for n, body in enumerate(turns):
        assert dumped(body["tools"]) == tools, f"request {n}: the tool list changed"
        assert dumped(body["messages"][0]) == system, f"request {n}: the system message changed"
    # nothing old is rewritten: every request is the one before plus what came since
    # (three screenshots stay under the ceiling, so none is dropped)
    assert all(extends(a, b) for a, b in zip(turns, turns[1:]))
    # planning still comes first: the early run was refused by vmd, with what to do instead
    refused = [m["content"] for m in turns[1]["messages"] if m["role"] == "tool"]
    assert refused == [refused[0]] and refused[0].startswith("REFUSED: run needs a plan first")


def test_what_is_learnt_at_the_hand_over_arrives_as_a_message_at_the_end(tmp_path):
    turns, _ = play(tmp_path, job_script(screen_work(1)))
    screen_rules = load_prompts("linux", desktop=False).screen
    assert screen_rules and screen_rules.startswith("# The screen")
    handover = next(n for n, body in enumerate(turns) if any(
        t.startswith("The machine is up") for t in user_texts(body)))
    before, at = turns[handover - 1], turns[handover]
    # the planning request is a prefix of the hand-over request: it reuses all of it
    assert extends(before, at)
    last = at["messages"][-1]
    assert last["role"] == "user" and last["content"].startswith("The machine is up")
    assert "It has a desktop" in last["content"] and screen_rules in last["content"]
    assert "project_path" in last["content"]
    # the system prompt never took the screen part in
    assert all("# The screen" not in body["messages"][0]["content"] for body in turns)


def test_without_a_desktop_the_hand_over_says_the_screen_tools_do_not_work(tmp_path):
    turns, _ = play(tmp_path, job_script([call("run", {"command": "true"})]), machines=LocalMachines)
    handover = next(t for body in turns for t in user_texts(body) if t.startswith("The machine is up"))
    assert "It has no desktop" in handover and "# The screen" not in handover
    # the tool list did not shrink either: a screen tool is answered by the loop
    assert all([t["function"]["name"] for t in body["tools"]] == list(OFFERED_TOOLS) for body in turns)


def test_screenshots_are_dropped_in_batches_not_one_per_look(tmp_path):
    turns, _ = play(tmp_path, job_script(screen_work(10)), keep_images=2, max_images=4)
    counts = [image_count(body["messages"]) for body in turns]
    # screenshot k of 10 is answered in the request after its call; two requests a look
    shots = [counts[4 + 2 * k] for k in range(10)]
    assert shots == [1, 2, 3, 4, 2, 3, 4, 2, 3, 4], counts
    assert max(counts) == 4
    # the prompt is rewritten (an old message changes) only at the two batch drops
    breaks = [n for n, (a, b) in enumerate(zip(turns, turns[1:]), start=1) if not extends(a, b)]
    assert breaks == [4 + 2 * 4, 4 + 2 * 7], (breaks, counts)
    dropped = [m for m in turns[-1]["messages"] if SCREENSHOT_DROPPED in str(m.get("content"))]
    assert len(dropped) == 10 - 4


def test_the_estimate_counts_every_screenshot_a_request_holds():
    # The history holds up to max_images, not keep_images: the estimate counts them all.
    config = AgentConfig(keep_images=2, max_images=6, image_tokens=1000)
    shot = {"role": "tool", "tool_name": "screenshot", "content": "shot", "images": ["AAAA"]}
    text_only = Calibration.from_config(config).estimate([{"role": "user", "content": "task"}] + [
        {k: v for k, v in shot.items() if k != "images"}] * 5)
    with_shots = Calibration.from_config(config).estimate([{"role": "user", "content": "task"}] + [shot] * 5)
    assert with_shots - text_only == 5 * 1000


def test_a_compaction_keeps_the_head_byte_identical_restates_the_machine_and_drops_old_screenshots(tmp_path):
    long_run = "python3 -c \"[print(f'line {i} of {n}: ' + 'y' * 70) for i in range(300)]\""
    middle = screen_work(4) + [call("run", {"command": long_run.replace("{n}", str(n))}) for n in range(14)]
    turns, model = play(tmp_path, job_script(middle), num_ctx=12288, keep_images=1, max_images=4)
    assert model.summaries >= 1
    head = [dumped(m) for m in turns[0]["messages"][:2]]
    assert turns[0]["messages"][1]["content"].startswith("The task:")
    compacted = [n for n, body in enumerate(turns) if any(
        str(m.get("content", "")).startswith(COMPACTED_HEADER) for m in body["messages"])]
    assert compacted
    for body in turns:
        assert [dumped(m) for m in body["messages"][:2]] == head
        assert dumped(body["tools"]) == dumped(turns[0]["tools"])
    first = turns[compacted[0]]
    note = next(m["content"] for m in first["messages"] if str(m.get("content", "")).startswith(COMPACTED_HEADER))
    # the hand-over message was summarised away: the note says what it said
    assert not any(t.startswith("The machine is up") for t in user_texts(first))
    assert MACHINE_HEADER in note and "It has a desktop" in note.split(MACHINE_HEADER, 1)[1]
    # the screenshots left in the tail went down to keep_images with the compaction
    assert image_count(first["messages"]) <= 1
