"""vmd's verdict on the agent's check is worded in one place (vmd/contract/verdict.py Verdict): the
report's headline, the finish's answer, the commit message, the job's end and the eval's
table all say the same words for the same passed / proven / attempts."""

from __future__ import annotations

import pytest

from vmagent.eval.scores import agent_check
from vmagent.loop.fallback_report import verification_of
from vmd.contract.verdict import Verdict
from vmd.session.record import Record
from vmd.session.report import build_report

# passed, proven, attempts -> status, the sentence people read.
TABLE = [
    (True, True, 1, "passed",
     "verified and proven: the check fails on the project as it was before the session"),
    (True, False, 2, "passed_not_proven",
     "passed, not proven: the check also passes on the project as it was before the session, so it does "
     "not prove the work"),
    (True, None, 1, "passed_not_proven",
     "passed, not proven: whether the check needs the work could not be checked"),
    (False, None, 3, "failed", "verification failed: the check did not pass (3 verification runs in all)"),
    (False, None, 1, "failed", "verification failed: the check did not pass (1 verification run in all)"),
    (None, None, 0, "unverified", "not verified: vmd did not run the agent's check to the end of the session"),
]


@pytest.mark.parametrize("passed,proven,attempts,status,sentence", TABLE)
def test_each_verdict_has_one_status_and_one_sentence(passed, proven, attempts, status, sentence):
    verdict = Verdict(passed=passed, proven=proven, attempts=attempts)
    assert verdict.status == status
    assert verdict.sentence() == sentence
    assert sentence.startswith(verdict.label() + ": ")


@pytest.mark.parametrize("passed,proven,attempts,status,sentence", TABLE)
def test_the_report_states_the_verdict_and_the_agent_reads_it_back(tmp_path, passed, proven, attempts,
                                                                  status, sentence):
    record = Record(tmp_path)
    record.append("session", event="open", session_id="s-1", args={"os": "debian", "task": "fix it"})
    baseline = None if not passed else {"exit_code": 1 if proven else 0, "passed": not proven,
                                        "error": "no baseline on this guest" if proven is None else None}
    for n in range(attempts):
        record.append("verification", attempt=n + 1, command="pytest -q", passed=bool(passed) and n == attempts - 1,
                      exit_code=0, duration=0.5, baseline=baseline)
    if passed is not None:
        record.append("outcome", command="pytest -q", cwd=None, expect_exit=0, exit_code=0 if passed else 1,
                      passed=passed, proven=proven, timed_out=False, duration=0.5, output_tail="",
                      baseline=baseline, attempts=attempts, summary="done")
    report = build_report(record.path)
    headline = report.markdown.splitlines()[2]
    assert headline.startswith("**Outcome: ") and Verdict.of_status(report.outcome).label() in headline
    if passed and proven is not True:
        assert Verdict(passed=passed, proven=proven).reason() in headline
    # What vmagent reads back from the report is the verdict vmd recorded.
    assert report.outcome["status"] == status
    assert verification_of(report.outcome) == Verdict(passed=passed, proven=proven, attempts=attempts)


@pytest.mark.parametrize("passed,proven,attempts,status,sentence", TABLE)
def test_the_eval_table_uses_the_same_words(passed, proven, attempts, status, sentence):
    class Run:  # what agent_check reads of a TaskRun
        class outcome:
            verification = Verdict(passed=passed, proven=proven, attempts=attempts)
    assert agent_check(Run) == sentence.split(":")[0]


def test_a_report_from_an_older_vmd_without_attempts_counts_one_run():
    assert verification_of({"status": "failed"}) == Verdict(passed=False, proven=None, attempts=1)
    assert verification_of({}) == Verdict()
