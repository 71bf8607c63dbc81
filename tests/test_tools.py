"""Tool schemas, tolerant argument parsing and tool calls, against a stand-in for vmd.

The stand-in is a plain object with a `.call(method, **params)` like vmagent.client.Vmd;
vmd's own verb table (vmd/verbs.py) is imported only to check the schemas against it.
"""

from __future__ import annotations

import json

import pytest

from vmagent import tools
from vmagent.client import VmdError, VmdUnavailable
from vmd import verbs


class FakeVmd:
    """Answers each verb from a table; records what it was asked."""

    def __init__(self, answers: dict | None = None, raises: Exception | None = None):
        self.answers = answers or {}
        self.raises = raises
        self.calls: list[tuple[str, dict]] = []

    def call(self, method: str, **params):
        self.calls.append((method, params))
        if self.raises is not None:
            raise self.raises
        answer = self.answers.get(method, {"text": f"{method} ok"})
        return answer(params) if callable(answer) else answer


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


def without_descriptions(node):
    if isinstance(node, dict):
        return {k: without_descriptions(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [without_descriptions(v) for v in node]
    return node


def test_every_offered_tool_is_a_vmd_verb_with_the_same_fields_types_and_limits():
    # vmagent keeps its own copy of the argument shapes (it may not import vmd); this
    # catches drift: names, required fields, types, enums, bounds and defaults must agree.
    for name in tools.TOOLS:
        assert name in verbs.VERBS, f"{name} is offered but vmd has no such verb"
        ours = without_descriptions(tools.json_schema(tools.TOOLS[name].args))
        theirs = without_descriptions(tools.json_schema(verbs.VERBS[name]))
        assert ours == theirs, name


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
    assert "PowerShell 5.1" in run and "&&" in run and "$LASTEXITCODE" in run
    assert "Z:\\\\" in run  # escaped once by json.dumps
    assert "/mnt/project" not in json.dumps(tools.schemas("windows", "working", True))
    assert "Z:\\\\" in description("windows", "finish")
    assert "bash" not in description("windows", "finish")


def test_linux_descriptions_speak_bash_and_mnt_project():
    run = description("linux", "run")
    assert "bash" in run and "/mnt/project" in run
    assert "PowerShell" not in json.dumps(tools.schemas("linux", "working", True))
    assert "/mnt/project" in description("linux", "read_file")


def test_an_os_name_is_read_as_its_family():
    assert tools.schemas("debian", "working", False) == tools.schemas("linux", "working", False)
    assert tools.schemas("win11", "working", False) == tools.schemas("windows", "working", False)


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
    verbs.Finish.model_validate(parsed.params)
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
    }
    assert set(samples) == set(tools.TOOLS)
    for name, raw in samples.items():
        parsed = tools.parse_arguments(name, raw)
        assert parsed.ok, (name, parsed.error)
        verbs.VERBS[name].model_validate(parsed.params)


def test_parsing_never_raises_on_garbage():
    for raw in (None, 42, 3.5, True, [], [1, 2], b"\xff\xfe", "{{{", "[", '"', object(),
                {"command": None}, {1: 2}, {"arguments": 5}):
        for name in tools.TOOLS:
            parsed = tools.parse_arguments(name, raw)
            assert parsed.ok or parsed.error


# --- calls -----------------------------------------------------------------------------

def test_a_vmd_error_becomes_an_error_text():
    vmd = FakeVmd(raises=VmdError(-32001, "no such file: /nope", "read_file"))
    outcome = tools.call(vmd, "read_file", {"path": "/nope"})
    assert outcome.text == "ERROR: no such file: /nope"
    assert not outcome.ok and outcome.verb == "read_file" and outcome.state is None


def test_vmd_unavailable_reaches_the_loop():
    vmd = FakeVmd(raises=VmdUnavailable("vmd closed the connection during run"))
    with pytest.raises(VmdUnavailable):
        tools.call(vmd, "run", {"command": "ls"})


def test_any_other_exception_becomes_an_internal_error_text():
    vmd = FakeVmd(raises=KeyError("boom"))
    outcome = tools.call(vmd, "run", "ls")
    assert outcome.text.startswith("ERROR: internal: KeyError") and not outcome.ok


def test_an_unknown_tool_lists_the_valid_names():
    vmd = FakeVmd()
    outcome = tools.call(vmd, "execute_shell", {"command": "ls"})
    assert not outcome.ok and "execute_shell" in outcome.text
    assert "run" in outcome.text and "finish" in outcome.text
    assert vmd.calls == []


def test_a_tool_not_offered_this_turn_is_refused_without_calling_vmd():
    vmd = FakeVmd()
    outcome = tools.call(vmd, "run", "ls", offered=tools.tool_names("planning", False))
    assert not outcome.ok and "plan_tasks" in outcome.text and vmd.calls == []


def test_bad_arguments_never_reach_vmd():
    vmd = FakeVmd()
    outcome = tools.call(vmd, "write_file", "just some text")
    assert not outcome.ok and outcome.text.startswith("ERROR: write_file needs")
    assert vmd.calls == []


def test_run_result_is_formatted_with_exit_code_time_and_streams():
    vmd = FakeVmd({"run": {"exit_code": 2, "stdout": "a\nb\n", "stderr": "oops\n",
                           "duration": 1.234, "truncated": False, "timed_out": False,
                           "text": "exit 2"}})
    outcome = tools.call(vmd, "run", '{"cmd": "make"}')
    assert vmd.calls == [("run", {"command": "make"})]
    assert outcome.text == "exit 2 (1.2 s)\na\nb\n[stderr]\noops"
    assert outcome.ok and outcome.result["exit_code"] == 2 and outcome.image_b64 is None


def test_run_notes_a_timeout_and_truncated_output():
    vmd = FakeVmd({"run": {"exit_code": 124, "stdout": "", "stderr": "", "duration": 10.0,
                           "truncated": True, "timed_out": True, "text": ""}})
    outcome = tools.call(vmd, "run", {"command": "sleep 99", "timeout": 10})
    assert outcome.text.startswith("exit 124 (10.0 s)\n(no output)")
    assert "timed out" in outcome.text and "10 s" in outcome.text
    assert "truncated" in outcome.text


def test_dropped_fields_are_noted_in_the_result():
    vmd = FakeVmd({"run": {"exit_code": 0, "stdout": "ok", "stderr": "", "duration": 0.1}})
    outcome = tools.call(vmd, "run", {"command": "true", "shell": "zsh", "color": "red"})
    assert vmd.calls == [("run", {"command": "true"})]
    assert outcome.text.startswith("exit 0 (0.1 s)\nok") and "'color'" in outcome.text


def test_read_file_shows_content_and_where_to_read_on():
    vmd = FakeVmd({"read_file": {"content": "hello", "size": 12, "offset": 0,
                                 "truncated": True, "text": ""}})
    outcome = tools.call(vmd, "read_file", "/mnt/project/x.txt")
    assert "/mnt/project/x.txt (12 bytes)" in outcome.text and "hello" in outcome.text
    assert "offset=5" in outcome.text


def test_screenshot_gives_a_short_text_and_the_image():
    vmd = FakeVmd({"screenshot": {"width": 1280, "height": 800, "scale": 1.0, "path": "s.png",
                                  "png_base64": "iVBORw0KGgo=", "text": "screenshot"}})
    outcome = tools.call(vmd, "screenshot", {})
    assert outcome.image_b64 == "iVBORw0KGgo=" and "1280x800" in outcome.text
    assert "iVBOR" not in outcome.text and len(outcome.text) < 200


def test_list_dir_lists_entries():
    vmd = FakeVmd({"list_dir": {"entries": [{"name": "src", "type": "dir", "size": 0},
                                            {"name": "a.py", "type": "file", "size": 10}],
                                "text": ""}})
    outcome = tools.call(vmd, "list_dir", {"dir": "/mnt/project"})
    assert "src/" in outcome.text and "a.py  (10 bytes)" in outcome.text


def test_ask_user_and_request_unfreeze_stop_the_loop():
    vmd = FakeVmd({"ask_user": {"state": "question", "text": "Asked; waiting."},
                   "request_unfreeze": {"state": "unfreeze", "text": "Requested."}})
    assert tools.call(vmd, "ask_user", "Which database?").state == "question"
    assert tools.call(vmd, "request_unfreeze", {"why": "pip"}).state == "unfreeze"


def test_finish_refused_and_accepted_pass_vmds_text_through():
    refused = FakeVmd({"finish": {"accepted": False,
                                  "text": "REFUSED: task 2 is still in_progress."}})
    outcome = tools.call(refused, "finish", {"summary": "x", "verification": "true"})
    assert outcome.text == "REFUSED: task 2 is still in_progress."
    assert not outcome.ok and outcome.state is None
    assert refused.calls == [("finish", {"summary": "x", "verification": {"command": "true"}})]

    accepted = FakeVmd({"finish": {"accepted": True, "outcome": {"exit_code": 0},
                                   "text": "Accepted: verification `true` exited 0."}})
    outcome = tools.call(accepted, "finish", {"summary": "x", "verification": {"command": "true"}})
    assert outcome.ok and outcome.state == "finished" and "exited 0" in outcome.text


def test_a_refused_verification_reaches_the_model_and_the_loop_goes_on():
    text = ("REFUSED: your verification failed, so the work is not done yet. vmd ran `pytest -q`: "
            "exit 1 (expected 0) after 2.1 s.\nOutput tail:\nE   assert 2 == 3")
    vmd = FakeVmd({"finish": {"accepted": False, "outcome": None, "text": text,
                              "attempt": {"attempt": 1, "command": "pytest -q", "exit_code": 1}}})
    outcome = tools.call(vmd, "finish", {"summary": "x", "verification": "pytest -q"})
    assert outcome.text == text and not outcome.ok and outcome.state is None


@pytest.mark.parametrize("os_family", ["linux", "windows"])
def test_finish_says_what_a_good_check_is(os_family):
    text = tools.TOOLS["finish"].describe(os_family)
    assert "fails before the work and passes after it" in text
    assert "`true`" in text and "`test -d`" in text and "asserts nothing" in text
    assert "as it was before the session" in text and "not proven" in text
    assert "A check that fails is refused" in text


def test_the_verification_shape_reaches_the_model_through_ollamas_client():
    # The client drops a nested object's fields: only the description tells the model the shape.
    from vmagent.llm import wire_tools

    for os_family, shell in (("linux", "bash"), ("windows", "PowerShell 5.1")):
        [finish] = [t for t in wire_tools(tools.schemas(os_family, "working", False))
                    if t["function"]["name"] == "finish"]
        verification = finish["function"]["parameters"]["properties"]["verification"]
        assert "properties" not in verification
        assert '"command"' in verification["description"] and '"expect_exit"' in verification["description"]
        assert shell in verification["description"]


def test_task_verbs_show_the_task_list():
    vmd = FakeVmd({"plan_tasks": {"tasks": "1. [ ] build\n2. [ ] test", "text": "Planned 2 tasks."}})
    outcome = tools.call(vmd, "plan_tasks", ["build", "test"])
    assert "Planned 2 tasks." in outcome.text and "2. [ ] test" in outcome.text


def test_a_result_in_an_unexpected_shape_still_gives_text():
    vmd = FakeVmd({"run": {"text": "weird but readable"}, "read_file": ["not", "a", "dict"]})
    assert tools.call(vmd, "run", "ls").text == "weird but readable"
    outcome = tools.call(vmd, "read_file", "a")
    assert outcome.text and outcome.verb == "read_file"


def test_a_namespaced_or_capitalised_tool_name_is_understood():
    vmd = FakeVmd()
    assert tools.call(vmd, "functions.run", "ls").verb == "run"
    assert tools.call(vmd, " Run ", "ls").ok
    assert [c[0] for c in vmd.calls] == ["run", "run"]
