"""The ASGI app: the OpenAI routes, vLLM's /tokenize and /detokenize, /health, /version and /stats
(the batches the engine ran)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TextIO

from fastapi import FastAPI

from flakecheck.machine.fingerprint import flakecheck_version
from flakecheck.serve.access_log import AccessLog
from flakecheck.serve.chat import router as chat_router
from flakecheck.serve.completions import router as completions_router
from flakecheck.serve.errors import APIError, install_error_handlers
from flakecheck.serve.response_record import ResponseRecord
from flakecheck.serve.state import ServerState
from flakecheck.serve.tokenize import router as tokenize_router


def build_app(state: ServerState, access_log: TextIO | None = None, record: TextIO | None = None) -> FastAPI:
    """The app over a built server state; its lifespan starts and stops the engine loop. With `access_log`,
    one line per request is written there (flakecheck.serve.access_log); with `record`, one line per generated
    choice with its tokens and top-2 logprobs (flakecheck.serve.response_record)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.loop.start()
        try:
            yield
        finally:
            state.loop.close()

    app = FastAPI(title="flakecheck serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.serve = state
    install_error_handlers(app)
    if record is not None:
        app.add_middleware(ResponseRecord, stream=record)
    if access_log is not None:
        app.add_middleware(AccessLog, stream=access_log)
    app.include_router(chat_router)
    app.include_router(completions_router)
    app.include_router(tokenize_router)

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [_model_card(state)]}

    @app.get("/v1/models/{model:path}")
    async def retrieve_model(model: str) -> dict[str, Any]:
        state.check_model(model)
        return _model_card(state)

    @app.get("/health")
    async def health() -> Any:
        broken = state.loop.broken
        if broken is not None:
            return APIError(503, f"unhealthy: {broken}").response()
        return {"status": "ok"}

    @app.get("/version")
    async def version() -> dict[str, Any]:
        return {"version": flakecheck_version(), "server": "flakecheck", "system_fingerprint": state.fingerprint}

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        s = state.settings
        return {**state.loop.stats.snapshot(), "max_num_seqs": s.max_num_seqs,
                "max_num_batched_tokens": s.max_num_batched_tokens, "enable_prefix_caching": s.enable_prefix_caching,
                "kernels": state.spec.policy.name, "system_fingerprint": state.fingerprint}

    return app


def _model_card(state: ServerState) -> dict[str, Any]:
    spec = state.spec
    return {"id": state.model_id, "object": "model", "created": state.created, "owned_by": "flakecheck",
            "root": state.settings.engine.model, "max_model_len": state.max_context,
            "flakecheck": {"kernels": spec.policy.name, "backend": spec.backend, "profile": spec.profile,
                           "dtype": str(state.loaded.dtype).removeprefix("torch."),
                           "machine": spec.machine.describe(), "verified": spec.verification.summary(),
                           # the scheduler's limits: a conformance check reads max_num_seqs (more in flight queue)
                           "max_num_seqs": state.settings.max_num_seqs,
                           "max_num_batched_tokens": state.settings.max_num_batched_tokens,
                           "enable_prefix_caching": state.settings.enable_prefix_caching}}
