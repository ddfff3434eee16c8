"""The OpenAI-compatible HTTP app over an AsyncEngine: routes, auth, errors, logging.

The app never starts or stops the engine (several apps may share one); `runner.py` does.
"""

from __future__ import annotations

import hmac
import importlib.metadata
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import Response
from fastapi.types import DecoratedCallable
from prometheus_client import CONTENT_TYPE_LATEST

from inferlab.engine.async_engine import AsyncEngine
from inferlab.server.access_log import CLIENT_GONE, AccessLogMiddleware
from inferlab.server.chat import create_chat_completion
from inferlab.server.completions import create_completion
from inferlab.server.context import ServerContext
from inferlab.server.disconnect import ClientDisconnected
from inferlab.server.errors import APIError, install_error_handlers
from inferlab.server.protocol import ModelCard, ModelList, ModelPermission
from inferlab.server.reasoning import REASONING_PARSERS, split_markers
from inferlab.server.settings import ServerSettings
from inferlab.server.tokenize import detokenize, tokenize

logger = logging.getLogger("inferlab.server")


def create_app(engine: AsyncEngine, settings: ServerSettings) -> FastAPI:
    _warn_of_split_markers(engine, settings)
    ctx = ServerContext(engine, settings)
    app = FastAPI(title="inferlab", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.inferlab = ctx
    install_error_handlers(app, settings.retry_after_s)
    app.add_exception_handler(ClientDisconnected, _client_gone)
    app.add_middleware(AccessLogMiddleware)
    if settings.allowed_origins:  # outermost: it answers browsers' preflights before the routes
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.allowed_origins),
                           allow_methods=["*"], allow_headers=["*"])
    _add_api_routes(app, ctx, [Depends(_key_checker(settings.api_key))])
    _add_service_routes(app, ctx)
    return app


def _warn_of_split_markers(engine: AsyncEngine, settings: ServerSettings) -> None:
    """A reasoning parser on a model whose tokenizer spells its markers in pieces is served
    (vLLM refuses it), but likely a mistake: said once, at start."""
    if settings.reasoning_parser is None:
        return
    split = split_markers(REASONING_PARSERS[settings.reasoning_parser], engine.tokenizer)
    if split:
        logger.warning(
            "--reasoning-parser %s: the model's tokenizer has no single token for %s, so this "
            "model likely does not reason; guided output and forced tool calls may end up "
            "inside thinking", settings.reasoning_parser, " or ".join(split))


def _get(app: FastAPI, path: str, **kwargs: Any) -> Callable[[DecoratedCallable], DecoratedCallable]:
    """A GET route that answers HEAD too, as Starlette's routes and prometheus_client's app do
    (uvicorn sends a HEAD answer's headers, never its body)."""
    return app.api_route(path, methods=["GET", "HEAD"], **kwargs)


def _add_api_routes(app: FastAPI, ctx: ServerContext, keyed: list) -> None:
    """The OpenAI routes and vLLM's tokenizer routes, behind the API key when there is one."""

    @app.post("/v1/completions", dependencies=keyed)
    async def completions(request: Request) -> Response:
        return await create_completion(request, ctx)

    @app.post("/v1/chat/completions", dependencies=keyed)
    async def chat_completions(request: Request) -> Response:
        return await create_chat_completion(request, ctx)

    def model_card(name: str) -> ModelCard:  # root: the weights loaded, as vLLM's is its path
        permission = ModelPermission(id=f"modelperm-{uuid.uuid4().hex}", created=ctx.created)
        return ModelCard(id=name, created=ctx.created, root=ctx.engine.model_path,
                         max_model_len=ctx.engine.max_model_len, permission=[permission])

    @_get(app, "/v1/models", dependencies=keyed)
    async def models() -> ModelList:  # a card a name, as vLLM lists them
        return ModelList(data=[model_card(name) for name in ctx.model_names])

    @_get(app, "/v1/models/{name:path}", dependencies=keyed)  # names may hold slashes (org/model)
    async def model(name: str) -> ModelCard:
        ctx.check_model(name)
        return model_card(name)

    @app.post("/tokenize", dependencies=keyed)
    async def tokenize_route(request: Request) -> dict:
        return await tokenize(request, ctx)

    @app.post("/detokenize", dependencies=keyed)
    async def detokenize_route(request: Request) -> dict:
        return await detokenize(request, ctx)


def _add_service_routes(app: FastAPI, ctx: ServerContext) -> None:
    """Health, metrics and version, open to balancers and scrapers without the API key."""

    @app.api_route("/ping", methods=["GET", "HEAD", "POST"])  # vLLM's (SageMaker's) health route
    @_get(app, "/health")
    async def health() -> Response:
        if ctx.is_healthy():
            return Response(status_code=200)
        reason = "shutting down" if ctx.draining else "the engine loop is not making progress"
        raise APIError(503, f"unhealthy: {reason}")  # the handler adds Retry-After

    @_get(app, "/metrics")
    async def metrics() -> Response:
        return Response(ctx.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @_get(app, "/version")
    async def version() -> dict:
        return {"version": importlib.metadata.version("inferlab")}


def _key_checker(api_key: str | None) -> Callable[[Request], Awaitable[None]]:
    expected = api_key.encode() if api_key is not None else None

    async def check(request: Request) -> None:
        if expected is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        # compare_digest: the time taken does not depend on how much of the key was right
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), expected):
            raise APIError(401, "missing or invalid API key (send 'Authorization: Bearer <key>')",
                           code="invalid_api_key")

    return check


async def _client_gone(_: Request, __: Exception) -> Response:
    return Response(status_code=CLIENT_GONE)
