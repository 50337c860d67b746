"""The OpenAI-compatible model list. The inference routes are answered ahead of FastAPI (``fastpath``)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request

from fitevict.pricing.adapters import listed_adapter_bytes
from fitevict.server.door import Door


def router(door: Door) -> APIRouter:
    app = APIRouter()
    catalog, sup, check_auth, resolve = door.catalog, door.sup, door.check_auth, door.resolve

    @app.get("/v1/models", tags=["openai"], summary="The catalog, OpenAI's format, plus residency and bytes")
    async def list_models(request: Request) -> dict:
        check_auth(request, admin=False)
        views = {v["key"]: v for v in sup.resident_views()}
        adapters: dict[str, list[str]] = {}
        for e in catalog.entries():
            if e.base is not None:
                adapters.setdefault(e.base, []).append(e.key)
        data = []
        for e in catalog.entries():
            v = views.get(e.base or e.key)  # an adapter is resident with its base's seat
            data.append({
                "id": e.key, "object": "model", "created": int(Path(e.path).stat().st_mtime) if Path(e.path).exists() else 0,
                "owned_by": "fitevict",
                "fitevict": {"engine": e.engine, "aliases": list(e.aliases), "pinned": e.pinned,
                             "file": {"bytes": e.file_bytes, "source": "file-size"},
                             "resident": v is not None, "state": v["state"] if v else None,
                             "resident_bytes": v["devices"] if v else None,
                             **({"base": e.base, "adapter_bytes": listed_adapter_bytes(e.kind, e.files)}
                                if e.base else {}),
                             **({"adapters": adapters[e.key]} if e.key in adapters else {})},
            })
        return {"object": "list", "data": data}

    @app.get("/v1/models/{model_id}", tags=["openai"], summary="One model, OpenAI's format")
    async def get_model(model_id: str, request: Request) -> dict:
        check_auth(request, admin=False)
        e = resolve(model_id)
        return {"id": e.key, "object": "model", "owned_by": "fitevict"}

    return app
