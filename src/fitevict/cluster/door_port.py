"""What the cluster's admin routes and page use of the front door (``front.ClusterDoor``), as a protocol: they take
the door as this, so that they need not import it (the door imports them)."""

from __future__ import annotations

from typing import Any, Protocol

import httpx

from fitevict.cluster.fleet import Fleet
from fitevict.cluster.wire import Receive, Scope, Send
from fitevict.config import Config


class Keys(Protocol):
    def check(self, scope: Scope, *, admin: bool = False) -> None: ...


class Front(Protocol):
    config: Config
    fleet: Fleet
    keys: Keys
    routed: dict[tuple[str, str], int]

    async def relay(self, key: str, contract: dict | None, raw: bytes, scope: Scope, receive: Receive, send: Send,
                    *, name_node: bool = False) -> None: ...

    def resolve(self, name: str) -> str: ...

    async def ask_each(self, method: str, path: str, *, nodes: list[str] | None = None,
                       params: dict[str, str] | None = None, content: bytes | None = None,
                       timeout: float = 30.0) -> dict[str, httpx.Response]: ...

    async def each_node(self, path: str, params: dict[str, str] | None = None) -> dict[str, dict[str, Any]]: ...
