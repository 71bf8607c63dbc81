"""The Open WebUI harness's browser tab (tests/support/openwebui_harness.py `Browser`) against a
socket.io server of this process, without Open WebUI: it records events in the order the
server sent them, as a browser's tab shows them."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
import socketio
import uvicorn

from tests.support.openwebui_harness import Browser
from tests.support.service_harness import free_port


@pytest.fixture
def socket_server():
    """A socket.io server where Open WebUI has its own (/ws/socket.io): it answers
    `user-join`, and on `go` emits five status events of one message, in order, to the
    tab that asked, the way Open WebUI's event emitter sends a tool's statuses."""
    server = socketio.AsyncServer(async_mode="asgi")

    @server.on("user-join")
    async def user_join(sid, data):
        return {"id": "user-1"}

    @server.on("go")
    async def go(sid, data):
        for n in range(5):
            await server.emit("events", {"chat_id": "chat-1", "message_id": "reply-1", "data": {
                "type": "status", "data": {"description": f"status {n}", "done": n == 4}}}, to=sid)

    port = free_port()
    web = uvicorn.Server(uvicorn.Config(socketio.ASGIApp(server, socketio_path="ws/socket.io"),
                                        host="127.0.0.1", port=port, log_level="warning"))
    serving = threading.Thread(target=web.run, daemon=True)
    serving.start()
    deadline = time.monotonic() + 30
    while not web.started and time.monotonic() < deadline:
        time.sleep(0.02)
    yield SimpleNamespace(url=f"http://127.0.0.1:{port}")
    web.should_exit = True
    serving.join(30)


def test_the_browser_records_events_in_the_order_they_were_sent(socket_server, monkeypatch):
    # python-engineio hands each message to a thread of its own: the first event's thread
    # is held here, as a loaded CI host held one, while the next four threads run.
    record = Browser._on_event

    def first_one_late(self, payload):
        if payload["data"]["data"]["description"] == "status 0":
            time.sleep(0.5)
        return record(self, payload)

    monkeypatch.setattr(Browser, "_on_event", first_one_late)
    tab = Browser(socket_server, SimpleNamespace(token="token-1"))
    try:
        tab.sio.emit("go", {})
        tab.wait_for(lambda: len(tab.of_message("reply-1")) == 5, 30, "five statuses")
        assert [e["data"]["description"] for e in tab.of_message("reply-1", "status")] == [
            f"status {n}" for n in range(5)]
    finally:
        tab.close()
