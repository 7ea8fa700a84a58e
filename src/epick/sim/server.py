"""One simulated vLLM server: an engine driven in real time behind vLLM's OpenAI-compatible API.

The engine steps on the event loop: each step's simulated duration is slept (divided by
`time_scale`), then its tokens are handed to the waiting responses. Times in metrics and
histograms are simulated seconds, what the modelled GPU server would report. Request bodies and
the OpenAI-shaped responses and stream chunks are `epick.sim.openai_api`'s.

Fault injection, both seeded by `ServerOptions.seed` (and the server's index): `failure_rate` answers
a share of generation requests with an error at once; `latency_spike_rate` holds a share of the
accepted ones `latency_spike_s` wall seconds before they reach the engine (see `SimServer._spike`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from epick.sim import errors, tokenizing
from epick.sim.engine import Engine, KVEvent, RequestOutput, SimRequest, StepResult
from epick.sim.errors import APIError
from epick.sim.kv_events import KVEventPublisher, VLLMHashes
from epick.sim.metrics import ServerMetrics
from epick.sim.openai_api import (
    _ChatWriter,
    _CompletionWriter,
    _model_card,
    _sse,
    _Writer,
    cache_salt,
    chat_prompt,
    completion_prompt,
    finish_reason,
    read_json,
    usage,
)
from epick.sim.options import ServerOptions
from epick.sim.tokenize_api import detokenized, rendered_chat, rendered_completions, tokenized

IDENTITY_HEADER = "x-epick-sim-server"
# How often a request held by a latency spike looks whether its client has gone (wall seconds).
SPIKE_POLL_S = 0.05
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(slots=True)
class _Pending:
    """A request's channel from the engine loop to its HTTP response."""

    request: SimRequest
    # None: the server is stopping and no more output will come.
    queue: asyncio.Queue[RequestOutput | None] = field(default_factory=asyncio.Queue)


class SimServer:
    def __init__(self, options: ServerOptions, index: int = 0) -> None:
        self.options = options
        self.port = options.port + index if options.port else 0
        self.name = f"{options.name}-{index}" if options.name and options.count > 1 else options.name
        self.engine = Engine(options.engine)
        self.metrics = ServerMetrics(self.engine, options.model)
        self.tokenizer = tokenizing.load(options.tokenizer)
        self.loras: dict[str, int] = {}
        self._adapters: dict[int, tuple[str, str]] = {}  # LoRA id -> (name, path), for the KV events
        self._next_lora_id = 0
        if options.lora_modules and options.engine.max_loras <= 0:
            raise ValueError("--lora-modules needs LoRA slots: set --max-loras to 1 or more")
        for module in options.lora_modules:
            lora_name, _, path = module.partition("=")
            self._add_lora(lora_name, path)
        self._rng = random.Random(options.seed * 1000 + index)
        # Spikes draw from their own generator, so turning them on leaves the failure draws as they were.
        self._spike_rng = random.Random(f"latency-spike:{options.seed}:{index}")
        self.spikes_injected = 0  # requests a latency spike was drawn for
        self.spikes_in_flight = 0  # requests held by a spike right now
        self._stopping = asyncio.Event()
        self._index = index
        self._pending: dict[str, _Pending] = {}
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._runner: web.AppRunner | None = None
        self._publisher: KVEventPublisher | None = None
        self._hashes: VLLMHashes | None = None
        self._t0_wall = 0.0
        self._t0_sim = 0.0
        self._last_prefix = (0, 0)

    # Lifecycle.
    async def start(self) -> None:
        app = web.Application(middlewares=[self._identity], client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/v1/load_lora_adapter", self._load_lora)
        app.router.add_post("/v1/unload_lora_adapter", self._unload_lora)
        app.router.add_post("/reset_prefix_cache", self._reset_prefix_cache)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/detokenize", self._detokenize)
        app.router.add_post("/v1/chat/completions/render", self._render_chat)
        app.router.add_post("/v1/completions/render", self._render_completions)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=5.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.options.host, self.port)
        await site.start()
        if self.port == 0:
            self.port = int(self._runner.addresses[-1][1])
        if self.name is None:
            self.name = f"{self.options.host}:{self.port}"
        if self.options.kv_events_endpoint:
            endpoint = _offset_endpoint(self.options.kv_events_endpoint, self._index)
            topic = f"kv@{self.options.host}:{self.port}@{self.options.model}"
            self._hashes = VLLMHashes(
                self.options.engine.block_size,
                self.options.prefix_caching_hash_algo,
                os.environ.get("PYTHONHASHSEED"),  # vLLM's seed of NONE_HASH
                adapters=self._adapters.get,
                requests=lambda: [p.request for p in self._pending.values()],
            )
            self._publisher = KVEventPublisher(endpoint, topic, encoding=self.options.kv_events_encoding)
        loop = asyncio.get_running_loop()
        self._t0_wall = loop.time()
        self._loop_task = asyncio.create_task(self._run_engine(), name=f"engine {self.name}")

    async def stop(self) -> None:
        # Requests in flight end now (streams with an error event, others with 503), so the HTTP
        # side can close without waiting for them; requests held by a latency spike end with 503.
        self._stopping.set()
        for pending in list(self._pending.values()):
            pending.queue.put_nowait(None)
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        if self._runner is not None:
            await self._runner.cleanup()
        if self._publisher is not None:
            self._publisher.close()

    @property
    def url(self) -> str:
        return f"http://{self.options.host}:{self.port}"

    # The engine loop.
    def sim_now(self) -> float:
        return self._t0_sim + (asyncio.get_running_loop().time() - self._t0_wall) * self.options.time_scale

    async def _run_engine(self) -> None:
        loop = asyncio.get_running_loop()
        scale = self.options.time_scale
        while True:
            if not self.engine.has_work:
                self._wake.clear()
                await self._wake.wait()
            result = self.engine.step(self.sim_now())
            if result.num_scheduled == 0:
                self._wake.clear()  # work that cannot run yet: wait for a change
                await self._wake.wait()
                continue
            wake_at = self._t0_wall + (result.end - self._t0_sim) / scale
            delay = wake_at - loop.time()
            await asyncio.sleep(delay if delay > 0 else 0)
            self._deliver(result)

    def _deliver(self, result: StepResult) -> None:
        m = self.metrics
        queries, hits = self.engine.scheduler.prefix_queries, self.engine.scheduler.prefix_hits
        m.prefix_queries.inc(queries - self._last_prefix[0])
        m.prefix_hits.inc(hits - self._last_prefix[1])
        self._last_prefix = (queries, hits)
        for out in result.outputs:
            req = out.request
            if req.num_output_tokens == 1:
                assert req.first_token_time is not None
                m.ttft.observe(req.first_token_time - req.arrival_time)
                m.queue_time.observe((req.first_scheduled_time or req.arrival_time) - req.arrival_time)
                m.prompt_tokens.inc(req.num_prompt_tokens)
            else:
                m.itl.observe(result.duration)
            m.generation_tokens.inc(len(out.new_token_ids))
            if out.finished:
                m.e2e.observe((req.finish_time or result.end) - req.arrival_time)
                m.success(req.finish_reason.value if req.finish_reason else "length")
            pending = self._pending.get(req.request_id)
            if pending is not None:
                pending.queue.put_nowait(out)
        if self._publisher is not None and result.events:
            self._publish(result.events)

    # HTTP plumbing.
    @web.middleware
    async def _identity(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            response = await handler(request)
        except APIError as e:
            response = web.json_response(e.body(), status=e.status)
        except web.HTTPException as e:
            kind = "NotFoundError" if e.status == 404 else "BadRequestError"
            body = {"error": {"message": e.reason, "type": kind, "param": None, "code": None}}
            response = web.json_response(body, status=e.status)
        if not response.prepared:
            response.headers[IDENTITY_HEADER] = self.name or ""
        return response

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _metrics(self, request: web.Request) -> web.Response:
        names = request.query.getall("name[]", [])
        return web.Response(
            body=self.metrics.exposition(names), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def _models(self, request: web.Request) -> web.Response:
        created = int(time.time())
        base = self.options.model
        max_len = self.options.engine.max_model_len
        data = [_model_card(base, base, None, created, max_len)]
        data += [_model_card(name, name, base, created, max_len) for name in self.loras]
        return web.json_response({"object": "list", "data": data})

    def _publish(self, events: list[KVEvent]) -> None:
        """The engine's events, as vLLM's (its block hashes), to the KV-event subscribers."""
        assert self._publisher is not None and self._hashes is not None
        self._publisher.publish(self._hashes.translate(events))

    def _add_lora(self, name: str, path: str = "") -> None:
        if not name:
            raise errors.bad_request("lora_name is required", "lora_name")
        if name not in self.loras:
            # Ids only grow: an adapter loaded after an unload never shares another's cache blocks.
            self._next_lora_id += 1
            self.loras[name] = self._next_lora_id
            self._adapters[self._next_lora_id] = (name, path)

    async def _load_lora(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        name = body.get("lora_name")
        if not isinstance(name, str) or not name:
            raise errors.bad_request("lora_name must be a non-empty string", "lora_name")
        if self.options.engine.max_loras <= 0:
            raise errors.bad_request("LoRA is not enabled on this server (max_loras is 0)")
        if name in self.loras:
            raise errors.bad_request(f"The lora adapter '{name}' has already been loaded.", "lora_name")
        path = body.get("lora_path")
        self._add_lora(name, path if isinstance(path, str) else "")
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def _unload_lora(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        name = body.get("lora_name")
        if not isinstance(name, str) or name not in self.loras:
            raise APIError(
                404, f"The lora adapter '{name}' cannot be found.", "NotFoundError", None, "lora_name"
            )
        del self.loras[name]
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")

    async def _reset_prefix_cache(self, request: web.Request) -> web.Response:
        if not self.engine.reset_prefix_cache():
            raise errors.bad_request("the prefix cache cannot be reset while requests are running")
        events = self.engine.pool.drain_events()
        if self._publisher is not None:
            self._publish(events)
        return web.Response(status=200)

    # vLLM's tokenizer endpoints.
    def _check_optional_model(self, body: dict[str, Any]) -> None:
        model = body.get("model")
        if model is None or model == "":
            return
        if not isinstance(model, str):
            raise errors.bad_request("'model' must be a string", "model")
        if model != self.options.model and model not in self.loras:
            raise errors.model_not_found(model)

    async def _tokenize(self, request: web.Request) -> web.Response:
        """POST /tokenize, as vLLM (`epick.sim.tokenize_api.tokenized`)."""
        try:
            body = await read_json(request)
            self._check_optional_model(body)
            answer = tokenized(body, self.tokenizer, self.options.engine.max_model_len)
        except APIError as e:
            raise errors.with_status_code(e) from None
        return web.json_response(answer)

    async def _detokenize(self, request: web.Request) -> web.Response:
        """POST /detokenize, as vLLM (`epick.sim.tokenize_api.detokenized`)."""
        try:
            body = await read_json(request)
            self._check_optional_model(body)
            answer = detokenized(body, self.tokenizer)
        except APIError as e:
            raise errors.with_status_code(e) from None
        return web.json_response(answer)

    async def _render_chat(self, request: web.Request) -> web.Response:
        """POST /v1/chat/completions/render, as vLLM (`epick.sim.tokenize_api.rendered_chat`)."""
        body = await read_json(request)
        self._check_optional_model(body)
        return web.json_response(
            rendered_chat(body, self.tokenizer, self.options.engine.max_model_len, uuid.uuid4().hex[:16])
        )

    async def _render_completions(self, request: web.Request) -> web.Response:
        """POST /v1/completions/render, as vLLM (`epick.sim.tokenize_api.rendered_completions`)."""
        body = await read_json(request)
        self._check_optional_model(body)
        return web.json_response(
            rendered_completions(
                body, self.tokenizer, self.options.engine.max_model_len, uuid.uuid4().hex[:16]
            )
        )

    # Inference.
    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await read_json(request)
        return await self._generate(request, body, completion_prompt(body, self.tokenizer), chat=False)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await read_json(request)
        return await self._generate(request, body, chat_prompt(body, self.tokenizer), chat=True)

    def _check(self, body: dict[str, Any]) -> tuple[str, str | None, int]:
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise errors.bad_request("'model' is required", "model")
        if model != self.options.model and model not in self.loras:
            raise errors.model_not_found(model)
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        if max_tokens is None:
            max_tokens = 0  # unset: the generator picks the default, capped by the room left
        elif not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise errors.bad_request("'max_tokens' must be a positive integer", "max_tokens")
        if self.options.failure_rate > 0 and self._rng.random() < self.options.failure_rate:
            kind = self._rng.choice(self.options.failure_types)
            raise errors.injected(kind, model, self.options.engine.max_model_len)
        return model, model if model in self.loras else None, max_tokens

    async def _generate(
        self, http: web.Request, body: dict[str, Any], tokens: list[int], *, chat: bool
    ) -> web.StreamResponse:
        model, lora, max_tokens = self._check(body)
        salt = cache_salt(body)
        if not tokens:
            raise errors.bad_request("the prompt is empty", "messages" if chat else "prompt")
        max_len = self.options.engine.max_model_len
        if max_tokens == 0:
            max_tokens = max(1, min(self.options.default_max_tokens, max_len - len(tokens)))
        if len(tokens) + max_tokens > max_len:
            raise errors.context_length(max_len, len(tokens), max_tokens)
        stream = body.get("stream") is True
        options = body.get("stream_options") or {}
        include_usage = bool(isinstance(options, dict) and options.get("include_usage"))
        transfer = body.get("kv_transfer_params") or {}
        remote_prefill = isinstance(transfer, dict) and bool(transfer.get("do_remote_prefill"))
        rate = self.options.latency_spike_rate
        spiked = rate > 0 and self._spike_rng.random() < rate  # no draw at rate 0, as for failures
        if spiked and not await self._spike(http):
            return web.Response(status=499, reason="Client Closed Request")  # nobody is there to read it
        role = self.options.role
        if role == "prefill":
            max_tokens = 1  # a prefill server stops after the first token; decode continues elsewhere
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        req = SimRequest(
            request_id,
            tokens,
            max_tokens,
            arrival_time=self.sim_now(),
            lora=lora,
            lora_id=self.loras.get(lora) if lora else None,
            cache_salt=salt,
            remote_prefill=remote_prefill and role != "prefill",
            output_plan=self.tokenizer.output_plan(request_id, max_tokens),
        )
        try:
            self.engine.add_request(req)
        except ValueError as e:
            raise errors.bad_request(str(e)) from None
        pending = self._pending[request_id] = _Pending(req)
        self._wake.set()
        writer = _ChatWriter(model, request_id) if chat else _CompletionWriter(model, request_id)
        try:
            if stream:
                return await self._stream(http, pending, writer, include_usage)
            return await self._collect(pending, writer)
        finally:
            self._pending.pop(request_id, None)
            if req.finish_time is None:
                self.engine.abort(request_id, self.sim_now())

    async def _spike(self, http: web.Request) -> bool:
        """Hold a request `latency_spike_s` wall seconds (not scaled by `time_scale`) before the engine.

        Nothing of the request exists outside this coroutine meanwhile: no engine entry, no response
        headers. False when the client went away during the spike (the request then never reaches
        the engine); a server that stops meanwhile answers 503 at once.
        """
        self.spikes_injected += 1
        self.spikes_in_flight += 1
        loop = asyncio.get_running_loop()
        end = loop.time() + self.options.latency_spike_s
        try:
            while (left := end - loop.time()) > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(left, SPIKE_POLL_S)):
                        await self._stopping.wait()
                if self._stopping.is_set():
                    raise APIError(503, "the server is shutting down", "server_error", "service_unavailable")
                if http.transport is None or http.transport.is_closing():
                    return False
            return True
        finally:
            self.spikes_in_flight -= 1

    async def _next(self, pending: _Pending) -> RequestOutput:
        out = await pending.queue.get()
        if out is None:
            raise APIError(503, "the server is shutting down", "server_error", "service_unavailable")
        return out

    async def _collect(self, pending: _Pending, writer: _Writer) -> web.Response:
        texts = []
        while True:
            out = await self._next(pending)
            texts.append(self.tokenizer.decode(out.new_token_ids))
            if out.finished:
                break
        body = writer.full("".join(texts), finish_reason(pending.request), usage(pending.request))
        self._add_transfer_params(body, pending.request)
        return web.json_response(body)

    async def _stream(
        self, http: web.Request, pending: _Pending, writer: _Writer, include_usage: bool
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        response.headers[IDENTITY_HEADER] = self.name or ""
        await response.prepare(http)
        for chunk in writer.opening():
            await response.write(_sse(chunk))
        while True:
            try:
                out = await self._next(pending)
            except APIError as e:
                await response.write(_sse(e.body()))
                break
            text = self.tokenizer.decode(out.new_token_ids)
            finish = finish_reason(pending.request) if out.finished else None
            chunk = writer.delta(text, finish)
            if out.finished:
                self._add_transfer_params(chunk, pending.request)
            await response.write(_sse(chunk))
            if out.finished:
                break
        if include_usage:
            await response.write(_sse(writer.usage_chunk(usage(pending.request))))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    def _add_transfer_params(self, body: dict[str, Any], req: SimRequest) -> None:
        if self.options.role != "prefill":
            return
        body["kv_transfer_params"] = {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": self.name,
            "remote_block_ids": list(range(-(-req.num_prompt_tokens // self.options.engine.block_size))),
            "remote_host": self.options.host,
            "remote_port": self.port,
        }


def _offset_endpoint(endpoint: str, index: int) -> str:
    """tcp://host:port → tcp://host:(port + index), one publisher per server of a --count process."""
    if index == 0:
        return endpoint
    head, sep, port = endpoint.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--kv-events-endpoint {endpoint!r}: with --count, give tcp://HOST:PORT")
    return f"{head}:{int(port) + index}"


async def serve(options: ServerOptions, *, ready: Callable[[list[SimServer]], None] | None = None) -> None:
    """Run `options.count` servers on consecutive ports until cancelled."""
    servers = [SimServer(options, i) for i in range(options.count)]
    try:
        for s in servers:
            await s.start()
        if ready is not None:
            ready(servers)
        await asyncio.Event().wait()
    finally:
        for s in servers:
            await s.stop()
