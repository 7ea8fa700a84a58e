"""The scheduler's agreed semantics: iterative pick, order, visibility, snapshot, errors."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from epick.config import load_default_config
from epick.framework import (
    CycleState,
    Endpoint,
    EndpointsFilteredError,
    InferenceRequest,
    NamedPlugin,
    NoEndpointsError,
    Reads,
    ScheduleTrace,
    SchedulingError,
    Snapshot,
    WeightedScorer,
)
from epick.plugins.profile.single import SingleProfileHandler
from tests.builders import (
    FakePlugin,
    ScriptedHandler,
    make_endpoint,
    make_profile,
    make_request,
    make_scheduler,
)


def names(endpoints: Sequence[Endpoint]) -> list[str]:
    return [ep.name for ep in endpoints]


def test_single_profile_filters_scores_and_picks() -> None:
    eps = [make_endpoint("a"), make_endpoint("b"), make_endpoint("c")]
    keep_bc = FakePlugin("keep-bc", keep={"b", "c"})
    s1 = FakePlugin("s1", scores={"b": 0.2, "c": 0.6})
    s2 = FakePlugin("s2", scores={"b": 0.9, "c": 0.1})
    # a is filtered out; b = 2*0.2 + 1.5*0.9 = 1.75; c = 2*0.6 + 1.5*0.1 = 1.35 -> b wins
    profile = make_profile(filters=[keep_bc], scorers=[(s1, 2.0), (s2, 1.5)])
    trace = ScheduleTrace()
    result = make_scheduler(profile).schedule(make_request(), eps, trace=trace)
    assert names(result.targets) == ["b"]
    assert result.primary_profile == "default"
    assert trace.profiles[0].totals == pytest.approx({"b": 1.75, "c": 1.35})
    assert trace.profiles[0].filters[0].kept == ["b", "c"]


def test_profile_without_scorers_is_valid() -> None:
    eps = [make_endpoint("a"), make_endpoint("b")]
    profile = make_profile(filters=[FakePlugin(keep={"b"})])
    assert names(make_scheduler(profile).schedule(make_request(), eps).targets) == ["b"]


def test_scores_are_clamped_to_unit_interval_and_nan_is_zero() -> None:
    eps = [make_endpoint("a"), make_endpoint("b"), make_endpoint("c")]
    wild = FakePlugin("wild", scores={"a": 7.0, "b": -3.0, "c": float("nan")})
    trace = ScheduleTrace()
    make_scheduler(make_profile(scorers=[(wild, 2.0)])).schedule(make_request(), eps, trace=trace)
    assert trace.profiles[0].scorers[0].scores == {"a": 1.0, "b": 0.0, "c": 0.0}
    assert trace.profiles[0].totals == {"a": 2.0, "b": 0.0, "c": 0.0}


def test_iterative_pick_runs_profiles_in_order_and_shows_earlier_results() -> None:
    eps = [make_endpoint("a"), make_endpoint("b")]
    order: list[str] = []

    class Recorder(FakePlugin):
        def filter(
            self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
        ) -> list[Endpoint]:
            order.append(self.name)
            return super().filter(request, cycle_state, endpoints)

    first = make_profile("first", filters=[Recorder("f1", keep={"a"})])
    second = make_profile("second", filters=[Recorder("f2", keep={"b"})])
    third = make_profile("third", filters=[Recorder("f3", keep={"a"})])
    handler = ScriptedHandler(["second", "first", "third"], primary="first")
    result = make_scheduler(first, second, third, handler=handler).schedule(make_request(), eps)
    assert order == ["f2", "f1", "f3"]  # sequential, in the order the handler returned them
    # Each pick call saw every earlier result; the last call (returning nothing) saw all three.
    assert handler.seen_results == [
        {},
        {"second": ["b"]},
        {"second": ["b"], "first": ["a"]},
        {"second": ["b"], "first": ["a"], "third": ["a"]},
    ]
    assert result.primary_profile == "first"
    assert names(result.targets) == ["a"]


def test_all_profiles_see_the_snapshot_taken_at_the_start() -> None:
    live = [make_endpoint("a", queue=1), make_endpoint("b", queue=2)]
    seen: list[list[tuple[str, int]]] = []

    class MutatesLiveList(NamedPlugin):
        plugin_type = "mutator"

        def filter(
            self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
        ) -> list[Endpoint]:
            seen.append([(ep.name, ep.metrics.waiting_queue_size) for ep in endpoints])
            # The data layer moves on during the call: an endpoint appears, another changes.
            live.append(make_endpoint("c"))
            live[0] = live[0].with_metrics(make_endpoint(queue=99).metrics)
            return list(endpoints)

    p1 = make_profile("p1", filters=[MutatesLiveList("m1")])
    p2 = make_profile("p2", filters=[MutatesLiveList("m2")])
    make_scheduler(p1, p2, handler=ScriptedHandler(["p1", "p2"])).schedule(make_request(), live)
    assert seen == [[("a", 1), ("b", 2)], [("a", 1), ("b", 2)]]


def test_filter_emptying_a_profile_is_an_error_naming_profile_and_filter() -> None:
    eps = [make_endpoint("a")]
    profile = make_profile("decode", filters=[FakePlugin("picky", keep=set())])
    with pytest.raises(EndpointsFilteredError) as err:
        make_scheduler(profile).schedule(make_request(), eps)
    assert err.value.profile == "decode"
    assert err.value.plugin == "picky/fake"
    assert "decode" in str(err.value) and "picky/fake" in str(err.value)


def test_failed_profile_is_none_for_the_handler_and_its_error_surfaces() -> None:
    eps = [make_endpoint("a")]
    bad = make_profile("bad", filters=[FakePlugin("nothing", keep=set())])
    good = make_profile("good")
    handler = ScriptedHandler(["bad", "good"], primary="bad")
    with pytest.raises(EndpointsFilteredError, match=r"profile 'bad': filter nothing/fake removed all 1"):
        make_scheduler(bad, good, handler=handler).schedule(make_request(), eps)
    assert handler.seen_results[-1] == {"bad": None, "good": ["a"]}


def test_no_candidates_is_no_endpoints_error() -> None:
    with pytest.raises(NoEndpointsError):
        make_scheduler(make_profile()).schedule(make_request(), [])


def test_filter_adding_an_endpoint_is_rejected() -> None:
    stranger = make_endpoint("stranger")

    class Adds(NamedPlugin):
        plugin_type = "adds"

        def filter(
            self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
        ) -> list[Endpoint]:
            return [*endpoints, stranger]

    with pytest.raises(SchedulingError, match="returned an endpoint it was not given"):
        make_scheduler(make_profile(filters=[Adds()])).schedule(make_request(), [make_endpoint("a")])


def test_scorer_returning_wrong_number_of_scores_is_rejected() -> None:
    class Short(NamedPlugin):
        plugin_type = "short"

        def score(
            self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
        ) -> list[float]:
            return [1.0]

    eps = [make_endpoint("a"), make_endpoint("b")]
    with pytest.raises(SchedulingError, match="returned 1 scores for 2 endpoints"):
        make_scheduler(make_profile(scorers=[(Short(), 1.0)])).schedule(make_request(), eps)


def test_handler_picking_a_profile_twice_or_unknown_is_an_error() -> None:
    class Loops(ScriptedHandler):
        def pick_profiles(self, *args: object, **kwargs: object) -> list[str]:
            return ["default"]

    with pytest.raises(SchedulingError, match="picked profile 'default' twice"):
        make_scheduler(make_profile(), handler=Loops(["default"])).schedule(make_request(), [make_endpoint()])
    with pytest.raises(SchedulingError, match="unknown profile 'nope'"):
        make_scheduler(make_profile(), handler=ScriptedHandler(["nope"])).schedule(
            make_request(), [make_endpoint()]
        )


def test_cycle_state_passes_data_between_plugins_within_one_call_only() -> None:
    seen: list[object] = []

    class Writer(NamedPlugin):
        plugin_type = "writer"

        def filter(
            self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
        ) -> list[Endpoint]:
            seen.append(cycle_state.read("writer/writer", str))
            cycle_state.write("writer/writer", request.request_id)
            return list(endpoints)

    class Reader(NamedPlugin):
        plugin_type = "reader"

        def score(
            self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
        ) -> list[float]:
            seen.append(cycle_state.read("writer/writer", str))
            assert cycle_state.read("writer/writer", int) is None  # typed read
            return [0.0] * len(endpoints)

    scheduler = make_scheduler(make_profile(filters=[Writer()], scorers=[(Reader(), 1.0)]))
    scheduler.schedule(make_request(request_id="r1"), [make_endpoint()])
    scheduler.schedule(make_request(request_id="r2"), [make_endpoint()])
    assert seen == [None, "r1", None, "r2"]


def test_one_plugin_may_be_filter_scorer_and_picker() -> None:
    fake = FakePlugin("all", keep={"a", "b"}, scores={"a": 0.1, "b": 0.9}, choose="a")
    profile = make_profile(filters=[fake], scorers=[(fake, 1.0)], picker=fake)
    result = make_scheduler(profile).schedule(make_request(), [make_endpoint("a"), make_endpoint("b")])
    assert names(result.targets) == ["a"]  # the picker chose a, whatever the scores said
    assert fake.calls == ["filter", "score", "pick"]


def test_weights_must_be_finite_and_non_negative() -> None:
    with pytest.raises(ValueError, match="weight"):
        WeightedScorer(FakePlugin(), -1.0)
    with pytest.raises(ValueError, match="weight"):
        WeightedScorer(FakePlugin(), float("inf"))


def test_single_profile_handler_result_and_trace() -> None:
    trace = ScheduleTrace()
    result = make_scheduler(make_profile(), handler=SingleProfileHandler()).schedule(
        make_request(), [make_endpoint("x")], trace=trace
    )
    assert trace.primary_profile == "default" and trace.targets == ["x"]
    assert list(result.profile_results) == ["default"]


class FixedScores(NamedPlugin):
    """A scorer returning whatever it is told to, counting its calls; `reads` as declared."""

    def __init__(self, name: str, scores: Sequence[float], reads: Reads = Reads.EVERYTHING) -> None:
        super().__init__(name)
        self.scores = scores
        self.reads = reads  # type: ignore[misc]
        self.calls = 0

    def score(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> Sequence[float]:
        self.calls += 1
        return self.scores[: len(endpoints)]


class MutatingPicker(NamedPlugin):
    """Takes the highest total, then scribbles over the totals it was given."""

    def pick(self, request: InferenceRequest, cycle_state: CycleState, scored: Sequence[object]) -> object:
        from epick.framework import ProfileRunResult, split_scored

        endpoints, totals = split_scored(scored)  # type: ignore[arg-type]
        best = max(range(len(totals)), key=totals.__getitem__)
        assert isinstance(totals, list)
        totals[:] = [-1.0] * len(totals)
        return ProfileRunResult((endpoints[best],))


class DropLast(NamedPlugin):
    """A filter that drops the last endpoint when told to."""

    def __init__(self) -> None:
        super().__init__("drop-last")
        self.active = False

    def filter(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> object:
        return list(endpoints[:-1]) if self.active else endpoints


def test_scorers_that_read_only_metrics_run_once_per_snapshot_version() -> None:
    a, b, c = make_endpoint("a"), make_endpoint("b"), make_endpoint("c")
    metrics_only = FixedScores("metrics", [0.9, 0.1, 0.0], reads=Reads.METRICS)
    undeclared = FixedScores("undeclared", [0.0, 0.5, 0.0])
    late = FixedScores("late", [0.0, 0.0, 1.0], reads=Reads.METRICS)  # after a non-cacheable scorer
    drop = DropLast()
    profile = make_profile(
        filters=[drop],
        scorers=[(metrics_only, 1.0), (undeclared, 1.0), (late, 0.1)],
        picker=MutatingPicker("p"),
    )
    scheduler = make_scheduler(profile)
    snapshot = Snapshot((a, b, c), version=1)
    # a = 0.9; b = 0.1 + 0.5 = 0.6; c = 0.1 -> a, three times; the picker's scribbles change nothing
    for _ in range(3):
        assert names(scheduler.schedule(make_request(), snapshot).targets) == ["a"]
    assert (metrics_only.calls, undeclared.calls, late.calls) == (1, 3, 1)
    undeclared.scores = [0.0, 0.9, 0.0]  # what is not cached is asked again: b = 1.0 wins
    assert names(scheduler.schedule(make_request(), snapshot).targets) == ["b"]
    assert (metrics_only.calls, late.calls) == (1, 1)
    metrics_only.scores = [0.0, 0.0, 0.0]  # the same version: the old scores still count
    assert names(scheduler.schedule(make_request(), snapshot).targets) == ["b"]
    # A new version is scored afresh: c = 0.1 now beats a = 0.
    undeclared.scores = [0.0, 0.0, 0.0]
    assert names(scheduler.schedule(make_request(), Snapshot((a, b, c), version=2)).targets) == ["c"]
    assert (metrics_only.calls, late.calls) == (2, 2)
    # Other candidates on the same version (a filter dropped one) are scored afresh too.
    drop.active = True
    metrics_only.scores = [0.0, 0.3, 0.0]
    assert names(scheduler.schedule(make_request(), Snapshot((a, b, c), version=2)).targets) == ["b"]
    assert metrics_only.calls == 3
    # Plain endpoints have no version: nothing is reused.
    for _ in range(2):
        scheduler.schedule(make_request(), [a, b, c])
    assert metrics_only.calls == 5


def test_a_versioned_snapshot_schedules_as_its_endpoints_do() -> None:
    eps = tuple(make_endpoint(n, queue=q, kv=k) for n, q, k in (("a", 3, 0.1), ("b", 0, 0.9), ("c", 1, 0.5)))
    config = load_default_config(seed=4)
    other = load_default_config(seed=4)
    for i in range(20):
        request = make_request(f"prompt {i % 3} " * 20)
        versioned = config.scheduler.schedule(request, Snapshot(eps, version=1 + i // 5))
        plain = other.scheduler.schedule(request, eps)
        assert names(versioned.targets) == names(plain.targets)
        for hook in config.hooks.pre_request:
            hook.pre_request(request, versioned, CycleState())
        for hook in other.hooks.pre_request:
            hook.pre_request(request, plain, CycleState())
