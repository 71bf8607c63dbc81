"""Tool schemas and tolerant argument parsing. The tools' arguments are vmd/contract/params.py's
params models themselves; what vmagent reads leniently must be what those models accept.
A tool call against vmd and its result are in tests/vmagent/tools/test_tool_results.py.
"""

from __future__ import annotations

import json

import pytest

from vmagent import tools
from vmd.contract.params import Finish, Run, VERBS


def names(schema_list: list[dict]) -> list[str]:
    return [s["function"]["name"] for s in schema_list]


# --- schemas ---------------------------------------------------------------------------

def test_planning_phase_offers_only_the_planning_tools():
    for os_family in ("linux", "windows"):
        for desktop in (False, True):
            offered = names(tools.schemas(os_family, "planning", desktop))
            assert offered == ["plan_tasks", "add_task", "update_task", "ask_user"]


def test_working_phase_offers_the_shell_files_and_finish():
    offered = set(names(tools.schemas("linux", "working", False)))
    for name in ("run", "read_file", "write_file", "append_file", "edit_file", "list_dir",
                 "git_commit", "check_internet", "ask_user", "request_unfreeze", "finish",
                 "add_task", "update_task"):
        assert name in offered
    assert "reboot_vm" not in offered and "session_close" not in offered


def test_without_a_desktop_no_screen_tools_are_offered():
    offered = set(names(tools.schemas("linux", "working", False)))
    assert not offered & set(tools.SCREEN_TOOLS)
    with_desktop = set(names(tools.schemas("linux", "working", True)))
    assert set(tools.SCREEN_TOOLS) <= with_desktop


def test_every_tool_takes_its_vmd_verbs_own_params_model():
    # One contract: the model the tool is validated against is the one vmd validates.
    for name, tool in tools.TOOLS.items():
        assert tool.args is (tool.host_params or VERBS[name]), name
    # ... except the tools vmagent runs on the host itself, which are no verbs of vmd.
    assert {n for n, t in tools.TOOLS.items() if t.host_params} == set(tools.WEB_TOOLS)
    assert not set(tools.WEB_TOOLS) & set(VERBS)


def test_every_described_field_is_a_field_of_the_verbs_model():
    # A description of a field the verb does not have (renamed in vmd/contract/params.py) would
    # describe nothing; "verification.command" is a field of the nested model.
    for name, tool in tools.TOOLS.items():
        for path in tool.fields:
            node = tools.json_schema(tool.args)
            for field in path.split("."):
                assert field in node.get("properties", {}), f"{name}: {path} is not a field of {tool.args.__name__}"
                node = node["properties"][field]


# Fields the model reads by their name and type alone: a description of them would cost
# every request tokens and say nothing more (tests/vmagent/test_fixed_prompt.py counts them).
NAMED_ENOUGH = {"command", "content", "path", "old", "new", "message", "question", "summary", "text", "keys",
                "x", "y", "url", "query", "tasks", "title", "id", "status", "button", "double", "args",
                "limit", "cwd", "max_chars", "offset"}


def test_every_field_the_model_is_offered_is_described_or_named_enough():
    for os_family in ("linux", "windows"):
        for schema in tools.schemas(os_family, "working", True):
            for field, node in schema["function"]["parameters"]["properties"].items():
                assert node.get("description") or field in NAMED_ENOUGH, (schema["function"]["name"], field)


def test_defaults_and_limits_in_descriptions_are_vmds():
    run = json.loads(description("linux", "run"))["function"]["parameters"]["properties"]
    timeout = Run.model_fields["timeout"].default
    maximum = Run.model_json_schema()["properties"]["timeout"]["maximum"]
    # Said once, in the words the model reads: not again as the schema's keys.
    assert run["timeout"]["description"] == f"Seconds before it is killed (default {timeout:g}, at most {maximum:g})."
    assert "default" not in run["timeout"] and "maximum" not in run["timeout"]
    assert "{maximum}" not in description("linux", "wait") and "At most 600." in description("linux", "wait")


def test_schemas_have_the_function_tool_shape():
    for os_family in ("linux", "windows"):
        for schema in tools.schemas(os_family, "working", True):
            assert schema["type"] == "function"
            fn = schema["function"]
            assert fn["name"] and fn["description"]
            params = fn["parameters"]
            assert params["type"] == "object"
            assert isinstance(params["properties"], dict)
            assert set(params["required"]) <= set(params["properties"])
            text = json.dumps(schema)
            assert "$ref" not in text and "anyOf" not in text and "{project}" not in text
            json.dumps(schema)  # plain JSON all the way down


def description(os_family: str, name: str) -> str:
    for schema in tools.schemas(os_family, "working", True):
        if schema["function"]["name"] == name:
            return json.dumps(schema)
    raise AssertionError(f"{name} not offered")


def test_windows_descriptions_speak_powershell_and_the_z_drive():
    run = description("windows", "run")
    assert "PowerShell 5.1" in run and "&&" in run and "bash" not in run
    assert "Z:\\\\" in description("windows", "read_file")  # escaped once by json.dumps
    assert "/mnt/project" not in json.dumps(tools.schemas("windows", "working", True))
    assert "Z:\\\\" in description("windows", "finish")
    assert "bash" not in description("windows", "finish")


def test_linux_descriptions_speak_bash_and_mnt_project():
    run = description("linux", "run")
    assert "bash" in run and "sudo" in run
    assert "PowerShell" not in json.dumps(tools.schemas("linux", "working", True))
    assert "/mnt/project" in description("linux", "read_file")


def test_an_os_name_is_read_as_its_family():
    assert tools.schemas("debian", "working", False) == tools.schemas("linux", "working", False)
    assert tools.schemas("win11", "working", False) == tools.schemas("windows", "working", False)


@pytest.mark.parametrize("os_family", ["linux", "windows"])
def test_finish_says_where_its_check_runs_and_where_the_rules_are(os_family):
    # What a good check is is said once, in the system prompt (tests/vmagent/test_prompts.py): the
    # tool says where its check runs and points there.
    text = tools.TOOLS["finish"].describe(os_family)
    assert "fresh machine" in text and "system prompt" in text


def test_the_verification_shape_reaches_the_model_through_ollamas_client():
    # The client drops a nested object's fields: only the description tells the model the shape.
    from vmagent.models.ollama.wire import wire_tools

    for os_family, shell in (("linux", "bash"), ("windows", "PowerShell 5.1")):
        [finish] = [t for t in wire_tools(tools.schemas(os_family, "working", False))
                    if t["function"]["name"] == "finish"]
        verification = finish["function"]["parameters"]["properties"]["verification"]
        assert "properties" not in verification
        assert '"command"' in verification["description"] and '"expect_exit"' in verification["description"]
        assert shell in verification["description"]


# --- parsing ---------------------------------------------------------------------------

def test_a_dict_is_taken_as_it_is():
    parsed = tools.parse_arguments("run", {"command": "ls", "timeout": 10})
    assert parsed.ok and parsed.params == {"command": "ls", "timeout": 10.0}


def test_a_json_string_is_decoded():
    parsed = tools.parse_arguments("write_file", '{"path": "/mnt/project/a.txt", "content": "hi"}')
    assert parsed.params == {"path": "/mnt/project/a.txt", "content": "hi"}


def test_broken_json_is_repaired():
    assert tools.parse_arguments("run", '{"command": "make test"').params == {"command": "make test"}
    assert tools.parse_arguments("read_file", "{'path': 'a.py',}").params == {"path": "a.py"}


def test_json_inside_a_json_string_is_decoded():
    raw = json.dumps(json.dumps({"command": "pwd"}))
    assert tools.parse_arguments("run", raw).params == {"command": "pwd"}


def test_a_bare_string_is_the_tools_main_field():
    assert tools.parse_arguments("run", "ls -la").params == {"command": "ls -la"}
    assert tools.parse_arguments("read_file", "/etc/hostname").params == {"path": "/etc/hostname"}
    assert tools.parse_arguments("ask_user", "Which port?").params == {"question": "Which port?"}
    assert tools.parse_arguments("wait", "5").params == {"seconds": 5.0}


def test_a_shell_command_with_braces_is_not_mistaken_for_json():
    command = "{ make; make test; } 2>&1 | tail -5"
    assert tools.parse_arguments("run", command).params == {"command": command}


def test_a_plan_may_come_as_lines_or_a_list_of_objects():
    assert tools.parse_arguments("plan_tasks", "- install\n- build\n3. test").params == {
        "tasks": ["install", "build", "test"]}
    assert tools.parse_arguments("plan_tasks", ["a", "b"]).params == {"tasks": ["a", "b"]}
    assert tools.parse_arguments(
        "plan_tasks", {"tasks": [{"title": "a"}, {"name": "b"}, "c"]}).params == {
        "tasks": ["a", "b", "c"]}


def test_common_aliases_are_mapped_to_the_real_field_names():
    assert tools.parse_arguments("run", {"cmd": "ls"}).params == {"command": "ls"}
    assert tools.parse_arguments("write_file", {"filename": "a", "contents": "x"}).params == {
        "path": "a", "content": "x"}
    assert tools.parse_arguments("write_file", {"file": "a", "text": "x"}).params == {
        "path": "a", "content": "x"}
    assert tools.parse_arguments("edit_file", {"path": "a", "old_str": "x", "new_str": "y"}
                                 ).params == {"path": "a", "old": "x", "new": "y"}
    assert tools.parse_arguments("update_task", {"task_id": "#2", "status": "completed"}
                                 ).params == {"id": 2, "status": "done"}


def test_unknown_fields_are_dropped_with_a_note():
    parsed = tools.parse_arguments("run", {"command": "ls", "verbose": True})
    assert parsed.ok and parsed.params == {"command": "ls"}
    assert any("verbose" in note and '"command": string' in note for note in parsed.notes)


def test_the_proper_name_wins_over_its_alias():
    parsed = tools.parse_arguments("run", {"cmd": "pwd", "command": "ls"})
    assert parsed.params == {"command": "ls"}
    assert any("cmd" in note for note in parsed.notes)


def test_arguments_wrapped_in_an_arguments_object_are_unwrapped():
    assert tools.parse_arguments("run", {"arguments": {"command": "ls"}}).params == {"command": "ls"}
    assert tools.parse_arguments("run", {"arguments": '{"command": "ls"}'}).params == {"command": "ls"}


def test_a_missing_field_gives_an_error_that_names_the_shape():
    parsed = tools.parse_arguments("run", {"timeout": 5})
    assert not parsed.ok and parsed.params is None
    assert parsed.error.startswith(
        'run needs {"command": string, "timeout"?: number, "cwd"?: string}; you sent')
    assert '"timeout": 5' in parsed.error and "command is missing" in parsed.error


def test_a_wrong_type_gives_an_error_that_names_the_shape():
    parsed = tools.parse_arguments("click", {"x": "left side", "y": 3})
    assert not parsed.ok and '"x": integer' in parsed.error and "x:" in parsed.error
    parsed = tools.parse_arguments("update_task", {"id": 1, "status": "half way"})
    assert not parsed.ok and '"pending"|"in_progress"|"done"|"blocked"' in parsed.error


def test_a_bare_string_for_a_tool_without_a_main_field_is_an_error():
    parsed = tools.parse_arguments("write_file", "print('hi')")
    assert not parsed.ok
    assert 'write_file needs {"path": string, "content": string}' in parsed.error


def test_finish_verification_given_as_a_string_is_accepted():
    parsed = tools.parse_arguments("finish", {"summary": "done", "verification": "pytest -q"})
    assert parsed.ok
    # vmd reads it the same way; check that our reading is one vmd accepts.
    Finish.model_validate(parsed.params)
    assert parsed.params["verification"]["command"] == "pytest -q"


def test_what_parsing_accepts_vmd_accepts():
    samples = {
        "run": "ls", "read_file": "/etc/hostname", "list_dir": {}, "git_commit": "wip",
        "write_file": {"file": "a", "contents": "x"}, "append_file": {"path": "a", "content": "y"},
        "edit_file": {"path": "a", "old": "x", "new": "y"}, "plan_tasks": "a\nb",
        "add_task": "c", "update_task": {"id": "1", "status": "in progress"},
        "screenshot": "", "click": {"x": 10.4, "y": "20"}, "move": {"x": 1, "y": 2},
        "type": "hello", "key": ["ctrl", "s"], "scroll": {"x": 1, "y": 2, "delta": -3},
        "launch_app": {"path": "xterm", "args": "-e top"}, "wait": 2,
        "check_internet": None, "ask_user": "why?", "request_unfreeze": "pip install",
        "finish": {"summary": "s", "verify": "true"},
        "web_search": "python json", "read_page": {"link": "https://docs.python.org/3/", "start": 10},
    }
    assert set(samples) == set(tools.TOOLS)
    for name, raw in samples.items():
        parsed = tools.parse_arguments(name, raw)
        assert parsed.ok, (name, parsed.error)
        tools.TOOLS[name].args.model_validate(parsed.params)


def test_parsing_never_raises_on_garbage():
    for raw in (None, 42, 3.5, True, [], [1, 2], b"\xff\xfe", "{{{", "[", '"', object(),
                {"command": None}, {1: 2}, {"arguments": 5}):
        for name in tools.TOOLS:
            parsed = tools.parse_arguments(name, raw)
            assert parsed.ok or parsed.error


def test_the_family_vmd_answers_wins_over_the_images_name():
    assert tools.os_family_of("wintermute", "linux") == "linux"
    assert tools.os_family_of("corp-desktop", "windows") == "windows"
    # No answer (a vmd before session_open said the family), or one no wording exists for:
    # the name is read.
    assert tools.os_family_of("win11", None) == "windows" and tools.os_family_of("debian", None) == "linux"
    assert tools.os_family_of("Windows Server", "plan9") == "windows"


def test_the_os_family_is_decided_in_one_place():
    # The prompts and the tool table each guessed the family from the image's name; both
    # ask vmagent/os_family.py now, and every family it knows is worded by the table.
    from pathlib import Path

    from vmagent.os_family import FAMILIES, os_family_of

    root = Path(__file__).resolve().parents[3] / "vmagent"
    guessing = sorted(str(path.relative_to(root)) for path in root.rglob("*.py")
                      if '.startswith("win")' in path.read_text())
    assert guessing == ["os_family.py"], guessing
    assert set(tools.OS_WORDS) == set(FAMILIES)
    assert tools.os_family_of is os_family_of
    assert os_family_of("wintermute", "linux") == "linux" and os_family_of("Win11") == "windows"
