"""The seat's HTTP server on loopback (stdlib, threaded): OpenAI routes, /health, /footprint and /unload.

On a seat with PEFT adapters, a request's ``lora`` field chooses the adapter (adapters.choice) and the answer
carries the ``x-fitevict-adapter`` header: which adapter ran, and what activating it cost."""

from __future__ import annotations

import json
import select
import socket
import threading
import time
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from fitevict.engines.transformers.seat.adapters import HEADER as ADAPTER_HEADER
from fitevict.engines.transformers.seat.adapters import Activation
from fitevict.engines.transformers.seat.model import Cut, Timings
from fitevict.engines.transformers.seat.seat import HfSeat


def _error(status: int, message: str, kind: str = "invalid_request_error") -> tuple[int, dict]:
    return status, {"error": {"message": message, "type": kind, "code": status}}



def peer_closed(sock: socket.socket) -> bool:
    """Whether the client closed its connection (readable, and a peek reads nothing or fails): checked between
    two generated tokens, so a hung-up request stops using the seat."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True

class Handler(BaseHTTPRequestHandler):
    server_version = "fitevict-torch-seat"
    protocol_version = "HTTP/1.1"
    seat: HfSeat
    model_name: str
    on_unload: Callable[[], None]

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the stdlib's name
        pass

    def _send(self, status: int, body: dict, act: Activation | None = None) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        if act is not None:
            self.send_header(ADAPTER_HEADER, act.header())
        self.end_headers()
        self.wfile.write(raw)

    def _body(self) -> dict:
        n = int(self.headers.get("Content-Length") or 0)
        data = json.loads(self.rfile.read(n) or b"{}")
        if not isinstance(data, dict):
            raise ValueError("the request body must be a JSON object")
        return data

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        s = self.seat
        if self.path == "/health":
            if s.state == "ready":
                self._send(200, {"status": "ok"})
            else:
                self._send(503, {"status": s.state, **({"reason": s.reason} if s.reason else {})})
        elif self.path == "/footprint":
            if s.state != "ready":
                self._send(*_error(503, f"no footprint: the seat is {s.state}. {s.reason}".strip(), "unavailable"))
            else:
                self._send(200, {**s.footprint, "process_now": s.process_now()})
        elif self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": self.model_name, "object": "model",
                                                         "owned_by": "fitevict"}]})
        else:
            self._send(*_error(404, f"no route GET {self.path}", "not_found"))

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        s = self.seat
        try:
            body = self._body()
        except ValueError as e:
            self._send(*_error(400, f"bad JSON body: {e}"))
            return
        if self.path == "/unload":
            if s.state == "loading":
                self._send(*_error(503, "the seat is still loading; unload after /health says ok, or SIGTERM it",
                                   "unavailable"))
                return
            report = s.unload()
            self._send(200, report)
            self.on_unload()
            return
        routes = {"/v1/chat/completions": self._chat, "/v1/completions": self._completions,
                  "/v1/embeddings": self._embeddings}
        if self.path not in routes:
            self._send(*_error(404, f"no route POST {self.path}", "not_found"))
        elif s.state != "ready" or s.stopping.is_set():
            self._send(*_error(503, f"the seat is {'stopping' if s.state == 'ready' else s.state}", "unavailable"))
        elif s.runner is None:
            self._send(*_error(400, f"{s.path} is a {s.footprint.get('kind')} seat; it serves no text routes"))
        else:
            try:
                routes[self.path](body)
            except (KeyError, TypeError, ValueError) as e:
                self._send(*_error(400, f"bad request: {e}"))

    def _chat(self, body: dict) -> None:
        messages = body["messages"]
        prompt = self.seat.runner.chat_prompt(messages)  # type: ignore[union-attr]
        self._generate(body, prompt, special=False, chat=True)

    def _completions(self, body: dict) -> None:
        prompt = body["prompt"]
        if isinstance(prompt, list):
            prompt = "".join(prompt)
        self._generate(body, str(prompt), special=True, chat=False)

    def _generate(self, body: dict, prompt: str, *, special: bool, chat: bool) -> None:
        runner = self.seat.runner
        assert runner is not None
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        obj = "chat.completion" if chat else "text_completion"
        if body.get("stream"):
            pieces = runner.stream(prompt, body, special=special, gone=self._gone)
            try:
                act = next(pieces)  # the adapter is active (or the request is refused) before anything is sent
                self._stream(pieces, rid, created, chat, act)  # type: ignore[arg-type]
            except Cut:
                pass  # the stream ends without its last chunk: its reader sees it broken off, never whole
            finally:
                pieces.close()  # a write that failed (the client hung up) stops the generation now
            return
        try:
            text, t, finish, act = runner.generate(prompt, body, special=special, gone=self._gone)
        except Cut as e:
            self._send(*_error(503, f"the answer was cut: {e}", "unavailable"))
            return
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
                  if chat else {"index": 0, "text": text, "finish_reason": finish, "logprobs": None})
        self._send(200, {"id": rid, "object": obj, "created": created, "model": self.model_name,
                         "choices": [choice], "usage": _usage(t), "timings": t.to_json()}, act)

    def _gone(self) -> str | None:
        """Why the answer in progress should end now (checked between two tokens), or None."""
        if self.seat.stopping.is_set():
            return "the seat is stopping"
        return "the client hung up" if peer_closed(self.connection) else None

    def _stream(self, pieces, rid: str, created: int, chat: bool,  # type: ignore[no-untyped-def]
                act: Activation | None) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        if act is not None:
            self.send_header(ADAPTER_HEADER, act.header())
        self.send_header("Cache-Control", "no-cache")
        # chunked, so the end of the answer is a message boundary (the front door's relay sees it complete)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        obj = "chat.completion.chunk" if chat else "text_completion"

        def write(data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data) if data else b"0\r\n\r\n")
            self.wfile.flush()

        def chunk(delta: str | None, finish: str | None, extra: dict | None = None) -> None:
            if chat:
                c = {"index": 0, "delta": ({"role": "assistant", "content": delta} if delta is not None else {}),
                     "finish_reason": finish}
            else:
                c = {"index": 0, "text": delta or "", "finish_reason": finish, "logprobs": None}
            doc = {"id": rid, "object": obj, "created": created, "model": self.model_name, "choices": [c],
                   **(extra or {})}
            write(b"data: " + json.dumps(doc).encode() + b"\n\n")

        for p in pieces:
            if isinstance(p, Timings):
                chunk(None, "stop", {"usage": _usage(p), "timings": p.to_json()})
            else:
                chunk(p, None)
        write(b"data: [DONE]\n\n")
        write(b"")

    def _embeddings(self, body: dict) -> None:
        inp = body["input"]
        texts = [inp] if isinstance(inp, str) else list(inp)
        vectors, n, act = self.seat.runner.embed(texts, body)  # type: ignore[union-attr]
        self._send(200, {"object": "list", "model": self.model_name,
                         "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)],
                         "usage": {"prompt_tokens": n, "total_tokens": n}}, act)


def _usage(t: Timings) -> dict:
    return {"prompt_tokens": t.prompt_n, "completion_tokens": t.predicted_n, "total_tokens": t.prompt_n + t.predicted_n}


def make_server(seat: HfSeat, port: int, model_name: str, on_unload: Callable[[], None]) -> ThreadingHTTPServer:
    handler = type("SeatHandler", (Handler,), {"seat": seat, "model_name": model_name,
                                               "on_unload": staticmethod(on_unload)})
    srv = ThreadingHTTPServer(("127.0.0.1", port), handler)
    srv.daemon_threads = True
    return srv


def serve_in_thread(srv: ThreadingHTTPServer) -> threading.Thread:
    th = threading.Thread(target=srv.serve_forever, name="http", daemon=True)
    th.start()
    return th
