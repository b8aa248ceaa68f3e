"""create_app(generator, settings): the FastAPI app of `jacobi-rt serve` (needs the [serve] extra).

OpenAI's `POST /v1/completions`, `POST /v1/chat/completions` (the artifact's chat template applied),
`POST /v1/responses` (translated into a chat request: responses.py; `GET`/`DELETE /v1/responses/{id}` over its
store) and `GET /v1/models`, plus
`GET /health` and Prometheus' `GET /metrics`. It is built only on the public Generator API
(`Generator.start`: text pieces, then the GenerationResult), so it is also the reference for
embedding the runtime in a service of your own:

    stream = generator.start(messages=[...], max_new_tokens=64)   # checks and tokenizes now
    for piece in stream: ...                                      # on a worker thread
    stream.result.stats.tokens_per_pass                           # after the last piece
    stream.close()                                                # stops early, frees the KV buffers

Errors are OpenAI error objects ({"error": {"message", "type", "param", "code"}}): 400 bad input
(invalid JSON, wrong types, prompt or prompt + max_tokens over the context, a field jacobi-rt
cannot honour), 401 missing or wrong API key, 403 a Host header that is not this server's address
(hosts.py), 404 unknown model or route, 413 body too large, 415 a body that is not
application/json, 429 with Retry-After when every worker is busy and the queue is full (decided
before the body is parsed), 500 with only a request id (the details go to the server's log), 503
while shutting down, 504 on timeout (a stream that times out sends an error event, then [DONE]).
A client that disconnects stops its generation after the current pass and frees its slot; one that
leaves before sending its whole body is counted as a 499 (nginx's "client closed request") with one
log line. /health and the running/waiting gauges report what runs: with --max-batch, the batcher's
rows (a cancelled row runs to the end of its pass, after its worker has let go).
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from jacobi_rt.runtime import Batcher, GenerationParams, Generator, InputError

from .bodies import parse_json, read_body
from .choices import Choices
from .errors import LOG, APIError, from_input_error, internal_error, timeout_error
from .history import for_template
from .hosts import HostCheck
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from .metrics import Metrics, MetricsMiddleware
from .openapi import Served, install
from .pool import GenerationTimeout, Job, PoolClosed, QueueFull, Ticket, WorkerPool
from .replies import DONE, Reply, sse
from .responses import ResponseEvents, ResponseStore, Turn, parse_response, renamed
from .schemas import GenerationCall, parse_chat, parse_completion
from .settings import ServerSettings
from .tool_protocol import protocol, resolve_tools

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
P = TypeVar("P")  # a parsed request: a GenerationCall, or a Responses Turn
CLIENT_CLOSED_REQUEST = 499  # nginx's status for a client that left; nobody reads it, the metrics count it


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


@dataclass
class Load:
    """What runs and waits now: the batcher's rows, and its queue plus the pool's."""

    pool: WorkerPool
    batcher: Batcher

    def running(self) -> int:
        return self.batcher.running

    def waiting(self) -> int:
        return self.pool.queued + self.batcher.queued


@dataclass
class Server:
    """What the routes share: the generator, the settings, the worker pool and the metrics."""

    generator: Generator
    settings: ServerSettings
    pool: WorkerPool
    load: Load
    metrics: Metrics
    created: int
    preparing: ThreadPoolExecutor  # chat templates and tokenizing, off the event loop, on a bounded set of threads

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.settings.model_id:
            raise APIError(
                404,
                f"the model {model!r} does not exist; this server serves {self.settings.model_id!r} "
                "(see GET /v1/models)",
                "model",
                "model_not_found",
            )

    def start(self, call: GenerationCall) -> Choices:
        """Check the request against the model (tokenizing the prompt) and prepare its generation (n choices)."""
        context = (
            self.generator.limits.max_context
        )  # a TensorRT engine or the batcher's slots may hold less than the manifest
        default = context if call.messages is not None else self.settings.completion_max_tokens
        try:
            params = GenerationParams.of(
                call.params,
                max_new_tokens=call.max_tokens or default,
                strategy=call.strategy or self.settings.default_strategy,
            )
            prompt, messages = self._with_tools(call)
            stream = Choices(
                [self.generator.start(prompt, messages=messages, params=params, seed=seed) for seed in call.seeds]
            )
        except InputError as exc:
            raise from_input_error(exc, call.prompt_param) from None
        if call.max_tokens and stream.prompt_tokens + call.max_tokens > context:
            stream.close()
            raise APIError(
                400,
                f"this model's context holds {context} tokens (prompt + output); the prompt has "
                f"{stream.prompt_tokens} tokens, so max_tokens can be at most {context - stream.prompt_tokens}, "
                f"not {call.max_tokens}",
                "max_tokens",
                "context_length_exceeded",
            )
        return stream

    def _with_tools(self, call: GenerationCall) -> tuple[str | list[int] | None, list[dict] | None]:
        """The prompt and messages to generate from: a chat with tools, on a template that renders them, as the
        template's text with the tools in it (ids), unless the generic protocol describes them (tool_protocol.py).
        A history with tool calls and results is shaped for the template (history.py)."""
        tokenizer = self.generator.tokenizer
        messages = None if call.messages is None else for_template(call.messages, tokenizer.chat_template)
        generic = call.tools is not None and call.tools.generic
        if not call.tool_specs or messages is None or not tokenizer.takes_tools or generic:
            return call.prompt, messages
        text = tokenizer.render_chat(messages, add_generation_prompt=True, tools=call.tool_specs)
        return tokenizer.encode(text, add_special_tokens=False), None

    def refuse_if_full(self) -> None:
        """429 at once when every place is taken, before the body is even read."""
        if self.pool.full:
            raise self._busy()

    def admit(self) -> Ticket:
        """A place in the pool, taken before any work on the request (else 429, or 503 when shutting down)."""
        try:
            return self.pool.admit()
        except QueueFull:
            raise self._busy() from None
        except PoolClosed:
            raise _shutting_down() from None

    def _busy(self) -> APIError:
        seconds = self.settings.retry_after_seconds
        return APIError(
            429,
            f"the server is busy ({self.pool.workers} running, {self.pool.queue_size} queued); retry in {seconds} s",
            None,
            "queue_full",
            {"Retry-After": str(seconds)},
        )

    def submit(self, stream: Choices, ticket: Ticket, deadline: float) -> Job:
        job = Job(stream, asyncio.get_running_loop(), deadline)
        try:
            self.pool.submit(job, ticket)
        except PoolClosed:
            stream.close()
            raise _shutting_down() from None
        return job


def _shutting_down() -> APIError:
    return APIError(503, "the server is shutting down", None, "shutting_down")


@dataclass
class Run:
    """One admitted generation with its deadline and timings; end() cancels it (if still going) and records it."""

    server: Server
    job: Job
    arrived: float  # time.monotonic()
    first_piece: float | None = None

    @property
    def deadline(self) -> float:
        return self.arrived + self.server.settings.request_timeout

    async def pieces(self) -> AsyncIterator[str]:
        async for piece in self.job.pieces(self.deadline):
            if self.first_piece is None:
                self.first_piece = time.monotonic()
            yield piece

    def _first_token(self, outcome: str) -> float | None:
        """Seconds from arrival to the first new token: when its text came, or for tokens that made no
        text (an incomplete UTF-8 character, a special token) when the prefill that made it ended."""
        if self.first_piece is not None:
            return self.first_piece - self.arrived
        results, started = self.job.stream.results if outcome == "finished" else (), self.job.started_at
        if results and started is not None and results[0].stats.new_tokens:
            return started - self.arrived + results[0].stats.prefill_seconds
        return None

    def end(self, outcome: str) -> None:
        self.job.cancel()  # a no-op when the job finished
        started = self.job.started_at
        self.server.metrics.observe_generation(
            outcome,
            stats=[result.stats for result in self.job.stream.results] if outcome == "finished" else (),
            first_token=self._first_token(outcome),
            queue_wait=None if started is None else started - self.arrived,
            latency=time.monotonic() - self.arrived if outcome == "finished" else None,
        )


def create_app(generator: Generator, settings: ServerSettings) -> FastAPI:
    """The ASGI app serving `generator` as the model `settings.model_id`."""
    # Every generation is a row of the one batcher; a worker thread per slot only relays its row's pieces.
    batcher = generator.batcher or generator.start_batching(settings.max_batch, settings.batch_context)
    pool = WorkerPool(batcher.slots, settings.queue_size)
    load = Load(pool, batcher)
    metrics = Metrics(settings.model_id, load.running, load.waiting, pool.workers, pool.queue_size)
    batcher.stats.observers.append(metrics.observe_pass)
    server = Server(
        generator,
        settings,
        pool,
        load,
        metrics,
        int(time.time()),
        ThreadPoolExecutor(min(batcher.slots, 4), thread_name_prefix="jacobi-rt-prepare"),
    )

    @asynccontextmanager
    async def lifespan(app):
        yield
        await asyncio.to_thread(server.pool.shutdown)  # after uvicorn's grace period: cancel what is left
        server.preparing.shutdown(cancel_futures=True)
        if generator.batcher is batcher:
            await asyncio.to_thread(generator.stop_batching)

    docs = (
        dict(docs_url="/docs", redoc_url=None)
        if settings.docs
        else dict(docs_url=None, redoc_url=None, openapi_url=None)
    )
    app = FastAPI(title="jacobi-rt", summary="OpenAI-compatible server for Jacobi decoding", lifespan=lifespan, **docs)
    app.state.server = server
    install(
        app,
        Served(
            settings.model_id,
            generator.limits.max_context,
            generator.manifest.architecture.vocab_size,
            settings.api_key is not None,
            generator.draft is not None,
        ),
    )
    app.add_middleware(HostCheck, allowed=settings.allowed_hosts)
    app.add_middleware(MetricsMiddleware, metrics=server.metrics)  # outermost: refused hosts are counted too
    _add_error_handlers(app)
    app.include_router(_api_routes(server))
    app.include_router(_service_routes(server))
    return app


# -- routes -------------------------------------------------------------------------------------


def _api_routes(server: Server) -> APIRouter:
    router = APIRouter(prefix="/v1", dependencies=[Depends(_api_key_check(server.settings.api_key))])

    @router.post("/completions", summary="Continue a prompt (OpenAI completions)")
    async def completions(request: Request):
        return await _generate(server, request, partial(parse_completion, allow_constraints=True), chat=False)

    @router.post("/chat/completions", summary="Answer chat messages (OpenAI chat completions)")
    async def chat_completions(request: Request):
        return await _generate(server, request, partial(parse_chat, allow_constraints=True), chat=True)

    store = ResponseStore()

    @router.post("/responses", summary="Answer input items (OpenAI Responses)")
    async def responses(request: Request):
        return await _respond(server, request, partial(parse_response, store=store, model=server.settings.model_id))

    @router.get("/responses/{response_id}", summary="A stored Response (made with store: true)")
    async def stored_response(response_id: str):
        response = store.response(response_id)
        if response is None:
            raise _response_not_found(response_id, store)
        return response

    @router.delete("/responses/{response_id}", summary="Forget a stored Response")
    async def delete_response(response_id: str):
        if not store.delete(response_id):
            raise _response_not_found(response_id, store)
        return {"id": response_id, "object": "response", "deleted": True}

    @router.get("/models", summary="The served model")
    async def models():
        return {"object": "list", "data": [_model_card(server)]}

    @router.get("/models/{model:path}", summary="One model")
    async def model(model: str):
        server.check_model(model)
        return _model_card(server)

    return router


def _response_not_found(response_id: str, store: ResponseStore) -> APIError:
    return APIError(
        404,
        f"no stored response has the id {response_id[:80]!r} (this server keeps the last "
        f"{store.max_responses} responses made with store: true, in memory)",
        "response_id",
        "not_found",
    )


def _service_routes(server: Server) -> APIRouter:
    router = APIRouter()

    @router.get("/health", summary="Liveness and load")
    async def health():
        load = server.load
        body = {"status": "ok", "model": server.settings.model_id, "running": load.running(), "queued": load.waiting()}
        return JSONResponse(body)

    @router.get("/metrics", summary="Prometheus metrics", response_class=PlainTextResponse)
    async def metrics():
        return Response(server.metrics.render(), media_type=METRICS_CONTENT_TYPE)

    return router


def _model_card(server: Server) -> dict:
    manifest, limits = server.generator.manifest, server.generator.limits
    return {
        "id": server.settings.model_id,
        "object": "model",
        "created": server.created,
        "owned_by": "jacobi-rt",
        "jacobi": {
            "family": manifest.architecture.family,
            "max_context": limits.max_context,
            "max_window": limits.max_window,
            "dtype": manifest.dtype,
            "quantization": manifest.quantization,
            "draft": server.generator.draft is not None,
            "default_strategy": server.settings.default_strategy,
            "exactness": server.generator.exactness,
            "tools": protocol(server.generator.tokenizer),
        },
    }  # tool_choice "auto": "template" or "generic"


def _api_key_check(key: str | None) -> Callable:
    def check(request: Request) -> None:
        if key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
            raise APIError(
                401,
                "a valid API key is required: send 'Authorization: Bearer KEY' "
                "(the openai client: OpenAI(api_key=KEY))",
                None,
                "invalid_api_key",
                {"WWW-Authenticate": "Bearer"},
            )

    return check


# -- one generation -----------------------------------------------------------------------------


async def _generate(server: Server, request: Request, parse: Callable[[Any], GenerationCall], chat: bool):
    begun = await _begin(server, request, parse, lambda call: call)
    if isinstance(begun, Response):
        return begun
    call, run = begun
    reply = _reply(server, call, chat)
    if call.stream:
        return StreamingResponse(
            _sse_events(run, reply, call.include_usage, len(call.seeds)),
            media_type="text/event-stream",
            headers=SSE_HEADERS,
        )
    try:
        return JSONResponse(await _whole(run, reply, request))
    except ClientGone:
        return Response(status_code=CLIENT_CLOSED_REQUEST)


async def _respond(server: Server, request: Request, parse: Callable[[Any], Turn]):
    """POST /v1/responses: the chat generation of the translated request, answered as a Response (responses.py)."""
    begun = await _begin(
        server, request, parse, lambda turn: turn.call, renamed
    )  # Server.start's checks name chat's fields
    if isinstance(begun, Response):
        return begun
    turn, run = begun
    reply = _reply(server, turn.call, chat=True)
    if turn.call.stream:
        return StreamingResponse(
            _response_events(run, reply, ResponseEvents(turn)), media_type="text/event-stream", headers=SSE_HEADERS
        )
    try:
        return JSONResponse(turn.response(await _whole(run, reply, request)))
    except ClientGone:
        return Response(status_code=CLIENT_CLOSED_REQUEST)


async def _begin(
    server: Server,
    request: Request,
    parse: Callable[[Any], P],
    call_of: Callable[[P], GenerationCall],
    rename: Callable[[APIError], APIError] = lambda error: error,
) -> tuple[P, Run] | Response:
    """The parsed request and its admitted, submitted generation (or the 499 of a client that left mid-body);
    `rename`: an error of Server.start's checks about the fields the client sent."""
    arrived = time.monotonic()
    server.refuse_if_full()
    try:
        body = await read_body(request, server.settings.max_body_bytes)  # a client slow to send holds no place
    except ClientDisconnect:
        LOG.warning("a client (%s) left before sending its whole request body", _peer(request))
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    ticket = server.admit()  # a full server refuses before parsing, rendering or tokenizing anything
    try:
        parsed = parse(parse_json(body))
        call = call_of(parsed)
        server.check_model(call.model)
        try:
            resolve_tools(call, server.generator.tokenizer)  # tool_choice "auto": the model's tool protocol
            # tokenizing a long prompt would block the loop
            stream = await asyncio.get_running_loop().run_in_executor(server.preparing, server.start, call)
        except APIError as exc:
            raise rename(exc) from None
        run = Run(server, server.submit(stream, ticket, arrived + server.settings.request_timeout), arrived)
    except BaseException:
        ticket.release()  # a no-op once the job holds it
        raise
    return parsed, run


def _reply(server: Server, call: GenerationCall, chat: bool) -> Reply:
    return Reply(
        server.settings.model_id,
        chat,
        token_text=lambda token: server.generator.tokenizer.decode([token]),
        tools=call.tools,
    )


def _peer(request: Request) -> str:
    return f"{request.client.host}:{request.client.port}" if request.client else "unknown address"


async def _whole(run: Run, reply: Reply, request: Request) -> dict:
    async def drain() -> None:
        async for _ in run.pieces():
            pass

    outcome = "failed"
    try:
        await _unless_disconnected(request, drain())
        outcome = "finished"
        return reply.whole(run.job.stream.results)
    except GenerationTimeout:
        outcome = "timeout"
        raise timeout_error(run.server.settings.request_timeout) from None
    except (ClientGone, asyncio.CancelledError):
        outcome = "cancelled"
        raise
    except Exception as exc:
        raise internal_error(exc) from exc
    finally:
        run.end(outcome)


async def _sse_events(run: Run, reply: Reply, include_usage: bool, n: int) -> AsyncIterator[bytes]:
    """The stream (n choices one after another, chunks labelled by index); when the client
    disconnects, Starlette cancels it and end() stops the generation."""
    outcome = "failed"
    try:
        for chunk in reply.opening(n):
            yield sse(chunk)
        async for piece in run.pieces():
            for chunk in reply.piece(piece, piece.index, piece.logprobs, piece.tokens):
                yield sse(chunk)
        outcome = "finished"
        results = run.job.stream.results
        for index, result in enumerate(results):
            for chunk in reply.closing(result, index):
                yield sse(chunk)
        if include_usage:
            yield sse(reply.usage_chunk(results))
    except GenerationTimeout:
        outcome = "timeout"
        yield sse(timeout_error(run.server.settings.request_timeout).body())
    except (asyncio.CancelledError, GeneratorExit):
        outcome = "cancelled"
        raise
    except Exception as exc:
        yield sse(internal_error(exc).body())
    finally:
        run.end(outcome)
    yield DONE


async def _response_events(run: Run, reply: Reply, events: ResponseEvents) -> AsyncIterator[bytes]:
    """A streamed Response's typed events (responses.ResponseEvents), ended as _sse_events ends a chat stream."""
    outcome = "failed"
    try:
        for event in events.opening():
            yield event
        async for piece in run.pieces():
            for chunk in reply.piece(piece, piece.index, piece.logprobs, piece.tokens):
                for event in events.chunk(chunk):  # the chat stream's chunks, as Responses events
                    yield event
        outcome = "finished"
        results = run.job.stream.results
        closing = [event for chunk in reply.closing(results[0]) for event in events.chunk(chunk)]
        for event in closing + events.closing(reply.whole(results)):
            yield event
    except GenerationTimeout:
        outcome = "timeout"
        yield events.failed(timeout_error(run.server.settings.request_timeout))
    except (asyncio.CancelledError, GeneratorExit):
        outcome = "cancelled"
        raise
    except Exception as exc:
        yield events.failed(internal_error(exc))
    finally:
        run.end(outcome)


async def _unless_disconnected(request: Request, work: Awaitable) -> None:
    """Await `work`; raise ClientGone (and cancel it) if the client disconnects first."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone = watch.done() and not task.done()
        watch.cancel()
        if not task.done():
            task.cancel()
    if gone:
        raise ClientGone
    task.result()


async def _disconnect(request: Request) -> None:
    """Returns when the client disconnects (the body has been read, so receive() waits for that)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


# -- errors -------------------------------------------------------------------------------------


def _methods(request: Request) -> set[str]:
    """Every method some route serves at this path (GET and DELETE /v1/responses/{id} are two routes)."""
    path = request.scope["path"]
    return {
        method
        for route in request.app.routes
        if getattr(route, "path_regex", None) and route.path_regex.match(path)
        for method in getattr(route, "methods", None) or ()
    }


def _add_error_handlers(app: FastAPI) -> None:
    def respond(error: APIError) -> JSONResponse:
        return JSONResponse(error.body(), error.status, headers=error.headers)

    async def api_error(request, exc: APIError):
        return respond(exc)

    async def http_error(request, exc: HTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        message = f"no route {request.method} {request.url.path}" if exc.status_code in (404, 405) else str(exc.detail)
        headers = dict(exc.headers or {})
        if exc.status_code == 405:  # Starlette names the first matching route's methods only
            headers["Allow"] = ", ".join(sorted(_methods(request)))
        return respond(APIError(exc.status_code, message, None, code, headers))

    async def validation_error(request, exc: RequestValidationError):
        return respond(APIError(400, str(exc.errors()[:1]), None, "invalid_value"))

    async def unexpected(request, exc: Exception):
        return respond(internal_error(exc))

    app.add_exception_handler(APIError, api_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(Exception, unexpected)
