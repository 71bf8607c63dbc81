"""Through the real loop (stand-in machine, scripted model): calls written as text in each
common shape are run, every one of them and in order; one naming no tool is answered
with the tools there are, and the job goes on."""

from __future__ import annotations

import json

from tests.support.loop_harness import call, running_vmd, tool_results
from tests.support.ollama_server import Turn, start_ollama
from tests.vmagent.loop.test_loop import run

CHECK = {"command": "python3 hello.py | grep -q hello"}


def obj(name: str, arguments, key: str = "arguments") -> str:
    return json.dumps({"name": name, key: arguments})


def verbs_run(vmd, session_id: str) -> list[str]:
    tools = {"plan_tasks", "write_file", "run", "update_task", "list_dir", "finish"}
    return [e["verb"] for e in vmd.record(session_id) if e.get("kind") == "verb" and e.get("verb") in tools]


def test_every_text_shape_runs_each_call_in_order_and_the_job_finishes(tmp_path):
    script = [
        # Llama 3.x: one call a line, "parameters"
        Turn(content=obj("plan_tasks", {"tasks": ["write hello.py", "check it"]}, "parameters")),
        # Llama's python tag, two calls separated by `;`, arguments as a JSON string in the second
        Turn(content="<|python_tag|>" + obj("write_file", {"path": "hello.py", "content": "print('hello')\n"},
                                            "parameters")
                     + "; " + obj("run", json.dumps({"command": "python3 hello.py"}), "parameters") + "<|eom_id|>"),
        # Mistral: [TOOL_CALLS] and an array
        Turn(content="[TOOL_CALLS] " + json.dumps([
            {"name": "update_task", "arguments": {"id": 1, "status": "done", "note": "written"}},
            {"name": "update_task", "arguments": {"id": 2, "status": "done", "note": "prints hello"}}])),
        # bare objects one after another, the middle one naming no tool
        Turn(content=obj("list_dir", {"path": "."}) + "\n" + obj("shell", {"command": "ls"}) + "\n"
                     + obj("run", {"command": "ls hello.py"})),
        # Mistral's newer form
        Turn(content="[TOOL_CALLS]finish[ARGS]" + json.dumps({"summary": "hello.py prints hello",
                                                               "verification": CHECK})),
    ]
    with running_vmd(tmp_path) as vmd, start_ollama(script) as server:
        outcome = run(tmp_path, vmd, server)
    assert outcome.state == "done" and outcome.verification_passed is True, outcome.report
    assert outcome.steps == len(script)
    assert verbs_run(vmd, outcome.session_id) == [
        "plan_tasks", "write_file", "run", "update_task", "update_task", "list_dir", "run", "finish"]
    # the unknown tool was answered, between the two calls around it, with the tools there are
    results = tool_results(server.chat_requests[-1])
    unknown = next(i for i, r in enumerate(results) if "no tool named" in r)
    assert results[unknown].startswith("ERROR: there is no tool named") and '"shell"' in results[unknown]
    assert "run" in results[unknown] and "write_file" in results[unknown]
    assert "." in results[unknown - 1] and "hello.py" in results[unknown + 1]


def test_a_reply_of_only_an_unknown_tool_is_answered_not_taken_for_prose(tmp_path):
    script = [call("plan_tasks", {"tasks": ["look around"]}),
              Turn(content=obj("bash", {"command": "ls"})),
              call("run", {"command": "ls"})]
    with running_vmd(tmp_path) as vmd, start_ollama(script) as server:
        run(tmp_path, vmd, server)
    after = server.chat_requests[2]
    results = tool_results(after)
    assert results[-1].startswith("NOTE: you wrote this tool call as text") and 'no tool named "bash"' in results[-1]
    assert not any(m["content"].startswith("You replied without a tool call")
                   for m in after["messages"] if m["role"] == "user")
