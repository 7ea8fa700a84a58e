"""`no-hit-lru-scorer`: cold requests go to the endpoints least recently given a cold request."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from epick.config import load_config_text
from epick.framework import CycleState, ProfileRunResult, SchedulingResult
from epick.plugins.prefix.scorer import PrefixMatch
from epick.plugins.scorers.no_hit_lru import NoHitLruParameters, NoHitLruScorer
from tests.builders import make_endpoint, make_request, schedule_and_record

A, B, C, D = (make_endpoint(n) for n in "abcd")


def cold_cycle(matched: dict[str, int] | None = None) -> CycleState:
    cycle_state = CycleState()
    cycle_state.write("prefix-cache-scorer/prefix-cache-scorer", PrefixMatch(4, 64, matched or {}))
    return cycle_state


def send(scorer: NoHitLruScorer, request_id: str, target: str, cycle_state: CycleState) -> list[float]:
    """Score a request over a, b, c, d, then record that it went to `target`."""
    request = make_request("x", request_id=request_id)
    scores = scorer.score(request, cycle_state, [A, B, C, D])
    result = SchedulingResult({"default": ProfileRunResult((make_endpoint(target),))}, "default")
    scorer.pre_request(request, result, cycle_state)
    return scores


def test_cold_requests_rank_never_used_first_then_least_recent() -> None:
    scorer = NoHitLruScorer()
    # Nobody used yet: candidate order, 1 - rank / 3.
    assert send(scorer, "r1", "c", cold_cycle()) == pytest.approx([1.0, 2 / 3, 1 / 3, 0.0])
    # c used: never used a, b, d rank 0, 1, 2; c ranks 3 + 0.
    assert send(scorer, "r2", "a", cold_cycle()) == pytest.approx([1.0, 2 / 3, 0.0, 1 / 3])
    # c then a used: b, d rank 0, 1; c (oldest) 2; a 3.
    assert send(scorer, "r3", "b", cold_cycle()) == pytest.approx([0.0, 1.0, 1 / 3, 2 / 3])


def test_warm_requests_score_neutral_and_leave_the_order_alone() -> None:
    scorer = NoHitLruScorer()
    assert send(scorer, "r1", "a", cold_cycle({"a": 2})) == [0.5] * 4
    # a was not recorded: a cold request still sees everyone as never used.
    assert send(scorer, "r2", "a", cold_cycle()) == pytest.approx([1.0, 2 / 3, 1 / 3, 0.0])


def test_no_prefix_state_counts_as_cold_and_one_endpoint_scores_one() -> None:
    scorer = NoHitLruScorer()
    assert scorer.score(make_request("x"), CycleState(), [A]) == [1.0]
    assert scorer.score(make_request("x"), CycleState(), [A, B]) == [1.0, 0.0]


def test_prefill_target_is_recorded_too_and_lru_size_bounds_the_order() -> None:
    scorer = NoHitLruScorer(lru_size=2)
    request = make_request("x", request_id="r1")
    cycle = cold_cycle()
    scorer.score(request, cycle, [A, B, C, D])
    result = SchedulingResult({"decode": ProfileRunResult((A,)), "prefill": ProfileRunResult((B,))}, "decode")
    scorer.pre_request(request, result, cycle)
    assert list(scorer._lru) == ["a", "b"]
    send(scorer, "r2", "c", cold_cycle())
    assert list(scorer._lru) == ["b", "c"]  # a, the oldest, dropped


def test_with_the_real_prefix_scorer_in_a_config() -> None:
    config = load_config_text(
        """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefix-cache-scorer
- type: no-hit-lru-scorer
  parameters:
    lruSize: 16
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
    weight: 2
  - pluginRef: no-hit-lru-scorer
  - pluginRef: max-score-picker
""",
        seed=1,
    )
    pool = [A, B, C]
    chosen = []
    for i, prompt in enumerate(["first prompt", "second prompt", "third prompt", "first prompt"]):
        request = make_request(prompt, request_id=f"r{i}")
        result = schedule_and_record(config, request, pool)
        chosen.append(result.targets[0].name)
    # Three cold prompts spread over the three endpoints; the repeat goes where its prefix is.
    assert chosen[:3] == ["a", "b", "c"]
    assert chosen[3] == "a"


def test_parameters() -> None:
    params = NoHitLruParameters.model_validate(
        {"prefixPluginName": "pfx", "prefillProfile": "pre", "lruSize": 8}
    )
    assert (params.prefix_plugin_name, params.prefill_profile, params.lru_size) == ("pfx", "pre", 8)
    with pytest.raises(ValidationError):
        NoHitLruParameters.model_validate({"lruSize": 0})
    with pytest.raises(ValidationError):
        NoHitLruParameters.model_validate({"prefixPluginName": ""})
