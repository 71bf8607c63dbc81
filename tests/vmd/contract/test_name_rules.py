"""A name with a trailing newline is refused wherever a name is checked: Python's `$`
matches before a final "\n", so each check is a fullmatch (issue 39, item 6). One case
per entry point; each passed "\n" before."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from vmagent.tools.text_calls import _call_of
from vmd.config.gitea_names import owner_name_problem, repository_name_problem
from vmd.contract.bounds import name_problem
from vmd.contract.params import History
from vmd.guests.windows.scripts import render


def test_the_project_and_owner_rule():
    assert name_problem("project", "demo") is None
    assert name_problem("project", "demo\n") is not None


def test_gitea_repository_and_owner_names():
    assert repository_name_problem("demo") is None and owner_name_problem("alice") is None
    assert repository_name_problem("demo\n") is not None
    assert owner_name_problem("alice\n") is not None


def test_the_history_verbs_commit():
    assert History(project="demo", rev="main").rev == "main"
    with pytest.raises(ValidationError, match="is not one commit"):
        History(project="demo", rev="main\n")


def test_a_powershell_value_cannot_end_in_a_newline():
    assert render("$x = {{N}}", N=3) == "$x = 3"
    with pytest.raises(ValueError, match="must be an integer"):
        render("$x = {{N}}", N="3\n")


def test_a_tool_call_written_as_text_needs_a_whole_name():
    assert _call_of({"name": "run", "arguments": {"command": "ls"}}, {"run"}, True) is not None
    assert _call_of({"name": "run\nx", "arguments": {}}, {"run"}, True) is None


def test_a_session_id_with_a_newline_is_no_session(tmp_path):
    from tests.support.vmd_fakes import LocalMachines, make_config
    from vmd.errors import VerbError
    from vmd.projects.store import ProjectStore
    from vmd.session.session import Session

    config = make_config(tmp_path)
    # A folder of that name, as a guest-chosen string could make one: still no session.
    odd = "s-20261203-230000-abcdef\n"
    (config.sessions_dir / odd).mkdir(parents=True)
    (config.sessions_dir / odd / "session.json").write_text("{}")
    with pytest.raises(VerbError, match="there is no session"):
        Session.load(odd, config, LocalMachines(), ProjectStore(config))
