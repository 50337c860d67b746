"""A third engine family, written as a newcomer would add one: this module and one registry entry
(``fitevict.engines.REGISTRY["echo"] = "echo_engine:EchoEngine"``), nothing else.

``echo`` loads a GGUF file (priced as any GGUF is) into a seat process that is this module run as a script: a
small HTTP server on loopback that answers ``/health`` and OpenAI's chat completions with the last user message
echoed back, and logs its own account of what it holds (the file's bytes, read into memory) on a line the engine
class parses as its measured footprint.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

FOOTPRINT = "echo-seat footprint: "


def _engine_class():  # defined lazily, so the seat (a bare script) needs no fitevict import to start
    from fitevict.engines.base import EngineBase, LaunchSpec, Traits
    from fitevict.pricing.footprint import HOST, DeviceFootprint, Footprint, Term
    from fitevict.pricing.loadconfig import LoadConfig

    class EchoEngine(EngineBase):
        name = "echo"
        traits = Traits(file_kinds=("gguf",), overhead="own-process", process_marks=("echo_engine.py",))

        def launch_spec(self, model_path: Path, config: LoadConfig, port: int, *, extra_args: Sequence[str] = (),
                        embeddings: bool = False, mmproj: Path | None = None,
                        slot_save_path: Path | None = None) -> LaunchSpec:
            argv = (sys.executable, str(Path(__file__).resolve()), str(port), str(model_path), str(config.n_ctx))
            return LaunchSpec(argv, dict(os.environ), port, "/health")

        def measured_footprint(self, log_text: str) -> Footprint | None:
            lines = [ln for ln in log_text.splitlines() if ln.startswith(FOOTPRINT)]
            if not lines:
                return None
            held = json.loads(lines[-1][len(FOOTPRINT):])["held_bytes"]
            return Footprint((DeviceFootprint(HOST, model=Term(held, "engine-reported", "the echo seat's own account")),))

        @classmethod
        def failure(cls, log_text: str) -> str | None:
            lines = [ln for ln in log_text.splitlines() if ln.startswith("echo-seat failed: ")]
            return lines[-1].removeprefix("echo-seat failed: ") if lines else None

    return EchoEngine


def __getattr__(name: str):  # the registry's "echo_engine:EchoEngine"
    if name == "EchoEngine":
        return _engine_class()
    raise AttributeError(name)


def _serve(port: int, model: Path, n_ctx: int) -> None:
    held = model.read_bytes()  # what the seat holds: the file, read whole
    print(FOOTPRINT + json.dumps({"held_bytes": len(held), "n_ctx": n_ctx}), flush=True)

    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, doc: dict) -> None:
            body = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self._send(200, {"status": "ok"} if self.path == "/health" else {"error": "not found"})

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if self.path != "/v1/chat/completions":
                return self._send(404, {"error": {"message": f"{self.path}: the echo engine answers chat only"}})
            said = next((m["content"] for m in reversed(body.get("messages", [])) if m.get("role") == "user"), "")
            self._send(200, {"id": "echo-1", "object": "chat.completion", "model": model.name,
                             "choices": [{"index": 0, "finish_reason": "stop",
                                          "message": {"role": "assistant", "content": f"echo: {said}"}}],
                             "usage": {"prompt_tokens": len(said.split()), "completion_tokens": len(said.split()) + 1,
                                       "total_tokens": 2 * len(said.split()) + 1}})

        def log_message(self, fmt: str, *args: object) -> None:
            print("echo-seat " + fmt % args, flush=True)

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    _serve(int(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))
