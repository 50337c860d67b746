"""Shared state and request helpers of the front door: auth, bodies, model names, contracts, errors."""

from __future__ import annotations

import hmac
import itertools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.requests import Request

from fitevict.config import Config
from fitevict.engines import REGISTRY, engine_class
from fitevict.pricing.gguf import PricingError
from fitevict.request.aliases import Aliased, Aliases
from fitevict.request.ask import Ask, Asks
from fitevict.request.catalog import AmbiguousModel, Catalog, CatalogEntry, GgufFileError, UnknownModel
from fitevict.request.contract import Contract, ContractError, for_embeddings, seat_key, unservable
from fitevict.request.contract import parse_contract as _parse_contract
from fitevict.server.bodies import BodyError
from fitevict.server.errors import ApiError
from fitevict.server.metrics import Metrics
from fitevict.server.routes import CHAT, RERANK, Route
from fitevict.server.sampler import MemorySampler
from fitevict.server.heapkeep import HeapKeep
from fitevict.server.upkeep import Upkeep
from fitevict.engines.upstream import Upstream
from fitevict.store import Store
from fitevict.schedule.errors import ModelUnreadable, RateLimited, unreadable_message
from fitevict.schedule.fair import Share
from fitevict.server.clients import PRIORITY_HEADER, client_of, share_for
from fitevict.supervisor import Busy, LoadFailed, Refused, Supervisor, SupervisorError


def parse_json(raw: bytes) -> Any:
    """A request body as JSON (an empty body is null), or OpenAI-style 400."""
    try:
        return json.loads(raw or b"null")
    except ValueError as e:
        raise ApiError(400, f"request body is not valid JSON: {e}", code="invalid_json") from None


@dataclass(frozen=True, slots=True)
class Prepared:
    """An inference request ready for a seat: what it asks of one (``request.ask.Ask``: the catalog entry, its load
    contract, the planner's request), and whether the body was changed (contract removed, defaults filled), so that
    an unchanged body is forwarded as received."""

    ask: Ask
    changed: bool
    aliased: Aliased | None = None  # the [aliases] entry the model was named by

    @property
    def entry(self) -> CatalogEntry:
        return self.ask.entry

    @property
    def contract(self) -> Contract | None:
        return self.ask.contract

    def origin(self, endpoint: str) -> dict[str, str]:
        """Where the request came from, for the history of a load it causes: its route, and the alias it named."""
        if self.aliased is None:
            return {"route": endpoint}
        return {"route": endpoint, "asked_as": self.aliased.name, "alias": self.aliased.alias}


def parse_contract(raw: Any) -> Contract | None:
    """The request's ``fitevict`` object, validated (``fitevict.request.contract``), as an OpenAI-style 400 when bad."""
    try:
        return _parse_contract(raw)
    except ContractError as e:
        raise ApiError(400, str(e), param=e.param) from None


_ID_PREFIX = os.urandom(4).hex()  # this process's own; the counter below makes each id unique within it
_ID_COUNTER = itertools.count(1)


def new_request_id() -> str:
    """A request id for a request that brought none: 16 hex digits, unique (a random prefix per process and a
    counter), with no system call on the hot path."""
    return f"{_ID_PREFIX}{next(_ID_COUNTER) & 0xFFFFFFFF:08x}"


@dataclass
class Door:
    """What every route shares: configuration, catalog, store, supervisor, metrics and the kept-alive
    connections to the seats."""

    config: Config
    catalog: Catalog
    store: Store
    sup: Supervisor
    metrics: Metrics
    pool: Upstream  # kept-alive connections per seat: the fast path's relay and ``seatcall``
    sampler: MemorySampler | None = None  # the memory report's live windows (fitevict.server.sampler)
    upkeep: Upkeep | None = None  # the store's pruning and the data folder's size (fitevict.server.upkeep)
    heap: HeapKeep | None = None  # malloc's free pages given back to the kernel (fitevict.server.heapkeep)
    asks: Asks = field(init=False)  # what requests ask of a seat, built once per model and contract (request.ask)
    aliases: Aliases = field(init=False)  # the config's [aliases]

    def __post_init__(self) -> None:
        self.asks = Asks(self.sup.prices)
        self.aliases = Aliases(self.config.aliases)

    def check_auth(self, request: Request, *, admin: bool) -> str:
        h = request.headers
        return self.check_key(h.get("authorization", ""), h.get("x-api-key", ""), admin=admin)

    def share(self, request: Request, body: Any = None) -> Share:
        """Who ``request`` is, for fairness (``server.clients``): its key's client, class and caps."""
        h = request.headers
        return share_for(self.config, self.check_auth(request, admin=False), h.get(PRIORITY_HEADER), body)

    def check_key(self, authorization: str, x_api_key: str, *, admin: bool) -> str:
        """The keys rule, on the two header values (``Authorization: Bearer <key>`` wins over ``x-api-key``). Returns
        the client the key names (``server.clients.client_of``)."""
        s = self.config.server
        if not s.auth_enabled:
            return client_of(self.config, "")
        key = authorization[7:].strip() if authorization[:7].lower() == "bearer " else x_api_key
        if _key_in(key, s.admin_keys):
            return client_of(self.config, key)
        if _key_in(key, s.api_keys):
            if not admin:
                return client_of(self.config, key)
            hint = "" if s.admin_keys else "; no admin key is configured: set server.admin_keys"
            raise ApiError(403, f"this endpoint needs an admin key (server.admin_keys); the key given is a user "
                                f"key{hint}", type="permission_error", code="admin_key_required")
        raise ApiError(401, "invalid or missing API key; send Authorization: Bearer <key> (server.api_keys)",
                       type="authentication_error", code="invalid_api_key")

    def check_body_size(self, size: int, *, declared: bool) -> None:
        """The body size limit (server.max_body_bytes), on a declared Content-Length or the bytes read so far."""
        limit = self.config.server.max_body_bytes
        if size > limit:
            msg = (f"request body is {size} bytes; the limit is {limit} (server.max_body_bytes)" if declared
                   else f"request body exceeds {limit} bytes (server.max_body_bytes)")
            raise ApiError(413, msg, code="body_too_large")

    async def read_json(self, request: Request) -> Any:
        declared = request.headers.get("content-length")
        if declared and declared.isdigit():
            self.check_body_size(int(declared), declared=True)
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            self.check_body_size(size, declared=False)
            chunks.append(chunk)
        return parse_json(b"".join(chunks))

    def prepare(self, body: Any, route: Route) -> Prepared:
        """An inference request's body checked and completed before anything changes: the fields its route needs
        (``route.check``), the model named, its load contract (an embeddings seat for the routes that need one),
        the gguf file, that an engine here can serve it, and the model's request defaults filled in where the
        request lacks the field. ``changed``: the body differs from what the client sent."""
        if not isinstance(body, dict):
            raise ApiError(400, "request body must be a JSON object", code="invalid_body")
        if route.check is not None:
            try:
                route.check(body)
            except BodyError as e:
                raise ApiError(400, f"{route.endpoint}: {e}", param=e.param, code=e.code) from None
        entry, aliased = self.resolve_named(body.get("model"))
        changed = "fitevict" in body
        contract = parse_contract(body.pop("fitevict", None))
        if route.seat != CHAT:
            contract = for_embeddings(contract)  # any model: an embeddings seat is loaded for it
        asked = self.ask(entry, contract)
        if route.seat == RERANK:
            self.check_reranker(asked)
        changed = with_defaults(entry, body) or changed
        return Prepared(asked, changed, aliased)

    def ask(self, entry: CatalogEntry, contract: Contract | None) -> Ask:
        """What the request asks of a seat (``request.ask``), built once, here, before it waits: a gguf file the
        model lacks, an adapter no engine here serves, or a model file that cannot be read is answered now."""
        if (why := unservable(entry, tuple(REGISTRY))) is not None:
            raise ApiError(400, why, param="model", code="engine_unavailable")
        try:
            return self.asks(entry, contract)
        except GgufFileError as e:
            raise ApiError(400, str(e), param="fitevict.gguf_file", code="invalid_gguf_file") from None
        except (PricingError, OSError) as e:
            self.sup.unreadable(seat_key(entry), e)  # its seat, if one runs, is stopped
            raise ApiError(500, unreadable_message(entry.key, e), type="server_error",
                           code="model_unreadable") from None

    def resolve(self, name: Any) -> CatalogEntry:
        return self.resolve_named(name)[0]

    def ranks(self, entry: CatalogEntry, path: Path) -> bool:
        """Whether a model reranks: its file declares rank pooling, or its arguments ask for it."""
        def pooling() -> int | None:
            try:
                return getattr(self.sup.prices.shape(path), "pooling_type", None)
            except (PricingError, OSError):
                return None  # an unreadable file declares nothing

        return engine_class(entry.engine).reranks(entry.settings.extra_args, pooling)

    def check_reranker(self, asked: Ask) -> None:
        """A rerank request for a model that does not rerank (a generative model) is a 400 naming those that do."""
        if self.ranks(asked.entry, asked.path):
            return
        rankers = [e.key for e in self.catalog.entries() if e.base is None and self.ranks(e, Path(e.path))]
        which = f"the reranking models here: {', '.join(rankers)}" if rankers else (
            "no model here reranks: add one whose GGUF declares rank pooling (a cross-encoder such as "
            "bge-reranker), or give a model extra_args = [\"--pooling\", \"rank\"]")
        raise ApiError(400, f"model {asked.entry.key!r} does not rerank (no rank pooling); {which}", param="model",
                       code="not_a_reranker", extra={"rerankers": rankers})

    def resolve_named(self, name: Any) -> tuple[CatalogEntry, Aliased | None]:
        """The model ``name`` selects, and the ``[aliases]`` entry it came by (None: a catalog name). The catalog's
        own names come first, then the alias table (``request.aliases``); an unknown name is a 404 naming the
        models it could have meant."""
        if not isinstance(name, str) or not name:
            raise ApiError(400, "'model' is required: name a model from GET /v1/models", param="model",
                           code="missing_model")
        entry = self.catalog.get(name)
        if entry is not None:
            return entry, None
        aliased = self.aliases.match(name) if self.aliases else None
        try:
            if aliased is not None:
                return self.catalog.resolve(aliased.target), aliased
            return self.catalog.resolve(name), None
        except AmbiguousModel as e:
            raise ApiError(400, f"{e} (GET /v1/models lists them)", param="model", code="ambiguous_model",
                           extra={"candidates": list(e.candidates)}) from None
        except UnknownModel as e:
            close = list(dict.fromkeys([*e.close_matches, *self.aliases.close(name)]))[:3]
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            what = (f"model {name!r} is an alias ([aliases] {aliased.alias!r}) of {aliased.target!r}, which is not "
                    f"in the catalog" if aliased is not None else f"model {name!r} does not exist")
            raise ApiError(404, f"{what}{hint} (GET /v1/models lists them)", type="not_found_error", param="model",
                           code="model_not_found", extra={"close_matches": close}) from None

    @staticmethod
    def supervisor_error(e: SupervisorError) -> ApiError:
        if isinstance(e, RateLimited):
            return ApiError(429, str(e), type="rate_limit_error", code="rate_limit_exceeded",
                            headers={"Retry-After": str(e.retry_after)})
        if isinstance(e, Busy):
            return ApiError(503, str(e), type="server_busy", code="busy", headers={"Retry-After": str(e.retry_after)})
        if isinstance(e, Refused):
            return ApiError(507, str(e), type="insufficient_memory", code="does_not_fit",
                            headers={"x-should-retry": "false"}, extra={"plan": e.plan.to_json()})
        if isinstance(e, LoadFailed):
            return ApiError(502, str(e), type="engine_error", code="load_failed", headers={"x-should-retry": "false"})
        if isinstance(e, ModelUnreadable):
            return ApiError(500, str(e), type="server_error", code="model_unreadable")
        return ApiError(500, str(e), type="server_error")


def with_defaults(entry: CatalogEntry, body: dict[str, Any]) -> bool:
    """Fill in what the request lacks from the model's own settings: its request defaults (``[models.<key>]
    request_defaults``, a store's params) and, for a chat that brings no system message, its default system message
    (a store's). Returns whether the body changed."""
    changed = False
    for k, v in entry.settings.request_defaults.items():
        if k not in body:  # only when the request lacks the field
            body[k] = v
            changed = True
    messages = body.get("messages")
    if entry.system and isinstance(messages, list) and not any(
            isinstance(m, dict) and m.get("role") == "system" for m in messages):
        body["messages"] = [{"role": "system", "content": entry.system}, *messages]
        changed = True
    return changed


def _key_in(key: str, keys: tuple[str, ...]) -> bool:
    """Constant-time membership, so a key cannot be guessed from response timing."""
    return any(hmac.compare_digest(key.encode(), k.encode()) for k in keys) if key else False
