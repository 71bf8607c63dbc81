"""An earlier project folder goes to the attic under a name of its own (vmd/projects/publish.py
`prepare_project`): the time for people and a random part, so that opens of one project
within the same second never meet (the third once failed on the second's folder)."""

from __future__ import annotations

import os

from vmd.projects import publish
from vmd.projects.publish import prepare_project
from vmd.projects.remote import Remote


def test_three_opens_of_a_project_in_one_second_keep_both_earlier_folders(tmp_path, monkeypatch):
    monkeypatch.setattr(publish.time, "strftime", lambda fmt, *a: "20250101-120000")  # one second
    remote = Remote(project="calc", state_dir=tmp_path / "state")
    folder = tmp_path / "projects" / "local" / "calc"
    for n in range(3):
        prepare_project(folder, remote)
        (folder / "mark.txt").write_text(f"open {n}\n")
    kept = sorted((tmp_path / "state" / "attic" / "local").iterdir())
    assert len(kept) == 2 and all(k.name.startswith("calc-20250101-120000-") for k in kept)
    assert sorted((k / "mark.txt").read_text() for k in kept) == ["open 0\n", "open 1\n"]
    assert (folder / "mark.txt").read_text() == "open 2\n"
    assert os.stat(tmp_path / "state" / "attic").st_mode & 0o077 == 0
