"""Engine profiles: the step costs and KV sizes calibrated in docs/simulator.md, checked by hand, and
`--engine-profile` on `epick sim-server` and `epick simulate`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from epick.cli.main import main
from epick.cli.sim_server import add_parser as add_sim_server
from epick.cli.sim_server import options_from
from epick.sim.engine import Engine, SimRequest
from epick.sim.engine.profiles import DEFAULT_PROFILE, PROFILES, engine_profile
from epick.sim.options import ServerOptions


def decode_tokens_per_s(profile: str, batch: int, context: int) -> float:
    """Output tokens/s of a decode-only step of `batch` sequences of `context` tokens each."""
    cost = engine_profile(profile).cost
    return batch / cost.step_time(0, batch, batch * (context + 1))


@pytest.mark.parametrize(
    ("profile", "tokens"),
    [("llama-3.1-8b-h100", 432_000), ("qwen3-32b-tp2-h100", 307_328), ("llama-3.1-70b-tp4-h100", 461_376)],
)
def test_kv_sizes_are_the_documented_ones(profile: str, tokens: int) -> None:
    assert engine_profile(profile).num_gpu_blocks * 16 == tokens


def test_decode_rates_worked_out_by_hand() -> None:
    # Qwen3-32B TP2, 64 sequences at 1k context: 10.5 + 64 × 0.060 + 64,064 × 0.00005 ms = 17.54 ms.
    assert decode_tokens_per_s("qwen3-32b-tp2-h100", 64, 1000) == pytest.approx(64 / 0.0175432, rel=1e-6)
    # Llama-3.1-70B TP4, one sequence at 1k context: 11 + 0.065 + 0.025 µs × 1,001 ms: about 90 tokens/s.
    assert decode_tokens_per_s("llama-3.1-70b-tp4-h100", 1, 1000) == pytest.approx(1 / 0.011090025, rel=1e-6)
    # The bigger the model, the slower a step at the same load; batching still pays on each.
    for batch in (1, 64, 256):
        rates = [decode_tokens_per_s(p, batch, 1000) for p in PROFILES]
        assert rates[0] > rates[1] and rates[0] > rates[2]
    assert all(decode_tokens_per_s(p, 256, 1000) > 50 * decode_tokens_per_s(p, 1, 1000) for p in PROFILES)


def test_a_long_prompt_prefills_in_chunks_at_the_profiles_rate() -> None:
    config = ServerOptions.engine_config(profile="qwen3-32b-tp2-h100")
    engine = Engine(config)
    engine.add_request(SimRequest("r", list(range(10_000)), max_tokens=1))
    now, first_token = 0.0, None
    while first_token is None:
        result = engine.step(now)
        now = result.end
        if any(o.new_token_ids for o in result.outputs):
            first_token = now
    # Two chunks (8,192 + 1,808 tokens), each with the step overhead: 2 × 10.5 ms + 10,000 × 80 µs, plus
    # the context attended (8,192 + 10,000 tokens × 0.05 µs).
    assert first_token == pytest.approx(0.021 + 0.8 + 18_192 * 0.05e-6, rel=1e-3)


def test_an_unknown_profile_is_an_error_naming_the_known_ones() -> None:
    with pytest.raises(
        ValueError, match=re.escape("unknown engine profile 'gpt-5'; known: llama-3.1-8b-h100, qwen3-32b")
    ):
        ServerOptions.engine_config(profile="gpt-5")


def test_sim_server_takes_a_profile_and_lets_blocks_override_it() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_sim_server(parser.add_subparsers())
    options = options_from(parser.parse_args(["sim-server", "--engine-profile", "llama-3.1-70b-tp4-h100"]))
    assert options.engine.num_gpu_blocks == 28_836 and options.engine.cost.overhead_s == 0.011
    options = options_from(
        parser.parse_args(["sim-server", "--engine-profile", "qwen3-32b-tp2-h100", "--num-gpu-blocks", "500"])
    )
    assert options.engine.num_gpu_blocks == 500 and options.engine.cost.prefill_token_s == 80e-6
    assert options_from(parser.parse_args(["sim-server"])).engine.cost == engine_profile(DEFAULT_PROFILE).cost


def test_simulate_runs_a_profile_and_says_which(tmp_path: Path) -> None:
    out = tmp_path / "runs.json"
    argv = ["simulate", "--servers", "2", "--workload", "shared-prefix", "--param", "groups=2",
            "--param", "prompts-per-group=3", "--param", "output-tokens=4", "--policy", "round-robin",
            "--qps", "2", "--engine-profile", "qwen3-32b-tp2-h100", "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    (run,) = json.loads(out.read_text())["runs"]
    assert (run["engine_profile"], run["num_gpu_blocks"]) == ("qwen3-32b-tp2-h100", 19_208)
