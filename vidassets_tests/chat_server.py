"""A chat-completions server on loopback (the OpenAI protocol vLLM and SGLang speak), for the tests
that run the VLM client against a real HTTP server: no VLM weights are reachable offline. A
subclass answers each request body (``handle``); this class does the HTTP."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from vidassets_tests.conftest import free_port


class LoopbackChatServer:
    def __init__(self) -> None:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status, content = server.handle(self.path, body, self.headers.get("Authorization"))
                if content is None:  # a failure without a completion (an overloaded server)
                    self.send_response(status)
                    self.end_headers()
                    self.wfile.write(b"overloaded")
                    return
                data = json.dumps({"id": "cmpl-1", "object": "chat.completion", "model": body["model"],
                                   "choices": [{"index": 0, "finish_reason": "stop",
                                                "message": {"role": "assistant", "content": content}}]}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.port = free_port()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def handle(self, path: str, body: dict, auth: str | None) -> tuple[int, str | None]:
        """(HTTP status, the assistant message's content; None: no completion at all)."""
        raise NotImplementedError

    def close(self) -> None:
        self.httpd.shutdown()
