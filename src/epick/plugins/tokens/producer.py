"""`token-producer` (and its deprecated name `tokenizer`): the request's token ids, computed once and
set on the request body for every plugin that reads them (llm-d/llm-d-router,
pkg/epp/framework/plugins/requestcontrol/dataproducer/tokenizer).

Backends, as upstream chooses them: `udsTokenizerConfig`, else `vllm` or `modelName`, else `estimate`.
- `udsTokenizerConfig` (`socketFile`; `useTCP`, host:port for tests; `modelTokenizerMap`): llm-d's
  tokenizer sidecar, gRPC on a Unix socket (`epick.plugins.tokens.uds`). The producer is not ready
  (readiness is NOT_SERVING, saying why) until the sidecar has answered `InitializeTokenizer` for
  `modelName`; it is asked again, after 1, 2, 3, 4, then every 5 seconds, until it does.
- `vllm` (`url`, default http://localhost:8000; llm-d-inference-scheduler's older name `http`;
  `timeout`, 5s): the model server, or llm-d's render sidecar (`vllm launch render`), tokenizes. The
  request-control layer asks its `/v1/chat/completions/render` for a chat, `/v1/completions/render`
  for each prompt of a completion, with the model `modelName` (else the request's), before the
  producers run; a server without them (404) is asked `/tokenize` instead, from then on.
- `estimate` (the default): the prompt's bytes packed four to a token, upstream's estimate. Its ids
  match no engine's, so a precise prefix index finds nothing with them.
- `local` (epick's): the model's own tokenizer files, `local.path` (a directory or a
  `tokenizer.json`), else `modelName` looked up under `local.dirs` and in the local Hugging Face
  cache. Nothing is downloaded.

Tokens the client sent (a completion of token ids, a generate call) are used as they are. Upstream's
rules stand: a producer that cannot tokenize fails, the producers after it are skipped, and the
request is scheduled without tokens; a request already tokenized only gets its cache salt.

Deviations, on purpose: `modelName` with `udsTokenizerConfig` is the sidecar's configuration, as
upstream's docs and llm-d's guides write it (llm-d-router ebab687's factory refuses the pair, taking
`modelName` for the vLLM backend); where the sidecar is not initialized the process still starts,
not ready, where upstream's fails after five tries; where the render endpoints answer 404, epick
falls back to `/tokenize` (older vLLM), where upstream's vLLM backend fails.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import AliasChoices, Field

from epick.framework import (
    CycleState,
    Endpoint,
    InferenceRequest,
    NamedPlugin,
    Reads,
    TokenizeCall,
    TokenizedPrompt,
)
from epick.plugins.duration import Duration
from epick.plugins.registry import Handle, ParameterError, Parameters, PluginSpec
from epick.plugins.tokens import uds
from epick.plugins.tokens.backends import (
    EstimateBackend,
    LocalBackend,
    given_tokens,
    tokenize_payloads,
    tokens_of_answer,
)
from epick.plugins.tokens.uds import UDSParameters
from epick.tokenization import Tokenizer, TokenizerNotFoundError, load

TYPE = "token-producer"
LEGACY_TYPE = "tokenizer"
TOKENIZED_DATA_TYPE = "TokenizedPrompt"  # upstream's data key type (the tokens live on the body)
log = logging.getLogger(__name__)


class VLLMParameters(Parameters):
    url: str = Field(default="http://localhost:8000", validation_alias=AliasChoices("url", "http"))
    timeout: Duration = 5.0
    mm_timeout: Duration = 30.0


class LocalParameters(Parameters):
    path: str = ""
    dirs: list[str] = Field(default_factory=list)


class TokenProducerParameters(Parameters):
    model_name: str = ""
    vllm: VLLMParameters | None = None
    uds_tokenizer_config: UDSParameters | None = None
    estimate: dict[str, Any] | None = None  # multimodal estimates: accepted, text only here
    local: LocalParameters | None = None

    def backend(self) -> str:
        if self.local is not None:
            return "local"
        if self.uds_tokenizer_config is not None and self.uds_tokenizer_config.socket_file:
            return "uds"
        if self.vllm is not None or self.model_name:
            return "vllm"
        return "estimate"


class TokenProducer(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.PROMPT | Reads.BODY | Reads.MODEL

    def __init__(
        self,
        name: str | None = None,
        *,
        backend: str = "estimate",
        tokenizer: Tokenizer | None = None,
        tokenizer_source: str = "",
        search: Sequence[str] = (),
        model_name: str = "",
        url: str = "http://localhost:8000",
        timeout: float = 5.0,
        sidecar_model: str = "",
    ) -> None:
        super().__init__(name)
        self.backend = backend
        self.model_name = model_name
        self.url = url.rstrip("/")  # the vLLM server's; with `uds`, the sidecar's gRPC target
        self.timeout = timeout
        self.sidecar_model = sidecar_model or model_name  # the name the sidecar knows the tokenizer by
        self._initialized = backend != "uds"
        self._not_initialized = "not asked yet"
        self._tokenizer_source = tokenizer_source
        self._search = tuple(search)
        self._local: LocalBackend | None = LocalBackend(tokenizer) if tokenizer is not None else None
        self._estimate = EstimateBackend()
        self._missing: str | None = None  # why the local tokenizer is missing (said once)

    def local_backend(self) -> LocalBackend:
        """The model's tokenizer, loaded on first use (a config loads without its files; a request
        then fails to tokenize, with the places looked at in the log)."""
        if self._local is None:
            try:
                self._local = LocalBackend(load(self._tokenizer_source, self._search))
            except (TokenizerNotFoundError, ValueError) as e:
                if self._missing is None:
                    log.error("%s: %s", self.typed_name, e)
                self._missing = str(e)
                raise
        return self._local

    def tokenize(self, request: InferenceRequest) -> TokenizedPrompt:
        """The request's tokens by this producer's backend (the vLLM backend's come from the call)."""
        given = given_tokens(request)
        if given is not None:
            prompts = given
        elif self.backend == "local":
            prompts = self.local_backend().tokenize(request)
        elif self.backend == "estimate":
            prompts = self._estimate.tokenize(request)
        else:
            raise RuntimeError("tokenization failed: the model server's /tokenize gave no tokens for it")
        return TokenizedPrompt(prompts, request.body.cache_salt)

    def produce(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> None:
        body = request.body
        done = body.tokenized
        if done is not None:
            if not done.cache_salt and body.cache_salt:
                body.set_tokenized(TokenizedPrompt(done.prompts, body.cache_salt))
            return
        tokenized = self.tokenize(request)
        if tokenized.token_count:
            body.set_tokenized(tokenized)

    # RemoteTokenizer: what the request-control layer asks the model server (or the sidecar).
    @property
    def remote(self) -> bool:
        return self.backend in ("vllm", "uds")

    def tokenize_call(self, request: InferenceRequest) -> TokenizeCall | None:
        if not self.remote or request.body.tokenized is not None or given_tokens(request) is not None:
            return None
        if self.backend == "uds":
            if request.body.kind in ("chat", "messages"):
                return uds.chat_call(request, self.sidecar_model, self.url)
            return uds.completion_call(request, self.sidecar_model, self.url)
        model = self.model_name or request.target_model
        payloads = tokenize_payloads(request, model)
        tokenize = TokenizeCall(f"{self.url}/tokenize", payloads, self.timeout)
        render = "chat/completions/render" if "messages" in payloads[0] else "completions/render"
        return TokenizeCall(f"{self.url}/v1/{render}", payloads, self.timeout, fallback=tokenize)

    def tokenized(self, request: InferenceRequest, answers: Sequence[Mapping[str, Any]]) -> None:
        prompts = tuple(tokens_of_answer(a) for a in answers)
        if sum(len(p) for p in prompts):
            request.body.set_tokenized(TokenizedPrompt(prompts, request.body.cache_salt))

    # InitializedTokenizer and ReadinessChecker: the sidecar loads the model's tokenizer first.
    def initialize_call(self) -> TokenizeCall | None:
        return None if self._initialized else uds.initialize_call(self.sidecar_model, self.url)

    def initialized(self, answers: Sequence[Mapping[str, Any]] | None, error: str | None) -> None:
        if error is None:
            self._initialized = True
            log.info(
                "%s: the tokenizer sidecar at %s is ready for %s",
                self.typed_name,
                self.url,
                self.sidecar_model,
            )
        else:
            self._not_initialized = error

    def check_ready(self) -> str | None:
        if self._initialized:
            return None
        return (
            f"the tokenizer sidecar at {self.url} has not initialized {self.sidecar_model!r} "
            f"(last answer: {self._not_initialized})"
        )


def _factory(name: str, params: TokenProducerParameters, handle: Handle) -> TokenProducer:
    backend = params.backend()
    if backend == "uds":
        return uds_producer(name, params.model_name, params.uds_tokenizer_config or UDSParameters())
    if backend != "local":
        v = params.vllm or VLLMParameters()
        return TokenProducer(
            name, backend=backend, model_name=params.model_name, url=v.url, timeout=v.timeout
        )
    local = params.local or LocalParameters()
    source = local.path or params.model_name
    if not source:
        raise ParameterError("local.path", "the local backend needs local.path or modelName")
    return TokenProducer(
        name, backend="local", tokenizer_source=source, search=local.dirs, model_name=params.model_name
    )


def uds_producer(
    name: str, model: str, config: UDSParameters, where: str = "udsTokenizerConfig"
) -> TokenProducer:
    """A producer asking the tokenizer sidecar `config` names for `model`'s tokens."""
    if not model:
        raise ParameterError(
            "modelName", "'modelName' must be specified", "name the model the sidecar tokenizes for"
        )
    try:
        sidecar_model = uds.tokenizer_name(model, config.model_tokenizer_map)
    except KeyError:
        raise ParameterError(
            f"{where}.modelTokenizerMap",
            f"tokenizer for model {model!r} not found",
            "add the model to the map",
        ) from None
    return TokenProducer(
        name,
        backend="uds",
        model_name=model,
        url=uds.target(config.socket_file, config.use_tcp),
        timeout=uds.TEXT_TIMEOUT,
        sidecar_model=sidecar_model,
    )


SPEC = PluginSpec(
    TYPE,
    _factory,
    TokenProducerParameters,
    "the request's token ids, once per request",
    aliases=(LEGACY_TYPE,),  # upstream's deprecated name for it
)
