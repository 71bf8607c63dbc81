"""`vmd doctor`'s model check: the server the agent is set to use answers, has the model, and
the model can call tools (the agent's only way to act) and see screenshots, or vmd reads the
screen to it as text (tesseract). Ollama's protocol (`/api/show` lists capabilities) or an
OpenAI-compatible one (`/v1/models`, and a one-token request with a tool, since no such server
says whether it takes tools: llama.cpp without --jinja and vLLM without
--enable-auto-tool-choice refuse it).

The settings are vmagent's (VMAGENT_MODEL_API, VMAGENT_MODEL_URL, VMAGENT_MODEL_KEY,
VMAGENT_MODEL_VISION, OLLAMA_HOST, VMAGENT_MODEL), read by vmd's config: vmd does not import
vmagent.
"""

from __future__ import annotations

import shutil

import httpx

from vmd.server.findings import HTTP_TIMEOUT_S, Finding, one_line

# vmagent's default for an OpenAI-compatible server (llama-server's own), vmagent/config.py.
OPENAI_DEFAULT_URL = "http://127.0.0.1:8080/v1"
# The probe's one tool: a server that cannot take tools refuses the request in its words.
PROBE_TOOL = {"type": "function", "function": {"name": "noop", "description": "Does nothing.",
                                               "parameters": {"type": "object", "properties": {}}}}


def check_ollama(url: str, model: str, tesseract: bool | None = None,
                 timeout: float = HTTP_TIMEOUT_S) -> Finding:
    """Ollama answers, `model` is pulled, it can call tools (the agent's only way to act),
    and it can see screenshots, or vmd can read the screen as text for it (tesseract)."""
    url = url.rstrip("/")
    if "://" not in url:
        url = f"http://{url}"
    tesseract = bool(shutil.which("tesseract")) if tesseract is None else tesseract
    try:
        with httpx.Client(base_url=url, timeout=timeout) as api:
            version = api.get("/api/version").json().get("version", "?")
            shown = api.post("/api/show", json={"model": model})
    except (httpx.HTTPError, ValueError) as exc:
        return Finding("ollama", "fail", f"Ollama does not answer at {url} ({one_line(str(exc)) or type(exc).__name__}): "
                                         "start it (`ollama serve`), or set OLLAMA_HOST to where it runs.")
    if shown.status_code == 404:
        return Finding("ollama", "fail", f"Ollama {version} at {url} does not have the model {model}: "
                                         f"`ollama pull {model}` (the compose file's Ollama pulls VMAGENT_MODEL on "
                                         "its first start), or set VMAGENT_MODEL to a model it has.")
    if shown.status_code != 200:
        return Finding("ollama", "fail", f"Ollama at {url} answered /api/show for {model} with "
                                         f"{shown.status_code}: {shown.text[:200]}")
    capabilities = shown.json().get("capabilities")
    if capabilities is None:
        return Finding("ollama", "warn", f"Ollama {version} at {url} has {model} but does not say what it can "
                                         "do (Ollama before 0.6.4): the agent needs a model with tool calling.")
    if "tools" not in capabilities:
        return Finding("ollama", "fail", f"{model} cannot call tools ({', '.join(capabilities)}), and tools are "
                                         "the agent's only way to act: set VMAGENT_MODEL to a model with tool "
                                         "calling (qwen3-vl, qwen3, llama3.1, ...).")
    if "vision" in capabilities:
        return Finding("ollama", "ok", f"Ollama {version} at {url} has {model}, with tool calling and vision.")
    if tesseract:
        return Finding("ollama", "ok", f"Ollama {version} at {url} has {model}, with tool calling; it cannot "
                                       "see screenshots, so vmd reads the screen to it as text (OCR).")
    return Finding("ollama", "warn", f"{model} cannot see screenshots and tesseract is not installed where "
                                     "vmd runs, so the agent works blind on the desktop: `apt-get install "
                                     "tesseract-ocr tesseract-ocr-eng`, or use a vision model (qwen3-vl).")


def check_openai_model(url: str, model: str, key: str = "", vision: bool | None = None,
                       tesseract: bool | None = None, timeout: float = HTTP_TIMEOUT_S) -> Finding:
    """An OpenAI-compatible server answers at its /v1 URL, takes the key, serves `model`,
    accepts a request with a tool (one token), and the model sees images or tesseract reads
    the screen for it. The key goes in the header only, never in a sentence."""
    url = url.rstrip("/")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    tesseract = bool(shutil.which("tesseract")) if tesseract is None else tesseract
    probe = {"model": model, "max_tokens": 1, "stream": False, "tools": [PROBE_TOOL],
             "messages": [{"role": "user", "content": "Say ok."}]}
    try:
        with httpx.Client(timeout=timeout, headers=headers) as api:
            listed = api.get(f"{url}/models")
            answered = api.post(f"{url}/chat/completions", json=probe)
    except httpx.HTTPError as exc:
        return Finding("ollama", "fail", f"The model server does not answer at {url} "
                                         f"({one_line(str(exc)) or type(exc).__name__}): start it, or set "
                                         "VMAGENT_MODEL_URL to its base URL, ending in /v1.")
    for response in (listed, answered):
        if response.status_code in (401, 403):
            return Finding("ollama", "fail", f"The model server at {url} refused the key (HTTP "
                                             f"{response.status_code}): set VMAGENT_MODEL_KEY to a key it accepts.")
    entry = None
    if listed.status_code == 200:
        try:
            served = [m for m in (listed.json().get("data") or []) if isinstance(m, dict)]
        except (ValueError, AttributeError):
            served = []
        entry = next((m for m in served if m.get("id") == model or model in (m.get("aliases") or [])), None)
        if served and entry is None:
            names = ", ".join(one_line(str(m.get("id")))[:80] for m in served[:10])
            return Finding("ollama", "fail", f"The model server at {url} serves no model {model}; it serves "
                                             f"{names}: set VMAGENT_MODEL to one of them.")
    if answered.status_code == 404:
        return Finding("ollama", "fail", f"The model server at {url} has no model {model} (or no "
                                         "/chat/completions): set VMAGENT_MODEL to a model it serves, and "
                                         "VMAGENT_MODEL_URL to its base URL, ending in /v1.")
    if answered.status_code != 200:
        return Finding("ollama", "fail", f"The model server at {url} refused a request with tools for {model} "
                                         f"(HTTP {answered.status_code}: {one_line(answered.text)[:200]}): start "
                                         "it with tool calling on (llama.cpp: --jinja; vLLM: "
                                         "--enable-auto-tool-choice --tool-call-parser ...).")
    if vision is None:
        vision = "image" in (((entry or {}).get("architecture") or {}).get("input_modalities") or [])
    context = (entry or {}).get("max_model_len") or ((entry or {}).get("meta") or {}).get("n_ctx")
    said = f"{model} at {url} takes tools" + (f", context {context} tokens" if context else "")
    if vision:
        return Finding("ollama", "ok", f"{said} and sees images.")
    if tesseract:
        return Finding("ollama", "ok", f"{said}; it is not known to see images (VMAGENT_MODEL_VISION), so vmd "
                                       "reads the screen to it as text (OCR).")
    return Finding("ollama", "warn", f"{said}, but it is not known to see images and tesseract is not installed "
                                     "where vmd runs: `apt-get install tesseract-ocr tesseract-ocr-eng`, or set "
                                     "VMAGENT_MODEL_VISION=true for a model that sees.")
