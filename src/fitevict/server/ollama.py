"""The Ollama-compatible routes, on the same port as the OpenAI ones.

``/api/tags``, ``/api/ps``, ``/api/show``, ``/api/chat``, ``/api/generate``, ``/api/embed`` (and the older
``/api/embeddings``) and ``/api/version``. Inference goes to the model's seat over llama-server's own
OpenAI-style routes and comes back in Ollama's shapes (``ollama_shapes``), streamed as NDJSON. Errors are
Ollama's ``{"error": "..."}``. A request that names no prompt (``/api/generate``) or no messages
(``/api/chat``) loads the model, or with ``keep_alive: 0`` unloads it, as Ollama does.
"""

from __future__ import annotations

import contextlib
import functools
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from fitevict import shrink
from fitevict import __version__
from fitevict.request.catalog import CatalogEntry
from fitevict.request.contract import Contract, for_embeddings, with_lora
from fitevict.supervisor.loadreport import SHRUNK_HEADER
from fitevict.server import ollama_shapes as sh
from fitevict.server import seatcall
from fitevict.server.door import Door, new_request_id, with_defaults
from fitevict.server.errors import ApiError
from fitevict.schedule.fair import Share
from fitevict.supervisor import SupervisorError

OLLAMA_API_VERSION = "0.12.0"  # the Ollama API generation these routes follow (clients compare it)
NDJSON = "application/x-ndjson"


def error(status: int, message: str) -> JSONResponse:
    """Ollama's error shape."""
    return JSONResponse({"error": message}, status_code=status)


def ollama_errors(fn: Callable[..., Awaitable[Response]]) -> Callable[..., Awaitable[Response]]:
    """Answer fitevict's errors in Ollama's shape, with their status and headers."""
    @functools.wraps(fn)
    async def wrapped(*args: Any, **kw: Any) -> Response:
        try:
            return await fn(*args, **kw)
        except ApiError as e:
            r = error(e.status, e.message)
            r.headers.update(e.headers)
            return r
        except sh.OllamaError as e:
            return error(e.status, str(e))
    return wrapped


class OllamaRoutes:
    """The Ollama routes' handlers over one door and its upstream pool, one method per concern."""

    def __init__(self, door: Door) -> None:
        self.door = door
        self.sup = door.sup
        self.upstream = door.pool

    # -- the request's body and model --

    async def body_of(self, request: Request) -> tuple[dict[str, Any], CatalogEntry]:
        door = self.door
        door.check_auth(request, admin=False)
        body = await door.read_json(request)
        if not isinstance(body, dict):
            raise sh.OllamaError("request body must be a JSON object")
        name = body.get("model") or body.get("name")
        if isinstance(name, str) and name.endswith(":latest") and name not in door.catalog.names():
            name = name[: -len(":latest")]  # Ollama clients tag names; fitevict's names have no tags
        try:
            entry = door.resolve(name)
        except ApiError as e:
            if e.status == 404:
                raise sh.OllamaError(f"model '{name}' not found (GET /api/tags lists them)", 404) from None
            raise
        return body, entry

    # -- what is listed, loaded and shown --

    @staticmethod
    def structure_of(entry: CatalogEntry):
        if not entry.llama_servable:
            return None
        from fitevict.pricing.gguf import PricingError, load_structure

        try:
            return load_structure(entry.path)
        except PricingError:
            return None  # listed with what is known; a request for it gets the pricing error itself

    def described(self, entry: CatalogEntry) -> dict[str, Any]:
        return sh.details_of(self.structure_of(entry), entry.kind)

    async def tags(self, request: Request) -> Response:
        self.door.check_auth(request, admin=False)
        models = []
        for e in self.door.catalog.entries():
            path = Path(e.path)
            mtime = path.stat().st_mtime if path.exists() else None
            size, source = sh.file_bytes_now(e.files or (path,))
            if size is None:  # Ollama's clients want a number: the scan's, said so
                size, source = e.file_bytes, f"file-size at the catalog's scan; now {source}"
            models.append({"name": e.key, "model": e.key, "modified_at": sh.iso(mtime) if mtime else None,
                           "size": size, "digest": sh.identity_digest(path), "details": self.described(e),
                           "fitevict": {"size_source": source, "aliases": list(e.aliases), "engine": e.engine,
                                        "store": e.store}})
        return JSONResponse({"models": models})

    async def ps(self, request: Request) -> Response:
        self.door.check_auth(request, admin=False)
        out = []
        for v in self.sup.resident_views():
            entry = self.door.catalog.get(v["key"])
            path = Path(entry.path) if entry is not None else Path(v["key"])
            out.append(sh.ps_entry(v, self.described(entry) if entry else sh.details_of(None, "gguf"),
                                   sh.identity_digest(path)))
        return JSONResponse({"models": out})

    async def show(self, request: Request) -> Response:
        _body, entry = await self.body_of(request)
        s = self.structure_of(entry)
        caps = ["completion", "embedding"] if entry.llama_servable else ["completion"]
        path = Path(entry.path)
        return JSONResponse({
            "modelfile": f"FROM {path}\n", "parameters": "", "template": "", "license": "",
            "details": sh.details_of(s, entry.kind), "model_info": sh.model_info(s), "capabilities": caps,
            "modified_at": sh.iso(path.stat().st_mtime) if path.exists() else None,
            "fitevict": {"key": entry.key, "aliases": list(entry.aliases), "engine": entry.engine, "store": entry.store,
                         "file_bytes": entry.file_bytes, "file_bytes_source": "file-size", "pinned": entry.pinned},
        })

    # -- an empty prompt --

    async def load_or_unload(self, entry: CatalogEntry, contract: Contract | None, rid: str,
                             shape: Callable[[str], dict[str, Any]]) -> Response:
        """An empty prompt: load the model (or, with keep_alive 0, unload it), as Ollama does."""
        if contract is not None and contract.keep_alive == 0:
            try:
                await self.sup.unload(entry.key, reason="unloaded on request (keep_alive 0)")
            except SupervisorError as e:
                raise self.door.supervisor_error(e) from None
            return JSONResponse({**shape(""), "done": True, "done_reason": "unload"})
        timing: dict[str, float] = {}
        async with seatcall.held(self.door, entry, contract, rid, timing):
            pass
        return JSONResponse({**shape(""), "done": True, "done_reason": "load",
                             "load_duration": sh.ns(timing.get("load_s"))})

    # -- a completion: held seat, sent request, answer whole or streamed --

    async def complete(self, request: Request, entry: CatalogEntry, path: str, tr: sh.Translated, stream: bool,
                       shape: Callable[..., dict[str, Any]]) -> Response:
        """Hold a seat, send the translated request, answer in Ollama's shape (NDJSON when streamed)."""
        t0 = time.perf_counter()
        rid = request.headers.get("x-request-id") or new_request_id()
        headers = {"x-request-id": rid}
        if tr.ignored:
            headers["x-fitevict-ignored-options"] = ",".join(tr.ignored)
        timing: dict[str, Any] = {}
        share = self.door.share(request)
        stack = contextlib.AsyncExitStack()
        try:
            seat, r = await self._sent(stack, entry, path, tr, rid, timing, headers, share)
        except BaseException:
            await stack.aclose()
            raise
        if not stream:
            return await self._whole(seat, r, stack, shape, headers, t0, timing)
        return StreamingResponse(self._lines(seat, r, stack, shape, t0, timing), media_type=NDJSON,
                                 headers=headers)

    async def _sent(self, stack: contextlib.AsyncExitStack, entry: CatalogEntry, path: str, tr: sh.Translated,
                    rid: str, timing: dict[str, Any], headers: dict[str, str], share: Share) -> tuple[Any, Any]:
        """Hold a seat on ``stack`` and send the request to it: the seat and the upstream response."""
        door = self.door
        need = shrink.need(tr.body, entry.settings.request_defaults) if door.config.policy.shrink_ctx else None
        seat = await stack.enter_async_context(seatcall.held(door, entry, tr.contract, rid, timing, need,
                                                             share))
        if "ctx_shrunk" in timing:  # policy.shrink_ctx loaded a smaller context for it
            headers[SHRUNK_HEADER] = f"{timing['ctx_shrunk']['asked_ctx']}->{timing['ctx_shrunk']['loaded_ctx']}"
        with_defaults(entry, tr.body)  # the model's request defaults and default system message
        sent = with_lora(tr.body, seat.config.loras, entry, tr.contract)  # adapters: scales per request
        return seat, await seatcall.send(self.upstream, seat, path, sent, rid)

    @staticmethod
    async def _whole(seat: Any, r: Any, stack: contextlib.AsyncExitStack, shape: Callable[..., dict[str, Any]],
                     headers: dict[str, str], t0: float, timing: dict[str, Any]) -> Response:
        try:
            doc = await seatcall.read_json(r)
            seat.timings.add(doc.get("timings") or {})  # the seat's totals, for its history
        finally:
            await stack.aclose()
        done = sh.done_fields(finish=sh.finish_of(doc), usage=doc.get("usage"), timings=doc.get("timings"),
                              total_s=time.perf_counter() - t0, load_s=timing.get("load_s", 0.0))
        return JSONResponse({**shape(sh.text_of(doc), sh.tool_calls_of(doc)), **done}, headers=headers)

    @staticmethod
    async def _lines(seat: Any, r: Any, stack: contextlib.AsyncExitStack, shape: Callable[..., dict[str, Any]],
                     t0: float, timing: dict[str, Any]) -> AsyncIterator[bytes]:
        finish, usage, timings, calls = None, None, None, []
        try:
            async for chunk in seatcall.events(r):
                finish = sh.finish_of(chunk) or finish
                usage = chunk.get("usage") or usage
                timings = chunk.get("timings") or timings
                calls += sh.tool_calls_of(chunk)
                text = sh.text_of(chunk)
                if text:
                    yield _line({**shape(text), "done": False})
            seat.timings.add(timings or {})
            done = sh.done_fields(finish=finish, usage=usage, timings=timings,
                                  total_s=time.perf_counter() - t0, load_s=timing.get("load_s", 0.0))
            yield _line({**shape("", calls), **done})
        except ApiError as e:
            yield _line({"error": e.message})
        finally:
            await r.aclose()
            await stack.aclose()

    # -- chat and generate --

    async def chat(self, request: Request) -> Response:
        body, entry = await self.body_of(request)
        stream = body.get("stream") is not False  # Ollama streams unless told not to

        def shape(text: str, calls: list | None = None) -> dict[str, Any]:
            return {"model": entry.key, "created_at": _created(), "message": sh.message(text, calls)}

        tr = sh.chat_request(body, stream)
        if not body.get("messages"):
            return await self.load_or_unload(entry, tr.contract, new_request_id(), shape)
        return await self.complete(request, entry, "/v1/chat/completions", tr, stream, shape)

    async def generate(self, request: Request) -> Response:
        body, entry = await self.body_of(request)
        stream = body.get("stream") is not False

        def shape(text: str, _calls: list | None = None) -> dict[str, Any]:
            return {"model": entry.key, "created_at": _created(), "response": text}

        path, tr = sh.generate_request(body, stream)
        if not body.get("prompt") and not body.get("images"):
            return await self.load_or_unload(entry, tr.contract, new_request_id(), shape)
        return await self.complete(request, entry, path, tr, stream, shape)

    # -- embeddings --

    async def embed_any(self, request: Request, *, legacy: bool) -> Response:
        body, entry = await self.body_of(request)
        texts = sh.embed_inputs(body, legacy=legacy)
        contract = for_embeddings(sh.contract_of(body))  # any model: an embeddings seat is loaded for it
        rid = request.headers.get("x-request-id") or new_request_id()
        t0 = time.perf_counter()
        timing: dict[str, float] = {}
        req: dict[str, Any] = {"input": texts}
        if body.get("dimensions") is not None:
            req["dimensions"] = body["dimensions"]
        async with seatcall.held(self.door, entry, contract, rid, timing, share=self.door.share(request)) as seat:
            req = with_lora(req, seat.config.loras, entry, contract)  # adapters: scales per request
            doc = await seatcall.read_json(await seatcall.send(self.upstream, seat, "/v1/embeddings", req, rid))
        vectors = [d["embedding"] for d in sorted(doc.get("data") or [], key=lambda d: d.get("index", 0))]
        if legacy:
            return JSONResponse({"embedding": vectors[0] if vectors else []})
        return JSONResponse({"model": entry.key, "embeddings": vectors,
                             "total_duration": sh.ns(time.perf_counter() - t0),
                             "load_duration": sh.ns(timing.get("load_s")),
                             "prompt_eval_count": (doc.get("usage") or {}).get("prompt_tokens", 0)})

    async def embed(self, request: Request) -> Response:
        return await self.embed_any(request, legacy=False)

    async def embeddings(self, request: Request) -> Response:
        return await self.embed_any(request, legacy=True)


async def version() -> dict:
    return {"version": OLLAMA_API_VERSION, "fitevict": __version__}


def router(door: Door) -> APIRouter:
    """The Ollama routes over ``door``: registration only; the handlers are ``OllamaRoutes``' methods."""
    app = APIRouter()
    o = OllamaRoutes(door)
    tag = ["ollama"]
    app.get("/api/version", tags=tag, summary="The Ollama API version these routes follow")(version)
    app.get("/api/tags", tags=tag, summary="The catalog, as `ollama list` shows it")(ollama_errors(o.tags))
    app.get("/api/ps", tags=tag, summary="What is loaded, with fitevict's measured bytes")(ollama_errors(o.ps))
    app.post("/api/show", tags=tag, summary="One model's details")(ollama_errors(o.show))
    app.post("/api/chat", tags=tag, summary="Chat (NDJSON stream by default)")(ollama_errors(o.chat))
    app.post("/api/generate", tags=tag,
             summary="Generate from a prompt (NDJSON stream by default)")(ollama_errors(o.generate))
    app.post("/api/embed", tags=tag, summary="Embeddings from any model")(ollama_errors(o.embed))
    app.post("/api/embeddings", tags=tag,
             summary="Embeddings, the older route (one prompt)")(ollama_errors(o.embeddings))
    return app


def _created() -> str:
    return sh.iso(time.time())


def _line(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc).encode() + b"\n"


__all__ = ["OLLAMA_API_VERSION", "OllamaRoutes", "router"]
