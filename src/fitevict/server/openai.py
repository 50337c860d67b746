"""One model in OpenAI's format. The list (``plain``) and the inference routes (``fastpath``) are answered ahead
of FastAPI."""

from __future__ import annotations

from fastapi import APIRouter, Request

from fitevict.server.door import Door


def router(door: Door) -> APIRouter:
    app = APIRouter()
    check_auth, resolve = door.check_auth, door.resolve_named

    @app.get("/v1/models/{model_id:path}", tags=["openai"], summary="One model, OpenAI's format")
    async def get_model(model_id: str, request: Request) -> dict:
        check_auth(request, admin=False)
        e, aliased = resolve(model_id)
        if aliased is not None:  # a name of the config's [aliases]: the model it selects
            return {"id": model_id, "object": "model", "owned_by": "fitevict", "fitevict": {"alias_of": e.key}}
        return {"id": e.key, "object": "model", "owned_by": "fitevict"}

    return app
