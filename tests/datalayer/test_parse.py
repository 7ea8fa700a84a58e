"""parse_metrics: the scheduler's view of a model server from its Prometheus page."""

from __future__ import annotations

import asyncio
import math
import re
import time

import aiohttp
import pytest

from epick.framework import Metrics
from epick.plugins.datalayer.engines import ENGINES, MetricSpec, UnknownEngineError, engine_names, engine_type
from epick.plugins.datalayer.prometheus import MetricsParseError, parse_metrics
from epick.sim.engine import RequestOutput
from epick.sim.options import ServerOptions
from epick.sim.server import SimServer
from tests.datalayer.pages import SGLANG_PAGE, TRTLLM_PAGE, VLLM_OLD_PAGE, VLLM_PAGE, vllm_page

VLLM = ENGINES["vllm"]
SGLANG = ENGINES["sglang"]
TRTLLM = ENGINES["trtllm-serve"]


# Good pages, one per engine.


def test_vllm_page() -> None:
    m = parse_metrics(VLLM_PAGE, VLLM, update_time=123.5)
    assert m == Metrics(
        waiting_queue_size=2,
        running_requests_size=3,
        kv_cache_usage_percent=0.4375,
        # The sample with the newest timestamp value (1.7454e9) wins, not the first or the last.
        active_models=frozenset({"sql-lora"}),
        waiting_models=frozenset({"chat-lora", "tool-lora"}),
        max_active_models=4,
        cache_block_size=16,
        cache_num_blocks=27709,
        update_time=123.5,
    )


def test_vllm_lora_newest_sample_wins_wherever_it_is() -> None:
    samples = [
        ('running_lora_adapters="a"', "100"),
        ('running_lora_adapters="b"', "300"),  # newest, in the middle
        ('running_lora_adapters="c"', "200"),
    ]
    page = vllm_page() + "".join(
        f'vllm:lora_requests_info{{max_lora="2",{labels},waiting_lora_adapters=""}} {value}\n'
        for labels, value in samples
    )
    m = parse_metrics(page, VLLM)
    assert m.active_models == frozenset({"b"})
    assert m.waiting_models == frozenset()
    assert m.max_active_models == 2


def test_vllm_without_lora_or_cache_info_has_zero_defaults() -> None:
    m = parse_metrics(vllm_page(waiting=1, running=2, kv=0.5), VLLM)
    assert (m.waiting_queue_size, m.running_requests_size, m.kv_cache_usage_percent) == (1, 2, 0.5)
    assert m.active_models == m.waiting_models == frozenset()
    assert (m.max_active_models, m.cache_block_size, m.cache_num_blocks) == (0, 0, 0)
    assert m.update_time is None


def test_vllm_older_gpu_cache_usage_name() -> None:
    m = parse_metrics(VLLM_OLD_PAGE, VLLM)
    assert (m.waiting_queue_size, m.running_requests_size) == (7, 1)
    assert m.kv_cache_usage_percent == pytest.approx(0.91)


def test_vllm_newer_kv_name_wins_over_older_one() -> None:
    page = vllm_page(kv=0.25) + 'vllm:gpu_cache_usage_perc{model_name="sim-model"} 0.75\n'
    assert parse_metrics(page, VLLM).kv_cache_usage_percent == 0.25


def test_vllm_cache_config_none_values_read_as_zero() -> None:
    page = vllm_page() + 'vllm:cache_config_info{block_size="32",num_gpu_blocks="None"} 1.0\n'
    m = parse_metrics(page, VLLM)
    assert (m.cache_block_size, m.cache_num_blocks) == (32, 0)


def test_counts_are_summed_over_label_sets_and_kv_is_the_maximum() -> None:
    page = (
        'vllm:num_requests_waiting{engine="0",model_name="m"} 2\n'
        'vllm:num_requests_waiting{engine="1",model_name="m"} 3\n'
        'vllm:num_requests_running{engine="0",model_name="m"} 1\n'
        'vllm:num_requests_running{engine="1",model_name="m"} 4\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.2\n'
        'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.7\n'
    )
    m = parse_metrics(page, VLLM)
    assert (m.waiting_queue_size, m.running_requests_size, m.kv_cache_usage_percent) == (5, 5, 0.7)


def test_unlabelled_samples_and_timestamps() -> None:
    page = (
        "vllm:num_requests_waiting 4 1700000000000\n"
        "vllm:num_requests_running 2\n"
        "vllm:kv_cache_usage_perc 1e-1\n"
    )
    m = parse_metrics(page, VLLM)
    assert (m.waiting_queue_size, m.running_requests_size, m.kv_cache_usage_percent) == (4, 2, 0.1)


def test_sglang_page() -> None:
    m = parse_metrics(SGLANG_PAGE, SGLANG)
    assert (m.waiting_queue_size, m.running_requests_size) == (4, 12)
    assert m.kv_cache_usage_percent == pytest.approx(0.62)
    assert m.active_models == frozenset() and m.max_active_models == 0


def test_trtllm_page() -> None:
    m = parse_metrics(TRTLLM_PAGE, TRTLLM)
    assert (m.waiting_queue_size, m.running_requests_size, m.kv_cache_usage_percent) == (0, 5, 0.25)


def test_engine_names_default_to_vllm_and_an_unknown_engine_is_named() -> None:
    assert engine_names(None) is VLLM
    assert engine_names("") is VLLM
    assert engine_names("sglang") is SGLANG
    with pytest.raises(UnknownEngineError, match=r"'no-such-engine'.*known: vllm, sglang, trtllm-serve"):
        engine_names("no-such-engine")


def test_the_engine_label_is_llm_ds_then_gies() -> None:
    assert (
        engine_type({"llm-d.ai/engine-type": "sglang", "inference.networking.k8s.io/engine-type": "vllm"})
        == "sglang"
    )
    assert engine_type({"inference.networking.k8s.io/engine-type": "trtllm-serve"}) == "trtllm-serve"
    assert engine_type({}) == "vllm"


TRITON_TRTLLM_PAGE = """\
# TYPE nv_trt_llm_request_metrics gauge
nv_trt_llm_request_metrics{model="ensemble",request_type="context",version="1"} 1
nv_trt_llm_request_metrics{model="ensemble",request_type="scheduled",version="1"} 5
nv_trt_llm_request_metrics{model="ensemble",request_type="max",version="1"} 512
nv_trt_llm_request_metrics{model="ensemble",request_type="waiting",version="1"} 3
# TYPE nv_trt_llm_kv_cache_block_metrics gauge
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per",model="ensemble",version="1"} 32
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="ensemble",version="1"} 4096
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction",model="ensemble",version="1"} 0.25
"""


def test_triton_tensorrt_llm_metrics_are_selected_by_label() -> None:
    m = parse_metrics(TRITON_TRTLLM_PAGE, ENGINES["triton-tensorrt-llm"])
    # waiting 3 and scheduled 5, not the sum of the family; KV the fraction; blocks from their own samples
    assert (m.waiting_queue_size, m.running_requests_size, m.kv_cache_usage_percent) == (3, 5, 0.25)
    assert (m.cache_block_size, m.cache_num_blocks) == (32, 4096)


def test_classic_triton_has_no_kv_metric_and_reads_as_zero() -> None:
    page = 'nv_inference_pending_request_count{model="a"} 2\nnv_inference_exec_count{model="a"} 7\n'
    m = parse_metrics(page, ENGINES["triton"])
    assert (m.waiting_queue_size, m.running_requests_size, m.kv_cache_usage_percent) == (2, 7, 0.0)


def test_sglang_cache_info_uses_its_page_labels() -> None:
    page = (
        "sglang:num_queue_reqs 0\nsglang:num_running_reqs 0\nsglang:token_usage 0.1\n"
        'sglang:cache_config_info{page_size="64",num_pages="1000"} 1\n'
    )
    m = parse_metrics(page, SGLANG)
    assert (m.cache_block_size, m.cache_num_blocks) == (64, 1000)


def test_a_metric_spec_names_its_matchers_and_refuses_garbage() -> None:
    spec = MetricSpec.parse('fam{a=x, b="y"}')
    assert spec == MetricSpec("fam", (("a", "x"), ("b", "y"))) and str(spec) == "fam{a=x,b=y}"
    with pytest.raises(ValueError, match="not a label=value matcher"):
        MetricSpec.parse("fam{a}")


def test_a_page_of_another_engine_is_missing_metrics() -> None:
    with pytest.raises(MetricsParseError, match="missing metrics: sglang:num_queue_reqs"):
        parse_metrics(VLLM_PAGE, SGLANG)


@pytest.mark.parametrize(
    ("value", "expected"),
    [("0.0", 0.0), ("1.0", 1.0), ("0.999", 0.999), ("45", 0.45), ("100", 1.0), ("250", 1.0)],
)
def test_percent_scaled_kv_usage(value: str, expected: float) -> None:
    page = f"sglang:num_queue_reqs 0\nsglang:num_running_reqs 0\nsglang:token_usage {value}\n"
    assert parse_metrics(page, SGLANG).kv_cache_usage_percent == pytest.approx(expected)


# Labels.


def test_label_values_with_escaped_quotes_commas_and_braces() -> None:
    page = vllm_page() + (
        'vllm:lora_requests_info{model_name="a \\"quoted\\" name, with {braces}, and commas",'
        'max_lora="3",running_lora_adapters="x, y ,z",waiting_lora_adapters="w"} 10\n'
    )
    m = parse_metrics(page, VLLM)
    assert m.active_models == frozenset({"x", "y", "z"})
    assert m.waiting_models == frozenset({"w"})
    assert m.max_active_models == 3


def test_escaped_quote_inside_an_adapter_name_is_unescaped() -> None:
    page = vllm_page() + (
        'vllm:lora_requests_info{max_lora="1",running_lora_adapters="say \\"hi\\"",'
        'waiting_lora_adapters=""} 1\n'
    )
    assert parse_metrics(page, VLLM).active_models == frozenset({'say "hi"'})


def test_escaped_backslash_before_n_is_a_backslash() -> None:
    # The exposition format writes the adapter name `dir\new` as `dir\\new`.
    page = vllm_page() + (
        'vllm:lora_requests_info{max_lora="1",running_lora_adapters="dir\\\\new",'
        'waiting_lora_adapters=""} 1\n'
    )
    assert parse_metrics(page, VLLM).active_models == frozenset({"dir\\new"})


def test_garbage_in_families_not_read_is_ignored() -> None:
    page = vllm_page(waiting=1) + (
        'vllm:prompt_tokens_total{model_name="m" 12\n'  # unterminated, but not a wanted family
        "vllm:generation_tokens_total{} not-a-number\n"
        "some_other_metric\n"
        "<html>\n"
    )
    assert parse_metrics(page, VLLM).waiting_queue_size == 1


# Garbage pages: MetricsParseError saying what is wrong.


@pytest.mark.parametrize(
    ("page", "message"),
    [
        ("", "missing metrics: vllm:num_requests_waiting, vllm:num_requests_running, "
         "vllm:kv_cache_usage_perc or vllm:gpu_cache_usage_perc"),
        ("<html><body>502 Bad Gateway</body></html>\n", "missing metrics: vllm:num_requests_waiting"),
        ('{"detail": "Not Found"}', "missing metrics"),
        (vllm_page().replace("vllm:num_requests_running", "vllm:num_requests_runing"),
         "missing metrics: vllm:num_requests_running$"),
        (vllm_page().replace("kv_cache_usage_perc", "kv_cache_usage"),
         "missing metrics: vllm:kv_cache_usage_perc or vllm:gpu_cache_usage_perc"),
        (vllm_page().replace('{model_name="sim-model"} 0\n', '{model_name="sim-model"} zero\n', 1),
         "line 2: vllm:num_requests_running has value 'zero', not a number"),
        ('vllm:num_requests_waiting{model_name="m"}\n' + vllm_page(),
         "line 1: vllm:num_requests_waiting has no value"),
        ('vllm:num_requests_waiting{model_name="m" 3\n' + vllm_page(),
         "line 1: unterminated label set in 'vllm:num_requests_waiting"),
        (vllm_page(waiting=float("nan")), "vllm:num_requests_waiting is nan, not a count or share"),
        (vllm_page(waiting=-1), "vllm:num_requests_waiting is -1.0, not a count or share"),
        (vllm_page(running=-3), "vllm:num_requests_running is -3.0"),
        (vllm_page(kv=float("nan")), "vllm:kv_cache_usage_perc is nan"),
        (vllm_page(kv=-0.5), "vllm:kv_cache_usage_perc is -0.5"),
        (vllm_page(kv=float("inf")), "vllm:kv_cache_usage_perc is inf"),
        (vllm_page().replace(" 0.0\n", " +Inf\n"), "vllm:kv_cache_usage_perc is inf"),
        (vllm_page() + 'vllm:cache_config_info{block_size="sixteen",num_gpu_blocks="10"} 1\n',
         "vllm:cache_config_info: label block_size='sixteen' is not a number"),
        (vllm_page() + 'vllm:lora_requests_info{max_lora="many",running_lora_adapters=""} 1\n',
         "vllm:lora_requests_info: label max_lora='many' is not a number"),
    ],
)  # fmt: skip
def test_garbage_pages(page: str, message: str) -> None:
    with pytest.raises(MetricsParseError, match=_pattern(message)):
        parse_metrics(page, VLLM)


def _pattern(message: str) -> str:
    if message.endswith("$"):
        return re.escape(message[:-1]) + "$"
    return re.escape(message)


@pytest.mark.parametrize(
    "line", ["vllm:num_requests_waiting", "vllm:num_requests_waiting ", "vllm:num_requests_waiting{}"]
)
def test_a_wanted_sample_without_a_value_is_an_error(line: str) -> None:
    # A malformed line of a family the parser reads is reported, not skipped.
    with pytest.raises(MetricsParseError, match=re.escape("line 3: vllm:num_requests_waiting has no value")):
        parse_metrics("# a page\n\n" + line + "\n" + vllm_page(), VLLM)


def test_parse_error_is_a_value_error() -> None:
    assert issubclass(MetricsParseError, ValueError)


def test_infinite_info_label_is_a_parse_error() -> None:
    page = vllm_page() + 'vllm:cache_config_info{block_size="inf",num_gpu_blocks="10"} 1\n'
    with pytest.raises(MetricsParseError, match="block_size"):
        parse_metrics(page, VLLM)


def test_nan_info_label_is_a_parse_error() -> None:
    page = vllm_page() + 'vllm:cache_config_info{block_size="16",num_gpu_blocks="nan"} 1\n'
    with pytest.raises(MetricsParseError, match="num_gpu_blocks"):
        parse_metrics(page, VLLM)


# A real page, from the simulator.


async def test_parse_a_sim_server_page() -> None:
    options = ServerOptions(
        port=0,
        time_scale=1000.0,
        lora_modules=("sql-lora=/adapters/sql",),
        engine=ServerOptions.engine_config(num_gpu_blocks=1234, block_size=32, max_loras=3),
    )
    server = SimServer(options)
    await server.start()
    try:
        async with aiohttp.ClientSession() as http:
            before = time.time()
            async with http.get(server.url + "/metrics") as r:
                assert r.status == 200
                text = await r.text()
    finally:
        await server.stop()
    m = parse_metrics(text, VLLM, update_time=before)
    assert m == Metrics(
        waiting_queue_size=0,
        running_requests_size=0,
        kv_cache_usage_percent=0.0,
        max_active_models=3,
        cache_block_size=32,
        cache_num_blocks=1234,
        update_time=before,
    )
    assert not math.isnan(m.kv_cache_usage_percent)


async def test_parse_a_busy_sim_server_page() -> None:
    """Requests running and waiting, one on a LoRA adapter: the parsed view matches the engine."""
    options = ServerOptions(
        port=0,
        time_scale=1.0,  # real time: the requests stay in flight while we look
        lora_modules=("sql-lora=/adapters/sql",),
        engine=ServerOptions.engine_config(max_num_seqs=1, max_loras=1),
    )
    server = SimServer(options)
    await server.start()
    async with aiohttp.ClientSession() as http:

        async def generate(model: str) -> None:
            body = {"model": model, "prompt": "hello " * 20, "max_tokens": 4000}
            async with http.post(server.url + "/v1/completions", json=body) as r:
                await r.read()

        tasks = [asyncio.create_task(generate(m)) for m in ("sql-lora", "sim-model", "sim-model")]
        try:
            page = ""
            async with asyncio.timeout(5):
                while True:
                    async with http.get(server.url + "/metrics") as r:
                        page = await r.text()
                    m = parse_metrics(page, VLLM)
                    if m.running_requests_size == 1 and m.waiting_queue_size == 2:
                        break
                    await asyncio.sleep(0.01)
            assert m.kv_cache_usage_percent == pytest.approx(server.engine.kv_usage)
            assert 0.0 < m.kv_cache_usage_percent < 1.0
            assert m.active_models == frozenset(server.engine.running_loras())
            assert m.waiting_models == frozenset(server.engine.waiting_loras())
            assert m.active_models | m.waiting_models == frozenset({"sql-lora"})
            assert m.max_active_models == 1
        finally:
            for pending in list(server._pending.values()):
                pending.queue.put_nowait(RequestOutput(pending.request, [], True))
            await asyncio.gather(*tasks, return_exceptions=True)
            await server.stop()
