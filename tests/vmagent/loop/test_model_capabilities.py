"""What the model can do decides the job before a machine boots: no tool calling, no job
(and no session); screenshots go as images only to a model with vision."""

from __future__ import annotations

from tests.support.loop_harness import agent_config, running_vmd
from tests.support.ollama_server import start_ollama, unused_port
from vmagent.link import typed_result
from vmagent.config import AgentConfig
from vmagent.loop.job import Events, Job, JobSpec
from vmagent.loop import run_job
from vmagent.loop.turns import _call_tool
from vmagent.tools import SCREEN_UNSEEN

PNG_B64 = "iVBORw0KGgo="


def start(tmp_path, vmd, config):
    return run_job(JobSpec(task="write hello.py", project="hello"), on_event=lambda e: None,
                   transcript_path=tmp_path / "job" / "transcript.json", config=config, vmd_socket=vmd.socket)


def test_a_model_without_tool_calling_ends_the_job_before_a_session_opens(tmp_path):
    with running_vmd(tmp_path) as vmd, start_ollama([], capabilities=["completion", "vision"]) as server:
        outcome = start(tmp_path, vmd, agent_config(server, model="gemma3:27b"))
        opened = [r for r in server.requests if r.path == "/api/chat"]
    assert outcome.state == "failed" and outcome.session_id is None
    assert "gemma3:27b cannot call tools" in outcome.report and "VMAGENT_MODEL" in outcome.report
    assert not opened, "the model must not be asked to work"
    assert not list(vmd.config.sessions_dir.glob("*")), "no session may be opened"


def test_an_unreachable_model_ends_the_job_before_a_session_opens(tmp_path):
    with running_vmd(tmp_path) as vmd:
        config = AgentConfig(ollama_host=f"http://127.0.0.1:{unused_port()}", retries=0, retry_backoff_s=0)
        outcome = start(tmp_path, vmd, config)
    assert outcome.state == "failed" and outcome.session_id is None
    assert "Could not reach Ollama" in outcome.report
    assert not list(vmd.config.sessions_dir.glob("*"))


class ScreenOnly:
    """A vmd that answers only a screenshot, as the result model `Vmd.call` gives; with
    `reads_text`, the screen as text when asked."""

    def __init__(self, reads_text: bool = False):
        self.reads_text = reads_text
        self.asked: list[dict] = []

    def call(self, verb, **params):
        assert verb == "screenshot"
        self.asked.append(params)
        result = {"png_base64": PNG_B64, "width": 1024, "height": 768, "scale": 1.0, "path": "shot.png",
                  "text": "screenshot"}
        if self.reads_text and params.get("text"):
            result["screen_text"] = 'Window "Save" at (300, 200) 400x200:\n- "OK" at (420, 360)'
        return typed_result("screenshot", result)


def screenshot_message(tmp_path, sees_images: bool, vmd: ScreenOnly | None = None) -> dict:
    job = Job(spec=JobSpec(task="t"), transcript_path=tmp_path / "t.json")
    shown: list[dict] = []
    _call_tool(job, vmd or ScreenOnly(), "screenshot", {}, ["screenshot"], AgentConfig(), Events(shown.append),
               sees_images=sees_images)
    assert any(e.get("type") == "screenshot" for e in shown), "the person watching sees it either way"
    return job.messages[-1]


def test_a_model_with_vision_gets_the_screenshot_as_an_image(tmp_path):
    message = screenshot_message(tmp_path, sees_images=True)
    assert message["images"] == [PNG_B64] and SCREEN_UNSEEN not in message["content"]


def test_a_text_only_model_is_told_it_cannot_see_and_how_to_read_the_screen(tmp_path):
    message = screenshot_message(tmp_path, sees_images=False)
    assert "images" not in message
    assert "cannot see images" in message["content"] and "window titles" in message["content"]


def test_a_text_only_model_reads_the_screen_as_text_with_points_to_click(tmp_path):
    vmd = ScreenOnly(reads_text=True)
    message = screenshot_message(tmp_path, sees_images=False, vmd=vmd)
    assert vmd.asked == [{"text": True}], "the loop asks vmd for the screen as text"
    assert "images" not in message
    assert '"OK" at (420, 360)' in message["content"] and "cannot see images" in message["content"]
    # A model with vision is not made to wait for OCR.
    seeing = ScreenOnly(reads_text=True)
    screenshot_message(tmp_path, sees_images=True, vmd=seeing)
    assert seeing.asked == [{}]
