"""Tool calls a model wrote as text in its content are found, in each shape real models use."""

from __future__ import annotations

import json

from vmagent import tools
from vmagent.tools import calls_in_text
from vmagent.tools import TOOLS


def test_a_whole_content_json_object_naming_a_tool_is_a_call():
    [call] = calls_in_text('{"name": "run", "arguments": {"command": "ls"}}', TOOLS)
    assert (call.name, call.arguments) == ("run", {"command": "ls"})


def test_parameters_is_read_like_arguments():
    [call] = calls_in_text('{"name": "read_file", "parameters": {"path": "a.txt"}}', TOOLS)
    assert (call.name, call.arguments) == ("read_file", {"path": "a.txt"})


def test_tool_call_tags_hold_one_call_each():
    text = ('I will look first.\n<tool_call>\n{"name": "list_dir", "arguments": {"path": "."}}\n</tool_call>\n'
            '<tool_call>{"name": "run", "arguments": {"command": "pwd"}}</tool_call>')
    assert [(c.name, c.arguments) for c in calls_in_text(text, TOOLS)] == [
        ("list_dir", {"path": "."}), ("run", {"command": "pwd"})]


def test_a_fenced_json_block_is_a_call():
    text = 'Next:\n```json\n{"name": "run", "arguments": {"command": "make test"}}\n```\n'
    [call] = calls_in_text(text, TOOLS)
    assert (call.name, call.arguments) == ("run", {"command": "make test"})


def test_prose_and_json_that_names_no_known_tool_are_not_calls():
    assert calls_in_text("I think the build is fine now.", TOOLS) == []
    assert calls_in_text('{"name": "Alice", "age": 3}', TOOLS) == []
    assert calls_in_text('The config:\n```json\n{"name": "web", "port": 80, "arguments": []}\n```', TOOLS) == []
    assert calls_in_text('```json\n{"version": 2}\n```', TOOLS) == []
    assert calls_in_text("", TOOLS) == []


def found(text: str) -> list[tuple[str, object]]:
    return [(c.name, c.arguments) for c in calls_in_text(text, TOOLS)]


def test_several_objects_one_after_another_are_calls_in_order():
    # Llama 3.x writes one call a line, with "parameters"; any whitespace, `;` or nothing between
    lines = ('{"name": "list_dir", "parameters": {"path": "."}}\n'
             '{"name": "run", "parameters": {"command": "pwd"}}\n\n  {"name": "read_file", "parameters": {"path": "a"}}')
    assert found(lines) == [("list_dir", {"path": "."}), ("run", {"command": "pwd"}), ("read_file", {"path": "a"})]
    packed = '{"name": "run", "arguments": {"command": "a"}}{"name": "run", "arguments": {"command": "b"}}; ' \
             '{"name": "run", "arguments": {"command": "c"}}'
    assert [a["command"] for _, a in found(packed)] == ["a", "b", "c"]


def test_calls_on_their_own_lines_among_prose_are_found():
    text = 'First I look, then I build:\n{"name": "list_dir", "arguments": {"path": "."}}\nand then\n' \
           '{"name": "run", "arguments": {"command": "make"}}\nThat should do.'
    assert found(text) == [("list_dir", {"path": "."}), ("run", {"command": "make"})]


def test_arguments_given_as_a_json_string_are_kept_for_the_tool_to_read():
    [(name, arguments)] = found('{"name": "run", "arguments": "{\\"command\\": \\"ls -l\\"}"}')
    assert name == "run" and json.loads(arguments) == {"command": "ls -l"}
    assert tools.parse_arguments("run", arguments).params == {"command": "ls -l"}


def test_arguments_beside_the_name_and_the_openai_wrapper():
    assert found('{"name": "run", "command": "pwd"}') == [("run", {"command": "pwd"})]
    assert found('{"type": "function", "function": {"name": "functions.run", "arguments": {"command": "id"}}}') == [
        ("run", {"command": "id"})]


def test_llamas_python_tag_prefix():
    text = '<|python_tag|>{"name": "run", "parameters": {"command": "ls"}}<|eom_id|>'
    assert found(text) == [("run", {"command": "ls"})]
    two = '<|python_tag|>{"name": "run", "parameters": {"command": "a"}}; {"name": "run", "parameters": ' \
          '{"command": "b"}}<|eot_id|>'
    assert [a["command"] for _, a in found(two)] == ["a", "b"]


def test_mistrals_tool_calls_prefix_with_an_array_or_named_args():
    text = '[TOOL_CALLS] [{"name": "list_dir", "arguments": {"path": "."}}, {"name": "run", "arguments": {"command": "ls"}}]'
    assert found(text) == [("list_dir", {"path": "."}), ("run", {"command": "ls"})]
    assert found('[TOOL_CALLS]run[ARGS]{"command": "ls"}</s>') == [("run", {"command": "ls"})]
    assert found('[TOOL_CALLS]read_file[ARGS]{"path": "a"}[TOOL_CALLS]run[ARGS]{"command": "b"}') == [
        ("read_file", {"path": "a"}), ("run", {"command": "b"})]


def test_a_call_shaped_object_naming_no_tool_is_kept_to_be_answered():
    assert found('{"name": "shell", "arguments": {"cmd": "ls"}}') == [("shell", {"cmd": "ls"})]
    assert found('<tool_call>{"name": "bash", "parameters": {"command": "ls"}, "why": "look"}</tool_call>') == [
        ("bash", {"command": "ls"})]
    # in order with the real ones around it
    text = '{"name": "run", "arguments": {"command": "a"}}\n{"name": "shell", "arguments": {}}\n' \
           '{"name": "run", "arguments": {"command": "b"}}'
    assert [n for n, _ in found(text)] == ["run", "shell", "run"]
