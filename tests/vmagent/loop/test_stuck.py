"""The stuck detector (vmagent/loop/guards.py): each way of going in circles is told to the
model once with what to do instead, and ends the job at its second hit with the report
line that says which call was repeated and how often; work that repeats a call whose
answer changes is not stuck."""

from __future__ import annotations

from tests.support.loop_harness import agent_config, call, running_vmd, tool_results
from tests.support.ollama_server import start_ollama
from tests.vmagent.loop.test_loop import PLAN, assert_closed_with_report, run
from vmagent.loop.guards import alternation, cycle, same_call_refused, same_call_same_answer


def step(call: str, answer: str = "a", refused: bool = False, verb: str = "run") -> dict:
    return {"call": call, "answer": answer, "refused": refused, "verb": verb, "label": f"`{call}`"}


# --- the patterns, on their own ----------------------------------------------------------


def test_same_call_same_answer_needs_n_in_a_row_with_the_same_answer():
    assert same_call_same_answer([step("x")] * 3, 3).labels == ["`x`"]
    assert same_call_same_answer([step("x")] * 2, 3) is None
    assert same_call_same_answer([step("x"), step("y"), step("x"), step("x")], 3) is None
    # the build log that grows: the same call, another answer each time
    assert same_call_same_answer([step("x", "1"), step("x", "2"), step("x", "3")], 3) is None


def test_same_call_refused_counts_refusals_of_one_verb_by_call_or_by_answer():
    refused = step("finish", "REFUSED: tasks still open", refused=True, verb="finish")
    assert same_call_refused([refused] * 3, 3).pattern == "refused"
    # a reworded summary, the same refusal
    reworded = [step(f"finish {i}", "REFUSED: tasks still open", True, "finish") for i in range(3)]
    assert same_call_refused(reworded, 3) is not None
    # different calls refused for different reasons: trying things, not stuck
    trying = [step(f"finish {i}", f"REFUSED: check {i} failed", True, "finish") for i in range(3)]
    assert same_call_refused(trying, 3) is None
    assert same_call_refused([refused, refused, step("finish", verb="finish")], 3) is None


def test_alternation_is_two_calls_taking_turns_with_unchanging_answers():
    a, b = step("a"), step("b")
    assert alternation([a, b] * 3, 6).labels == ["`a`", "`b`"]
    assert alternation([a, b] * 2, 6) is None
    assert alternation([a] * 6, 6) is None  # that is the same call, another pattern
    assert alternation([a, b, a, step("b", "new"), a, b], 6) is None


def test_a_cycle_is_a_run_of_three_to_eight_calls_repeated_three_times_with_unchanging_answers():
    six = [step(c) for c in "abcdef"]
    hit = cycle(six * 3, 8, 3)
    assert hit.pattern == "cycle" and hit.labels == [f"`{c}`" for c in "abcdef"] and hit.count == 18
    assert cycle(six * 2, 8, 3) is None  # twice is not yet a loop
    assert cycle([step(c) for c in "abcdefghi"] * 3, 8, 3) is None  # nine calls: past the bound
    changed = six * 2 + six[:3] + [step("d", "new output")] + six[4:]
    assert cycle(changed, 8, 3) is None  # one answer changed: the round did something
    assert cycle([step("a")] * 9, 8, 3) is None  # the same call alone is another pattern


# --- in the loop: each pattern ends the job in a bounded number of turns -------------------


def stuck_run(tmp_path, script, default=None, **config):
    with running_vmd(tmp_path) as vmd, start_ollama(script, default=default) as server:
        outcome = run(tmp_path, vmd, server, config=agent_config(server, **config))
    assert_closed_with_report(vmd, outcome)
    return outcome, [r for body in server.chat_requests for r in tool_results(body)][-1:], server


def ended_line(outcome) -> str:
    section = outcome.report.split("## How the session ended", 1)[1]
    return next(line for line in section.splitlines() if "stuck in a loop" in line)


def test_a_refused_finish_repeated_ends_the_job_within_seven_turns(tmp_path):
    finish = call("finish", {"summary": "done", "verification": {"command": "true"}})
    outcome, _, server = stuck_run(tmp_path, [PLAN], default=finish)
    assert outcome.state == "failed" and outcome.steps == 7, outcome.report  # was 110, the step cap
    line = ended_line(outcome)
    assert "`finish " in line and "refused 3 times in a row, and again" in line and "6 calls in all" in line
    # the first hit told the model, in the third refusal's result, what to do instead
    results = tool_results(server.chat_requests[4])
    assert results[-1].startswith("REFUSED: tasks still open")
    assert "was refused 3 times in a row. Calling it again will be refused again" in results[-1]
    assert "mark the task blocked with update_task" in results[-1]
    assert not any("[vmagent:" in r for r in tool_results(server.chat_requests[3]))


def test_a_refused_finish_reworded_each_time_is_the_same_loop(tmp_path):
    n = iter(range(100))
    reworded = lambda body: call("finish", {"summary": f"done, try {next(n)}",  # noqa: E731
                                            "verification": {"command": "true"}})
    outcome, _, _ = stuck_run(tmp_path, [PLAN], default=reworded)
    assert outcome.state == "failed" and outcome.steps == 7 and "refused 3 times" in ended_line(outcome)


def test_the_same_command_with_the_same_output_ends_the_job(tmp_path):
    outcome, _, server = stuck_run(tmp_path, [PLAN], default=call("run", {"command": "cat missing.txt"}))
    assert outcome.state == "failed" and outcome.steps == 7
    assert "`run cat missing.txt` gave the same answer 3 times in a row, and again" in ended_line(outcome)
    third = tool_results(server.chat_requests[4])[-1]
    assert "this command has given this same result 3 times in a row" in third and "change the approach" in third


def test_two_calls_taking_turns_end_the_job(tmp_path):
    a, b = call("run", {"command": "ls"}), call("read_file", {"path": "notes.txt"})
    outcome, _, server = stuck_run(tmp_path, [PLAN] + [a, b] * 10)
    assert outcome.state == "failed" and outcome.steps == 13
    assert "alternated between `run ls` and `read_file" in ended_line(outcome)
    assert "This is a loop" in tool_results(server.chat_requests[7])[-1]


def test_a_round_of_six_calls_repeated_ends_the_job_at_its_second_hit(tmp_path):
    # The screen job that ran to the step cap (110 turns) repeating one round of six calls.
    round_ = [call("run", {"command": f"echo look {i}; seq 1 {i}"}) for i in range(5)] + \
        [call("list_dir", {"path": "."})]
    outcome, _, server = stuck_run(tmp_path, [PLAN] + round_ * 12)
    assert outcome.state == "failed" and outcome.steps == 1 + 6 * 3 * 2, outcome.report
    line = ended_line(outcome)
    assert "repeated the same 6 calls (`run echo look 0; seq 1 0`" in line and "3 times in a row" in line
    assert "and again after it was told to change approach (36 calls in all)" in line
    told = tool_results(server.chat_requests[19])[-1]  # the 18th call of the round, its result
    assert "you repeated the same 6 calls" in told and "This is a loop" in told


def test_a_build_polled_with_changing_output_is_not_stuck(tmp_path):
    poll = call("run", {"command": "sleep 0.01; date +%N >> build.log; tail -n 1 build.log; wc -l < build.log"})
    outcome, _, server = stuck_run(tmp_path, [PLAN], default=poll, max_steps=14)
    assert outcome.state == "failed" and "turn cap (14 model turns)" in outcome.report
    assert "stuck" not in outcome.report
    assert not any("[vmagent:" in r for r in tool_results(server.chat_requests[-1]))


def test_a_model_that_changes_approach_after_the_notice_goes_on(tmp_path):
    same = call("run", {"command": "cat missing.txt"})
    other = call("run", {"command": "ls"})
    script = [PLAN, same, same, same, other, same, same, other, same, same, other]
    outcome, _, _ = stuck_run(tmp_path, script, max_steps=len(script))
    assert "turn cap" in outcome.report and "stuck" not in outcome.report


# --- a poll waits on purpose: stuck only after stuck_poll_s with nothing changing ----------


def poll_steps(n_pairs: int, screen: str = "same screen", seconds: float = 5) -> list[dict]:
    from vmagent.loop.guards import call_step
    from vmagent.tools import ToolOutcome

    wait = call_step("wait", {"seconds": seconds}, ToolOutcome(ok=True, text=f"waited {seconds} s"))
    shot = call_step("screenshot", {}, ToolOutcome(ok=True, text="1280x800", image_b64=screen))
    return [wait, shot] * n_pairs


def notices(steps: list[dict], **config) -> list[tuple[int, str]]:
    from types import SimpleNamespace

    from vmagent.config import AgentConfig
    from vmagent.loop.job import Guards
    from vmagent.loop.guards import stuck_notice

    job, said = SimpleNamespace(guards=Guards()), []
    for i, s in enumerate(steps, 1):
        if text := stuck_notice(job, s, AgentConfig(**config)):
            said.append((i, text))
        if job.guards.stuck_end:
            break
    return said


def test_waiting_for_an_installer_through_the_screen_is_not_stuck_for_fifteen_minutes():
    # wait 10 s + a screenshot of the same screen, for 7.5 minutes: six calls of this ended
    # a job before the poll allowance.
    assert notices(poll_steps(45, seconds=10)) == []


def test_a_poll_that_never_sees_a_change_is_stuck_after_its_allowance():
    # 6 calls hold 3 waits of 5 s: the allowance of 60 s is spent after 4 such runs (24 calls)
    said = notices(poll_steps(60), stuck_poll_s=60)
    assert [i for i, _ in said] == [24, 48]
    assert "alternated between `wait" in said[0][1] and "This is a loop" in said[0][1]
    assert "The job ends here as failed" in said[1][1]


def test_a_screen_that_changes_starts_the_poll_allowance_again():
    steps = poll_steps(9) + poll_steps(1, screen="a progress bar moved") + poll_steps(9)
    assert notices(steps, stuck_poll_s=60) == []  # 45 s counted, a change, then 45 s again
    assert notices(poll_steps(19), stuck_poll_s=60)  # without the change: stuck


def test_a_command_that_sleeps_before_it_looks_is_a_poll():
    from vmagent.loop.guards import call_step, waited_s
    from vmagent.tools import ToolOutcome

    assert waited_s("run", {"command": "sleep 30; tail -n 1 build.log"}) == 30
    assert waited_s("run", {"command": "sleep 2m && ls"}) == 120
    assert waited_s("run", {"command": "cat missing.txt"}) == 0
    assert waited_s("wait", {"seconds": "oops"}) == 0
    quiet = call_step("run", {"command": "sleep 30; tail -n 1 build.log"},
                      ToolOutcome(ok=True, text="", result={"exit_code": 0, "stdout": "compiling", "stderr": ""}))
    assert notices([quiet] * 29) == []  # 14.5 minutes of the same line
    assert notices([quiet] * 40)[0][0] == 30  # 15 minutes: now it is a loop
    # a command that does not wait is still stuck at its third identical answer
    missing = call_step("run", {"command": "cat missing.txt"},
                        ToolOutcome(ok=True, text="", result={"exit_code": 1, "stdout": "", "stderr": "No such file"}))
    assert notices([missing] * 3)[0][0] == 3
