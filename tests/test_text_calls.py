"""Tool calls a model wrote as text in its content are found, in each shape real models use."""

from __future__ import annotations

from vmagent.text_calls import calls_in_text
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
    assert calls_in_text('{"name": "Alice", "arguments": {}}', TOOLS) == []
    assert calls_in_text('```json\n{"version": 2}\n```', TOOLS) == []
    assert calls_in_text("", TOOLS) == []
