"""The HTTP server under every stand-in of tests/ (Gitea, Ollama, the Open WebUI tool's
peers): http.server's ThreadingHTTPServer, made safe to poll.

serve_forever polls the listening socket, then accepts on it. A listening socket can poll
readable with nothing left to accept by then (a connection reset before its accept, or
one dropped from a full backlog: Stevens, UNIX Network Programming, 16.6), and a blocking
accept then waits for the next client, forever if none comes: CI saw a stand-in's
shutdown hang in accept that way. With a timeout on the listening socket, accept gives
up after a moment and serve_forever polls again; the backlog holds a burst of clients.
"""

from __future__ import annotations

from http.server import ThreadingHTTPServer

ACCEPT_TIMEOUT_S = 0.5


class StandInHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64

    def server_activate(self) -> None:
        super().server_activate()
        # Accepted sockets stay blocking: socket.accept() makes them so when the listening
        # socket has a timeout.
        self.socket.settimeout(ACCEPT_TIMEOUT_S)
