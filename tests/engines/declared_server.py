"""An OpenAI-compatible server fitevict does not know, for the declared family's tests: it holds the bytes it is
told to (allocated and written, so its PSS is real), then answers ``/health`` and chat completions on loopback.

    python declared_server.py --port 8080 --bytes 100MiB --per-token 4KiB --ctx 4096 --name tiny-chat
"""

from __future__ import annotations

import argparse
import json
import re
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PAGE = 4096
UNITS = {"": 1, "kib": 1024, "mib": 1024 ** 2, "gib": 1024 ** 3}


def size(text: str) -> int:
    m = re.fullmatch(r"(\d+)\s*([a-zA-Z]*)", text.strip())
    if not m or m.group(2).lower() not in UNITS:
        raise SystemExit(f"--bytes {text!r}: write it like 100MiB or 104857600")
    return int(m.group(1)) * UNITS[m.group(2).lower()]


def hold(n: int) -> bytearray:
    """``n`` bytes, every page written: resident and counted in the PSS."""
    buf = bytearray(n)
    buf[::PAGE] = b"\x01" * len(range(0, n, PAGE))
    return buf


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--bytes", required=True)
    ap.add_argument("--per-token", default="0", help="bytes each token of context adds")
    ap.add_argument("--ctx", type=int, default=0)
    ap.add_argument("--name", default="declared")
    ns = ap.parse_args()
    held = hold(size(ns.bytes) + size(ns.per_token) * ns.ctx)

    def chat(body: dict) -> tuple[int, dict]:
        said = next((m["content"] for m in reversed(body.get("messages", [])) if m.get("role") == "user"), "")
        answer = f"{ns.name} holds {len(held)} bytes and heard: {said}"
        words = (len(said.split()), len(answer.split()))
        return 200, {"id": "declared-1", "object": "chat.completion", "model": ns.name,
                     "choices": [{"index": 0, "finish_reason": "stop",
                                  "message": {"role": "assistant", "content": answer}}],
                     "usage": {"prompt_tokens": words[0], "completion_tokens": words[1], "total_tokens": sum(words)}}

    routes = {("GET", "/health"): lambda _body: (200, {"status": "ok"}), ("POST", "/v1/chat/completions"): chat}

    class Handler(BaseHTTPRequestHandler):
        def _route(self) -> None:
            size = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(size) or b"{}") if size else {}
            route = routes.get((self.command, self.path))
            code, doc = route(body) if route else (404, {"error": {"message": f"{self.path}: not served here"}})
            out = json.dumps(doc).encode()
            self.send_response(code)
            for name, value in (("Content-Type", "application/json"), ("Content-Length", str(len(out)))):
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(out)

        do_GET = do_POST = _route  # noqa: N815 - http.server's names

        def log_message(self, fmt: str, *args: object) -> None:
            print("declared-server " + fmt % args, flush=True)

    print(f"declared-server {ns.name} holds {len(held)} bytes on port {ns.port}", flush=True)
    ThreadingHTTPServer(("127.0.0.1", ns.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
