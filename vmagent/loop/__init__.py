"""The turn loop: one job, from the task to a report (turns.py), and what it stands on: the
job's state and transcript (job.py), the machine's hand-over (hand_over.py), the guards
(guards.py) and the loop's own sentences (words.py), compaction (compact.py,
token_estimate.py), a cancel's break-off (break_off.py), the one way out (job_end.py,
fallback_report.py), and a job run again after its host was lost (rerun.py).

Named here: the entry points and the types their callers hold.
"""

from vmagent.loop.job import Event, JobSpec, Outcome, Verification
from vmagent.loop.rerun import rerun_job
from vmagent.loop.turns import resume_job, run_job

__all__ = ["run_job", "resume_job", "rerun_job", "JobSpec", "Outcome", "Verification", "Event"]
