"""Pickers: max-score (top k, random tie-break), random, weighted-random (A-Res)."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence

import pytest
from pydantic import ValidationError

from epick.framework import CycleState, Endpoint, ScoredEndpoint
from epick.plugins.pickers.max_score import MaxScorePicker
from epick.plugins.pickers.params import PickerParameters
from epick.plugins.pickers.random_picker import RandomPicker
from epick.plugins.pickers.round_robin import RoundRobinPicker
from epick.plugins.pickers.weighted_random import WeightedRandomPicker
from tests.builders import make_endpoint, make_request

Picker = MaxScorePicker | RandomPicker | WeightedRandomPicker


def scored(**totals: float) -> list[ScoredEndpoint]:
    """One ScoredEndpoint per keyword, in keyword order: scored(a=0.1, b=0.9)."""
    return [ScoredEndpoint(make_endpoint(name), total) for name, total in totals.items()]


def names(endpoints: Sequence[Endpoint]) -> list[str]:
    return [ep.name for ep in endpoints]


def pick_names(picker: Picker, candidates: list[ScoredEndpoint]) -> list[str]:
    return names(picker.pick(make_request(), CycleState(), candidates).targets)


def frequencies(picker: Picker, candidates: list[ScoredEndpoint], draws: int) -> dict[str, float]:
    """Share of `draws` single picks that chose each endpoint."""
    counts = Counter(pick_names(picker, candidates)[0] for _ in range(draws))
    return {s.endpoint.name: counts[s.endpoint.name] / draws for s in candidates}


# --- max-score-picker -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("totals", "k", "expected"),
    [
        # the single highest total wins
        ({"a": 0.1, "b": 0.9, "c": 0.5}, 1, ["b"]),
        # top 2 by total, highest first: b 0.9 > c 0.5
        ({"a": 0.1, "b": 0.9, "c": 0.5}, 2, ["b", "c"]),
        # k = 3 = every candidate, sorted: b 0.9 > c 0.5 > a 0.1
        ({"a": 0.1, "b": 0.9, "c": 0.5}, 3, ["b", "c", "a"]),
        # k larger than the candidates: all of them, no padding
        ({"a": 0.1, "b": 0.9, "c": 0.5}, 10, ["b", "c", "a"]),
        # a weighted total above 1 is fine: 2*0.7 + 3*0.2 = 2.0 beats 1.9
        ({"a": 2.0, "b": 1.9}, 1, ["a"]),
        # one candidate
        ({"only": 0.0}, 1, ["only"]),
        ({"only": 0.0}, 4, ["only"]),
    ],
)
def test_max_score_takes_the_top_k(totals: dict[str, float], k: int, expected: list[str]) -> None:
    picker = MaxScorePicker(max_num_of_endpoints=k, rng=random.Random(0))
    assert pick_names(picker, scored(**totals)) == expected


def test_max_score_breaks_ties_among_the_best_only() -> None:
    picker = MaxScorePicker(rng=random.Random(0))
    candidates = scored(a=0.7, b=0.7, c=0.7, d=0.69)
    # 3000 picks among 3 tied endpoints: each about 1000 (binomial sd ~26), d never.
    freq = frequencies(picker, candidates, 3000)
    assert freq["d"] == 0.0
    for name in "abc":
        assert freq[name] == pytest.approx(1 / 3, abs=0.05)


def test_max_score_tie_break_is_deterministic_for_a_seed() -> None:
    candidates = scored(a=0.5, b=0.5, c=0.5, d=0.5)
    runs = []
    for _ in range(2):
        picker = MaxScorePicker(rng=random.Random(42))
        runs.append([pick_names(picker, candidates)[0] for _ in range(50)])
    assert runs[0] == runs[1]
    # the sequence really is random: more than one endpoint appears
    assert len(set(runs[0])) > 1


def test_max_score_top_k_orders_ties_randomly_after_the_leader() -> None:
    candidates = scored(a=0.2, b=0.2, c=0.2, lead=0.9)
    picker = MaxScorePicker(max_num_of_endpoints=2, rng=random.Random(7))
    firsts, seconds = Counter[str](), Counter[str]()
    for _ in range(600):
        first, second = pick_names(picker, candidates)
        firsts[first] += 1
        seconds[second] += 1
    # the leader is always primary; the fallback is one of the three tied, each about 200 of 600
    assert firsts == {"lead": 600}
    assert set(seconds) == {"a", "b", "c"}
    assert all(150 <= n <= 250 for n in seconds.values())


def test_max_score_top_k_is_deterministic_for_a_seed() -> None:
    candidates = scored(a=0.3, b=0.3, c=0.3, d=0.3, e=0.1)
    runs = []
    for _ in range(2):
        picker = MaxScorePicker(max_num_of_endpoints=3, rng=random.Random(5))
        runs.append([tuple(pick_names(picker, candidates)) for _ in range(20)])
    assert runs[0] == runs[1]
    # 3 of the 4 tied at 0.3, never e (0.1); the tied order varies between picks
    assert all(len(r) == 3 and "e" not in r for r in runs[0])
    assert len(set(runs[0])) > 1


def test_under_workers_max_score_breaks_ties_by_the_prompt_alike_in_every_copy() -> None:
    """Two workers' copies (their own random draws, candidates in another order) break the same tie
    the same way for one prompt, and send a request of another prompt wherever its hash says."""
    copies = [MaxScorePicker(rng=random.Random(seed), workers=2) for seed in (1, 2)]
    tied = scored(a=0.5, b=0.9, c=0.9, d=0.9)
    for i in range(50):
        request = make_request(f"system prompt {i} " * 20)
        first = copies[0].pick(request, CycleState(), tied).targets
        second = copies[1].pick(request, CycleState(), list(reversed(tied))).targets
        assert names(first) == names(second) and names(first)[0] in {"b", "c", "d"}
        follow_up = make_request(f"system prompt {i} " * 20 + "and a question")  # same start
        assert names(copies[1].pick(follow_up, CycleState(), tied).targets) == names(first)


def test_under_workers_prompts_spread_evenly_over_tied_endpoints() -> None:
    picker = MaxScorePicker(rng=random.Random(0), workers=4)
    tied = scored(a=1.0, b=1.0, c=1.0, d=1.0)
    counts = Counter(
        names(picker.pick(make_request(f"prompt number {i}"), CycleState(), tied).targets)[0]
        for i in range(2_000)
    )
    assert set(counts) == {"a", "b", "c", "d"}
    assert all(400 <= n <= 600 for n in counts.values()), counts


def test_under_workers_top_k_orders_ties_by_the_prompt() -> None:
    copies = [MaxScorePicker(max_num_of_endpoints=3, rng=random.Random(seed), workers=2) for seed in (1, 2)]
    request = make_request("a shared system prompt")
    tied = scored(a=0.9, b=0.5, c=0.5, d=0.5)
    first = names(copies[0].pick(request, CycleState(), tied).targets)
    second = names(copies[1].pick(request, CycleState(), list(reversed(tied))).targets)
    assert first == second and first[0] == "a" and len(first) == 3


def test_one_worker_keeps_the_random_tie_break() -> None:
    picker = MaxScorePicker(rng=random.Random(3), workers=1)
    request = make_request("the same prompt every time")
    tied = scored(a=1.0, b=1.0, c=1.0)
    assert {names(picker.pick(request, CycleState(), tied).targets)[0] for _ in range(200)} == {"a", "b", "c"}


def test_max_score_with_nothing_to_pick_returns_no_target() -> None:
    assert MaxScorePicker(rng=random.Random(0)).pick(make_request(), CycleState(), []).targets == ()


# --- random-picker ----------------------------------------------------------------------------


def test_random_picker_ignores_scores_and_covers_every_candidate() -> None:
    picker = RandomPicker(rng=random.Random(1))
    candidates = scored(a=0.0, b=1.0, c=5.0)
    # uniform: each about 1/3 of 3000 whatever its total
    freq = frequencies(picker, candidates, 3000)
    for name in "abc":
        assert freq[name] == pytest.approx(1 / 3, abs=0.05)


@pytest.mark.parametrize(
    ("k", "expected_len"),
    [
        (1, 1),
        (2, 2),
        (3, 3),
        # k larger than the 3 candidates: all 3, each once
        (7, 3),
    ],
)
def test_random_picker_returns_k_distinct_candidates(k: int, expected_len: int) -> None:
    candidates = scored(a=0.1, b=0.2, c=0.3)
    picker = RandomPicker(max_num_of_endpoints=k, rng=random.Random(3))
    for _ in range(20):
        chosen = pick_names(picker, candidates)
        assert len(chosen) == expected_len
        assert len(set(chosen)) == expected_len
        assert set(chosen) <= {"a", "b", "c"}


def test_random_picker_is_deterministic_for_a_seed() -> None:
    candidates = scored(a=0.1, b=0.2, c=0.3, d=0.4)
    runs = [
        [pick_names(p, candidates) for _ in range(30)]
        for p in (
            RandomPicker(max_num_of_endpoints=2, rng=random.Random(9)),
            RandomPicker(max_num_of_endpoints=2, rng=random.Random(9)),
        )
    ]
    assert runs[0] == runs[1]
    assert len({tuple(r) for r in runs[0]}) > 1


# --- weighted-random-picker -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("totals", "expected"),
    [
        # P(i) = total_i / sum: 1/6, 2/6, 3/6
        ({"a": 1.0, "b": 2.0, "c": 3.0}, {"a": 1 / 6, "b": 2 / 6, "c": 3 / 6}),
        # 0.5 / (0.5 + 1.5) = 0.25; 1.5 / 2 = 0.75
        ({"a": 0.5, "b": 1.5}, {"a": 0.25, "b": 0.75}),
        # equal totals: uniform
        ({"a": 0.4, "b": 0.4, "c": 0.4, "d": 0.4}, {"a": 0.25, "b": 0.25, "c": 0.25, "d": 0.25}),
        # a zero total is never primary while a positive one exists: 0, 1/4, 3/4
        ({"z": 0.0, "a": 1.0, "b": 3.0}, {"z": 0.0, "a": 0.25, "b": 0.75}),
    ],
)
def test_weighted_random_frequencies_follow_the_totals(
    totals: dict[str, float], expected: dict[str, float]
) -> None:
    picker = WeightedRandomPicker(rng=random.Random(2024))
    # 6000 draws: binomial sd <= sqrt(0.25/6000) ~ 0.0065; tolerance 0.03 is about 4.6 sd
    assert frequencies(picker, scored(**totals), 6000) == pytest.approx(expected, abs=0.03)


def test_weighted_random_puts_zero_totals_last() -> None:
    picker = WeightedRandomPicker(max_num_of_endpoints=4, rng=random.Random(11))
    candidates = scored(z1=0.0, a=0.01, z2=0.0, b=5.0)
    for _ in range(200):
        chosen = pick_names(picker, candidates)
        assert set(chosen[:2]) == {"a", "b"}
        assert set(chosen[2:]) == {"z1", "z2"}


def test_weighted_random_all_zero_falls_back_to_uniform() -> None:
    picker = WeightedRandomPicker(rng=random.Random(5))
    freq = frequencies(picker, scored(a=0.0, b=0.0, c=0.0), 3000)
    for name in "abc":
        assert freq[name] == pytest.approx(1 / 3, abs=0.05)


@pytest.mark.parametrize(
    ("k", "expected_len"),
    [
        (1, 1),
        (2, 2),
        # k above the 3 candidates: all 3
        (5, 3),
    ],
)
def test_weighted_random_returns_k_distinct_candidates(k: int, expected_len: int) -> None:
    picker = WeightedRandomPicker(max_num_of_endpoints=k, rng=random.Random(8))
    for _ in range(20):
        chosen = pick_names(picker, scored(a=0.2, b=0.0, c=1.3))
        assert len(chosen) == expected_len
        assert len(set(chosen)) == expected_len


def test_weighted_random_second_choice_is_weighted_without_replacement() -> None:
    # A-Res without replacement, k=2 over a=1, b=1, c=2. P(c first) = 1/2; given a first, P(c second) = 2/3.
    # P(c among the two) = 1/2 + 2 * (1/4 * 2/3) = 5/6.
    picker = WeightedRandomPicker(max_num_of_endpoints=2, rng=random.Random(13))
    candidates = scored(a=1.0, b=1.0, c=2.0)
    draws = 6000
    with_c = sum("c" in pick_names(picker, candidates) for _ in range(draws))
    assert with_c / draws == pytest.approx(5 / 6, abs=0.03)


def test_weighted_random_is_deterministic_for_a_seed() -> None:
    candidates = scored(a=0.3, b=0.6, c=0.9)
    runs = []
    for _ in range(2):
        picker = WeightedRandomPicker(rng=random.Random(77))
        runs.append([pick_names(picker, candidates)[0] for _ in range(40)])
    assert runs[0] == runs[1]
    assert len(set(runs[0])) > 1


# --- parameters -------------------------------------------------------------------------------


def test_picker_parameters_default_to_one_endpoint() -> None:
    assert PickerParameters().max_num_of_endpoints == 1
    assert PickerParameters.model_validate({"maxNumOfEndpoints": 3}).max_num_of_endpoints == 3


@pytest.mark.parametrize("bad", [0, -1])
def test_picker_parameters_need_at_least_one_endpoint(bad: int) -> None:
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        PickerParameters.model_validate({"maxNumOfEndpoints": bad})


def test_round_robin_cycles_candidates_by_name_ignoring_scores() -> None:
    picker = RoundRobinPicker(max_num_of_endpoints=1)
    eps = [make_endpoint(n) for n in ("c", "a", "b")]
    scored = [ScoredEndpoint(ep, score) for ep, score in zip(eps, (9.0, 0.0, 1.0), strict=True)]
    picks = [picker.pick(make_request(), CycleState(), scored).targets[0].name for _ in range(6)]
    assert picks == ["a", "b", "c", "a", "b", "c"]  # by name, in turn, scores ignored


def test_round_robin_takes_k_consecutive() -> None:
    picker = RoundRobinPicker(max_num_of_endpoints=2)
    scored = [ScoredEndpoint(make_endpoint(n), 0.0) for n in ("a", "b", "c")]
    first = picker.pick(make_request(), CycleState(), scored).targets
    second = picker.pick(make_request(), CycleState(), scored).targets
    assert [ep.name for ep in first] == ["a", "b"] and [ep.name for ep in second] == ["b", "c"]


def test_the_config_tells_max_score_how_many_workers_pick_alike() -> None:
    """The worker count reaches the picker from its factory's handle (`LoadOptions.workers`)."""
    from epick.config import LoadOptions, load_default_config

    tied = scored(a=1.0, b=1.0, c=1.0)
    request = make_request("one prompt, picked again and again")
    for workers, distinct in ((1, 3), (2, 1)):
        config = load_default_config(seed=5, options=LoadOptions(workers=workers))
        picker = config.plugins["max-score-picker"]
        assert isinstance(picker, MaxScorePicker)
        picked = {names(picker.pick(request, CycleState(), tied).targets)[0] for _ in range(200)}
        assert len(picked) == distinct
