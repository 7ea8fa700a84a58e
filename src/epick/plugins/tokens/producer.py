"""`token-producer` (and its deprecated name `tokenizer`): the request's token ids, computed once and
set on the request body for every plugin that reads them (llm-d/llm-d-router,
pkg/epp/framework/plugins/requestcontrol/dataproducer/tokenizer).

Backends, as upstream chooses them: `udsTokenizerConfig`, else `vllm` or `modelName`, else `estimate`.
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

Deviations, on purpose: with `udsTokenizerConfig` (llm-d's tokenizer sidecar) epick tokenizes in
process with the model's files found as `local` finds them (the sidecar runs the same Hugging Face
tokenizer); where the render endpoints answer 404, epick falls back to `/tokenize` (older vLLM),
where upstream's vLLM backend fails.
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
from epick.plugins.tokens.backends import (
    EstimateBackend,
    LocalBackend,
    given_tokens,
    tokenize_payloads,
    tokens_of_answer,
)
from epick.tokenization import Tokenizer, TokenizerNotFoundError, load

TYPE = "token-producer"
LEGACY_TYPE = "tokenizer"
TOKENIZED_DATA_TYPE = "TokenizedPrompt"  # upstream's data key type (the tokens live on the body)
log = logging.getLogger(__name__)


class VLLMParameters(Parameters):
    url: str = Field(default="http://localhost:8000", validation_alias=AliasChoices("url", "http"))
    timeout: Duration = 5.0
    mm_timeout: Duration = 30.0


class UDSParameters(Parameters):
    socket_file: str = ""
    use_tcp: bool = Field(default=False, alias="useTCP")
    model_tokenizer_map: dict[str, str] = Field(default_factory=dict)


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
            return "local"
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
    ) -> None:
        super().__init__(name)
        self.backend = backend
        self.model_name = model_name
        self.url = url.rstrip("/")
        self.timeout = timeout
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

    # RemoteTokenizer: what the request-control layer asks the model server.
    @property
    def remote(self) -> bool:
        return self.backend == "vllm"

    def tokenize_call(self, request: InferenceRequest) -> TokenizeCall | None:
        if self.backend != "vllm" or request.body.tokenized is not None or given_tokens(request) is not None:
            return None
        model = self.model_name or request.target_model
        payloads = tokenize_payloads(request, model)
        tokenize = TokenizeCall(f"{self.url}/tokenize", payloads, self.timeout)
        render = "chat/completions/render" if "messages" in payloads[0] else "completions/render"
        return TokenizeCall(f"{self.url}/v1/{render}", payloads, self.timeout, fallback=tokenize)

    def tokenized(self, request: InferenceRequest, answers: Sequence[Mapping[str, Any]]) -> None:
        prompts = tuple(tokens_of_answer(a) for a in answers)
        if sum(len(p) for p in prompts):
            request.body.set_tokenized(TokenizedPrompt(prompts, request.body.cache_salt))


def _factory(name: str, params: TokenProducerParameters, handle: Handle) -> TokenProducer:
    backend = params.backend()
    if backend != "local":
        v = params.vllm or VLLMParameters()
        return TokenProducer(
            name, backend=backend, model_name=params.model_name, url=v.url, timeout=v.timeout
        )
    local = params.local or LocalParameters()
    uds = params.uds_tokenizer_config
    source = local.path or params.model_name
    if uds is not None and not local.path:
        source = uds.model_tokenizer_map.get(params.model_name, source)
        log.warning(
            "%s: udsTokenizerConfig: epick tokenizes in process with the tokenizer files of %r "
            "(the sidecar at %s is not used)", name, source, uds.socket_file,
        )  # fmt: skip
    if not source:
        raise ParameterError("local.path", "the local backend needs local.path or modelName")
    return TokenProducer(
        name, backend="local", tokenizer_source=source, search=local.dirs, model_name=params.model_name
    )


SPEC = PluginSpec(
    TYPE,
    _factory,
    TokenProducerParameters,
    "the request's token ids, once per request",
    aliases=(LEGACY_TYPE,),  # upstream's deprecated name for it
)
