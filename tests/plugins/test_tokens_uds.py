"""`udsTokenizerConfig`: token ids from llm-d's tokenizer sidecar over a Unix socket (here epick's
stand-in, `epick.sim.uds_tokenizer`, speaking the same gRPC service), readiness until it has
initialized, and the older sidecar without the render calls."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from epick.config import load_config_text
from epick.framework import ReadinessChecker
from epick.plugins.registry import ParameterError
from epick.plugins.tokens.producer import SPEC, TokenProducer, TokenProducerParameters
from epick.requestcontrol import tokenize as tokenize_module
from epick.requestcontrol.tokenize import RemoteTokenization
from epick.sim.tokenizing import load as load_sim_tokenizer
from epick.sim.uds_tokenizer import TokenizerSidecar
from epick.tokenization.uds_messages import RENDER_COMPLETION, TOKENIZE
from tests.builders import make_request
from tests.datalayer.pages import wait_until

DATA = Path(__file__).resolve().parents[1] / "data" / "tokenizer"
MODEL = "Qwen/Qwen3-0.6B"
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is a KV cache?"}]


def producer(socket: Path, **config: Any) -> TokenProducer:
    params = TokenProducerParameters.model_validate(
        {"modelName": MODEL, "udsTokenizerConfig": {"socketFile": str(socket), **config}}
    )
    plugin = SPEC.factory("token-producer", params, None)  # type: ignore[arg-type]
    assert isinstance(plugin, TokenProducer)
    return plugin


@pytest.fixture
def socket_path(tmp_path: Path) -> Path:
    return tmp_path / "tokenizer" / "tokenizer-uds.socket"


@pytest.fixture
async def sidecars() -> AsyncIterator[Callable[..., Any]]:
    started: list[TokenizerSidecar] = []

    async def start(path: Path, **kw: Any) -> TokenizerSidecar:
        sidecar = TokenizerSidecar(load_sim_tokenizer(str(DATA)), str(path), **kw)
        await sidecar.start()
        started.append(sidecar)
        return sidecar

    yield start
    for sidecar in started:
        await sidecar.stop()


async def test_chats_and_completions_get_the_sidecars_ids(socket_path: Path, sidecars: Any) -> None:
    sidecar = await sidecars(socket_path)
    plugin = producer(socket_path)
    remote = RemoteTokenization()
    try:
        assert isinstance(plugin, ReadinessChecker) and plugin.check_ready() is not None
        await remote.prepare([plugin])
        assert sidecar.initialized == [MODEL] and plugin.check_ready() is None
        tok = load_sim_tokenizer(str(DATA))
        chat = make_request(messages=CHAT)
        await remote.tokenize(chat, [plugin])
        assert chat.body.tokenized is not None
        assert chat.body.tokenized.prompts == (tuple(tok.encode_chat(CHAT)),)
        completion = make_request(prompt=["first prompt", "second"])  # type: ignore[arg-type]
        await remote.tokenize(completion, [plugin])
        assert completion.body.tokenized is not None
        assert completion.body.tokenized.prompts == (
            tuple(tok.encode("first prompt")),
            tuple(tok.encode("second")),
        )
        assert remote.failures == 0
    finally:
        await remote.close()


async def test_not_ready_until_the_sidecar_answers_then_ready(
    socket_path: Path, sidecars: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tokenize_module, "RETRY_AFTER", (0.01,))
    plugin = producer(socket_path)
    remote = RemoteTokenization()
    task = asyncio.create_task(remote.prepare([plugin]))
    try:
        await wait_until(lambda: "UNAVAILABLE" in (plugin.check_ready() or ""))
        reason = plugin.check_ready() or ""
        assert f"unix://{socket_path}" in reason and repr(MODEL) in reason
        # a request meanwhile is scheduled without tokens, the failure counted
        request = make_request("hello")
        await remote.tokenize(request, [plugin])
        assert request.body.tokenized is None and remote.failures == 1
        sidecar = await sidecars(socket_path)
        await asyncio.wait_for(task, 10)
        assert plugin.check_ready() is None and sidecar.initialized == [MODEL]
    finally:
        task.cancel()
        await remote.close()


async def test_an_older_sidecar_without_render_is_asked_tokenize(socket_path: Path, sidecars: Any) -> None:
    sidecar = await sidecars(socket_path, without=(RENDER_COMPLETION,))
    plugin = producer(socket_path)
    remote = RemoteTokenization()
    try:
        for text in ("one prompt", "another prompt"):
            request = make_request(text)
            await remote.tokenize(request, [plugin])
            assert request.body.tokenized is not None
            assert request.body.tokenized.prompts == (tuple(load_sim_tokenizer(str(DATA)).encode(text)),)
        assert sidecar.calls.get(RENDER_COMPLETION, 0) == 0  # UNIMPLEMENTED is answered before the handler
        assert sidecar.calls[TOKENIZE] == 2
        assert remote.failures == 0
    finally:
        await remote.close()


async def test_a_sidecar_without_the_model_refuses_and_the_request_goes_without_tokens(
    socket_path: Path, sidecars: Any, caplog: pytest.LogCaptureFixture
) -> None:
    await sidecars(socket_path, models=("another/model",))
    plugin = producer(socket_path)
    remote = RemoteTokenization()
    try:
        call = plugin.initialize_call()
        assert call is not None
        async with asyncio.timeout(5):
            with pytest.raises(
                ValueError, match=r"Failed to initialize renderer for model: Qwen/Qwen3-0\.6B"
            ):
                await remote._ask(call)
        request = make_request(messages=[{"role": "user", "content": "x"}])
        await remote.tokenize(request, [plugin])
        assert request.body.tokenized is None and remote.failures == 1
        assert "gRPC INTERNAL" in caplog.text and "no tokenizer for model" in caplog.text
    finally:
        await remote.close()


def test_the_sidecars_config_is_checked_as_upstream_checks_it(socket_path: Path) -> None:
    with pytest.raises(ParameterError, match="'modelName' must be specified"):
        SPEC.factory(
            "t",
            TokenProducerParameters.model_validate({"udsTokenizerConfig": {"socketFile": "/tmp/s"}}),
            None,  # type: ignore[arg-type]
        )
    with pytest.raises(ParameterError, match=r"tokenizer for model 'Qwen/Qwen3-0\.6B' not found"):
        producer(socket_path, modelTokenizerMap={"other": "x"})
    mapped = producer(socket_path, modelTokenizerMap={MODEL: "/models/qwen/tokenizer.json"})
    assert mapped.sidecar_model == "/models/qwen"


def test_the_deprecated_scorers_pool_config_uses_the_sidecar(socket_path: Path) -> None:
    config = load_config_text(
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n"
        "- type: precise-prefix-cache-scorer\n  parameters:\n    indexerConfig:\n"
        f"      tokenizersPoolConfig: {{modelName: {MODEL}, uds: {{socketFile: {socket_path}}}}}\n"
        "- type: queue-scorer\n"
    )
    scorer = config.plugins["precise-prefix-cache-scorer"]
    assert scorer in config.hooks.remote_tokenizers
    assert isinstance(scorer, ReadinessChecker) and "has not initialized" in (scorer.check_ready() or "")
    call = scorer.tokenize_call(make_request("x"))  # type: ignore[attr-defined]
    assert call is not None and call.url == f"unix://{socket_path}" and call.method == RENDER_COMPLETION
