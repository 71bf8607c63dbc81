"""The history as an OpenAI-compatible server reads it (/v1/chat/completions): the loop's
messages (Ollama's shape: vmagent/models/history.py) translated, and the request body.

What differs from Ollama's shape, per the chat completions reference:
- an assistant message's tool calls carry an `id` and their arguments as a JSON string;
  each result goes back as `role: tool` with that `tool_call_id`. The loop's history has
  ids only for calls an OpenAI server made; others get a stable one here (the same
  history gives the same request, so the server's prompt cache holds);
- a call the loop did not run (an earlier call of the same reply ended the turn) is
  answered "not run": servers and chat templates expect one result per call;
- images are `image_url` parts with a data URL, and only a user message may hold them:
  a screenshot a tool returned follows that reply's results as a user message;
- thinking is not sent back: there is no field for it in the protocol.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping

from vmagent.models.history import drop_old_images, only_latest_thinking

NOT_RUN = "(not run: an earlier call of the same reply ended the turn)"
SCREENSHOT_NOTE = "The screenshot the tool call above returned."


def openai_messages(messages: Iterable[Mapping[str, Any]], max_images: int, sees_images: bool) -> list[dict[str, Any]]:
    kept = only_latest_thinking(drop_old_images(list(messages), max_images))
    out: list[dict[str, Any]] = []
    pending: list[str] = []  # ids of the newest assistant message's calls not answered yet
    images: list[str] = []  # screenshots tool results returned, for after the results

    def close_results() -> None:
        nonlocal pending, images
        out.extend({"role": "tool", "tool_call_id": call_id, "content": NOT_RUN} for call_id in pending)
        pending = []
        if images:
            out.append(_user_with_images(SCREENSHOT_NOTE, images))
            images = []

    for position, message in enumerate(kept):
        role = message.get("role")
        if role != "tool":
            close_results()
        content = _text(message.get("content"))
        if role == "tool":
            name = str(message.get("tool_name") or "tool")
            if pending:
                out.append({"role": "tool", "tool_call_id": pending.pop(0), "content": content})
            else:  # a result with no call before it: said as text rather than refused by the server
                out.append({"role": "user", "content": f"[result of {name}]\n{content}"})
            if sees_images:
                images += list(message.get("images") or [])
        elif role == "assistant":
            wire: dict[str, Any] = {"role": "assistant", "content": content}
            calls = [_call(call, position, n) for n, call in enumerate(message.get("tool_calls") or [])]
            if calls:
                wire["tool_calls"] = calls
                pending = [call["id"] for call in calls]
            out.append(wire)
        elif sees_images and message.get("images"):
            out.append(_user_with_images(content, list(message["images"]), role=str(role or "user")))
        else:
            out.append({"role": str(role or "user"), "content": content})
    close_results()
    return out


# Fields of extra_body that mean something only beside tools (a server refuses them alone).
WITH_TOOLS_ONLY = ("tool_choice", "parallel_tool_calls")


def request_body(model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                 max_tokens: int | None, think: bool | None,
                 extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        key: value for key, value in (extra or {}).items() if tools or key not in WITH_TOOLS_ONLY
    }
    body |= {
        "model": model,
        "messages": messages,
        "stream": True,
        # The token counts come in a last chunk with no choices: they calibrate compaction.
        "stream_options": {"include_usage": True},
    }
    if tools:
        body["tools"] = tools_as_sent(tools)
    if max_tokens is not None:
        # A max_tokens of the settings is a ceiling for every reply, a summary's too.
        ceiling = body.get("max_tokens")
        body["max_tokens"] = min(max_tokens, ceiling) if isinstance(ceiling, int) and ceiling > 0 else max_tokens
    if think is not None:
        # How vLLM, SGLang and llama.cpp switch a template's thinking (Qwen3, DeepSeek).
        body["chat_template_kwargs"] = {"enable_thinking": think}
    return body


def tools_as_sent(tools: Iterable[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The tool schemas as the request carries them (what compaction counts)."""
    return [_spelt_out_once(tool) for tool in tools or []]


def _spelt_out_once(tool: dict[str, Any]) -> dict[str, Any]:
    """The tool as an OpenAI-compatible server gets it: a nested object parameter keeps its
    own fields' schemas here, so the description that spells those fields out in one line
    (for Ollama's client, which drops them: vmagent/tools/table.py `finish`) is left out."""
    function = tool.get("function")
    params = function.get("parameters") if isinstance(function, Mapping) else None
    if not isinstance(params, Mapping) or not isinstance(params.get("properties"), Mapping):
        return tool
    properties = {name: ({k: v for k, v in node.items() if k != "description"}
                         if isinstance(node, Mapping) and node.get("properties") else node)
                  for name, node in params["properties"].items()}
    return {**tool, "function": {**function, "parameters": {**params, "properties": properties}}}


def _call(call: Any, position: int, n: int) -> dict[str, Any]:
    call = call if isinstance(call, Mapping) else {}
    function = call.get("function") if isinstance(call.get("function"), Mapping) else call
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        text = arguments  # the model's own string, sent back as it was
    else:
        text = json.dumps({} if arguments is None else arguments, ensure_ascii=False)
    return {"id": str(call.get("id") or f"call_{position}_{n}"), "type": "function",
            "function": {"name": str(function.get("name", "")), "arguments": text}}


def _user_with_images(text: str, images: list[str], role: str = "user") -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    parts += [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{image}"}} for image in images]
    return {"role": role, "content": parts}


def _text(content: Any) -> str:
    return content if isinstance(content, str) else ("" if content is None else str(content))
