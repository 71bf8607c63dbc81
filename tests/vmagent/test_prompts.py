"""Loading the agent's prompts from configs/agent or a directory named by VMAGENT_PROMPTS."""

from __future__ import annotations

import pytest

from vmagent import prompts
from vmagent.prompts import PromptMissing, load_prompts


@pytest.fixture
def prompt_dir(tmp_path):
    d = tmp_path / "agent"
    d.mkdir()
    (d / "prompt.md").write_text("MAIN\n")
    (d / "prompt.linux.md").write_text("LINUX\n")
    (d / "prompt.windows.md").write_text("WINDOWS\n")
    (d / "prompt.screen.md").write_text("SCREEN\n")
    return d


def test_parts_are_joined_in_order_main_os_screen(prompt_dir):
    loaded = load_prompts("linux", desktop=True, prompts_dir=prompt_dir)
    assert loaded.system == "MAIN\n\nLINUX\n\nSCREEN\n"
    assert loaded.warnings == []


def test_without_a_desktop_the_screen_part_is_left_out(prompt_dir):
    loaded = load_prompts("windows", desktop=False, prompts_dir=prompt_dir)
    assert loaded.system == "MAIN\n\nWINDOWS\n"


def test_an_os_name_selects_its_family_part(prompt_dir):
    assert "LINUX" in load_prompts("debian", False, prompt_dir).system
    assert "WINDOWS" in load_prompts("win11", False, prompt_dir).system


def test_missing_optional_parts_are_warnings_not_failures(prompt_dir):
    (prompt_dir / "prompt.windows.md").unlink()
    (prompt_dir / "prompt.screen.md").unlink()
    loaded = load_prompts("windows", desktop=True, prompts_dir=prompt_dir)
    assert loaded.system == "MAIN\n"
    assert len(loaded.warnings) == 2
    assert any("prompt.windows.md" in w for w in loaded.warnings)
    assert any("prompt.screen.md" in w for w in loaded.warnings)


def test_the_environment_variable_names_the_directory(prompt_dir, monkeypatch):
    monkeypatch.setenv("VMAGENT_PROMPTS", str(prompt_dir))
    loaded = load_prompts("linux", desktop=False)
    assert loaded.system.startswith("MAIN")
    assert loaded.sources[0] == prompt_dir / "prompt.md"


def test_missing_prompt_md_names_every_place_looked_in(tmp_path, monkeypatch):
    env_dir, repo_dir = tmp_path / "from-env", tmp_path / "repo-agent"
    env_dir.mkdir()
    monkeypatch.setenv("VMAGENT_PROMPTS", str(env_dir))
    monkeypatch.setattr(prompts, "REPO_PROMPTS_DIR", repo_dir)
    with pytest.raises(PromptMissing) as caught:
        load_prompts("linux", desktop=False)
    message = str(caught.value)
    assert str(env_dir / "prompt.md") in message
    assert str(repo_dir / "prompt.md") in message
    assert "VMAGENT_PROMPTS" in message


def test_an_empty_prompt_md_counts_as_missing(tmp_path):
    (tmp_path / "prompt.md").write_text("  \n")
    with pytest.raises(PromptMissing, match="empty"):
        load_prompts("linux", desktop=False, prompts_dir=tmp_path)


def test_a_directory_without_prompt_md_falls_back_to_the_repo_with_a_warning(tmp_path, monkeypatch):
    monkeypatch.setenv("VMAGENT_PROMPTS", str(tmp_path))
    loaded = load_prompts("linux", desktop=False)
    assert loaded.sources[0] == prompts.REPO_PROMPTS_DIR / "prompt.md"
    assert any(str(tmp_path / "prompt.md") in w for w in loaded.warnings)


def test_the_repositorys_own_prompts_load_complete(monkeypatch):
    monkeypatch.delenv("VMAGENT_PROMPTS", raising=False)
    for os_family, words in (("linux", ("/mnt/project", "apt-get")),
                             ("windows", ("Z:\\", "PowerShell 5.1", "$LASTEXITCODE"))):
        loaded = load_prompts(os_family, desktop=True)
        assert loaded.warnings == []
        for word in ("plan_tasks", "update_task", "finish", "ask_user", "request_unfreeze",
                     "screenshot", *words):
            assert word in loaded.system, (os_family, word)


def test_the_repositorys_prompts_name_only_tools_that_exist():
    import re

    from vmagent import tools

    text = "".join(p.read_text() for p in prompts.REPO_PROMPTS_DIR.glob("prompt*.md"))
    named = set(re.findall(r"`([a-z_]+)`", text))
    tool_like = {n for n in named if "_" in n and n.split("_")[0] in {
        "plan", "add", "update", "read", "write", "append", "edit", "list", "git", "launch",
        "check", "ask", "request"}}
    assert tool_like <= set(tools.TOOLS), tool_like - set(tools.TOOLS)


def test_the_repositorys_prompt_says_what_a_good_check_is():
    text = " ".join((prompts.REPO_PROMPTS_DIR / "prompt.md").read_text().split())  # as read, unwrapped
    assert "fails before your work and passes after it" in text
    assert "never `true` or a test that asserts nothing" in text
    assert "project as it was before: passing there too proves nothing" in text
    assert "fresh machine holding that" in text and "give install steps as `setup`" in text
    assert "A failing check is refused: fix the cause and finish again" in text


def test_the_prompts_state_runs_default_timeout_as_the_contract_has_it():
    # The prompts are text a person may edit, so they cannot read vmd/contract/params.py; this keeps
    # the shipped ones from telling the model a default that run does not have.
    import re
    from pathlib import Path

    from vmd.contract.params import Run

    default = Run.model_fields["timeout"].default
    shells = [Path(__file__).resolve().parents[2] / "configs" / "agent" / f"prompt.{os}.md" for os in ("linux", "windows")]
    stated = {p.name: re.findall(r"default (\d+) s", p.read_text()) for p in shells}
    assert all(stated.values()), stated  # each shell's prompt names the default
    assert all(float(n) == default for found in stated.values() for n in found), (stated, default)
