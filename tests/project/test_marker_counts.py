"""The counts `.ci/run` checks (tests/conftest.py): a test counts for a marker only when it
carries that marker, whatever its folders are called, and the suite's time is reported by
marker, worker and module."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_folder_named_like_a_marker_does_not_count_for_it(tmp_path):
    # tests/vmagent/fleet/ holds tests of vmagent.fleet that are not the compose fleet's
    # (marker `fleet`): counted as theirs, they would let CI pass with every fleet test gone.
    report = tmp_path / "marked.json"
    env = {**os.environ, "MARKED_TESTS_REPORT": str(report)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "tests/vmagent/fleet/test_ray_config.py"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    counts = json.loads(report.read_text())
    assert counts["fleet"] == {} and counts["ray"] == {}
    seconds = counts["seconds"]
    assert set(seconds["marker"]) == {"rest"} and seconds["marker"]["rest"] > 0
    assert list(seconds["module"]) == ["tests/vmagent/fleet/test_ray_config.py"]
    assert list(seconds["worker"]) == ["main"]
