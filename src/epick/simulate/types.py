"""What workloads produce and what routing policies see, in a fleet simulation."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, runtime_checkable

from epick.simulate import vocab

BASE_MODEL = "sim-model"  # the model of requests without a LoRA adapter; any other name is an adapter


@dataclass(slots=True)
class SimRequestSpec:
    """One request of a workload.

    `text` is what a router sees (the completion prompt) and `tokens` what the engine computes; they
    correspond word for word (`epick.simulate.vocab`), so equal text prefixes are equal token prefixes.
    Open-loop first requests arrive by the fleet's arrival process; a request with `after` waits for
    that request (the previous turn of its session) to finish, then `think_time` seconds.

    Not frozen, only because a frozen dataclass takes three times as long to build (a fleet builds
    millions); nothing changes a spec once made, except `prompt` filling in `text`.
    """

    request_id: str
    text: str | None  # None: built from the tokens when a policy first asks (`prompt`)
    tokens: Sequence[int]  # a tuple, or a compact array('H') of token ids
    output_tokens: int
    model: str = BASE_MODEL
    session: str | None = None
    after: str | None = None
    think_time: float = 0.0
    arrival: float | None = None  # fixed arrival time (trace replay); None: the arrival process decides
    # With `text` left out: the text of the first `known_text_tokens` tokens, when the workload has it
    # already (a shared prefix), so that building the prompt spells only the rest.
    known_text: str = ""
    known_text_tokens: int = 0
    tenant: str = ""  # the fairness id the client sends ("" : none)
    priority: int = 0  # its objective's priority (< 0: sheddable)

    @property
    def prompt(self) -> str:
        """The prompt text; built from the tokens on first use when the workload left it out (many
        policies never read it, and building it is a good part of generating a request)."""
        if self.text is None:
            known = self.known_text_tokens
            rest = vocab.text(self.tokens[known:] if known else self.tokens)
            self.text = f"{self.known_text} {rest}" if known and rest else (self.known_text or rest)
        return self.text


@dataclass(slots=True)
class ServerView:
    """What a routing policy may know of one server when it routes."""

    index: int
    name: str
    in_flight: int  # requests this router sent there that have not finished
    waiting: int  # from the last scrape
    running: int  # from the last scrape
    kv_usage: float  # from the last scrape
    active_models: frozenset[str] = frozenset()  # LoRA adapters running, from the last scrape
    waiting_models: frozenset[str] = frozenset()
    max_models: int = 0
    epoch: int = 0  # which scrape these metrics come from (0: unknown); the same for every server
    role: str | None = None  # "prefill" or "decode" in a disaggregated fleet (label llm-d.ai/role)
    # Exact prefix-cache hit, in tokens, of this request's prompt on this server now (oracle only).
    cached_tokens: Callable[[SimRequestSpec], int] = field(repr=False, default=lambda request: 0)


HELD = -1  # `Policy.route`'s answer when the policy holds the request (flow control) to dispatch later


class Route(NamedTuple):
    """Where a request goes when its prompt is computed on another server (disaggregated prefill):
    `Policy.route`'s answer in place of a server index."""

    server: int
    prefill: int | None


def route_of(answer: int | Route) -> Route:
    """A policy's answer as a `Route` (a plain server index computes its own prompt)."""
    return answer if isinstance(answer, Route) else Route(answer, None)


class RefusedError(Exception):
    """Raised by `Policy.route` when the policy turns the request away, as the service answers 429 or
    503 when no endpoint passes the filters: the fleet counts the request as failed, with this reason."""


class Policy(Protocol):
    """A routing policy: chooses a server for each request, hears when each finishes."""

    name: str
    # Whether `route` reads the scraped fields of a ServerView (waiting, running, kv_usage, models);
    # when it does not, the fleet skips scraping altogether.
    reads_metrics: bool

    def route(self, request: SimRequestSpec, servers: Sequence[ServerView], now: float) -> int | Route:
        """The index of the chosen server, or a `Route` naming its prefill server too; `RefusedError`
        when there is none for this request."""
        ...

    def finished(self, request: SimRequestSpec, server: int, now: float) -> None: ...


@runtime_checkable
class KVEventConsumer(Protocol):
    """A policy that hears the engines' KV-cache events (BlockStored, BlockRemoved, AllBlocksCleared,
    as epick.sim.engine records them), after the fleet's event delay."""

    @property
    def consumes_kv_events(self) -> bool: ...

    def kv_events(
        self, server: int, events: Sequence[object], now: float, adapters: Mapping[int, str]
    ) -> None:
        """`events` of server `server`, delivered at `now`; `adapters` names each LoRA id."""
        ...


@runtime_checkable
class Timed(Protocol):
    """A policy that hears a streamed response as a router does: `first_token` when a request's first
    token leaves its server, and `served` with the tokens it produced just before its `finished`."""

    # Whether `first_token` should be called: tracking first tokens costs an event per request.
    @property
    def hears_first_tokens(self) -> bool: ...

    def first_token(self, request: SimRequestSpec, now: float) -> None: ...

    def served(self, request: SimRequestSpec, output_tokens: int) -> None: ...


@runtime_checkable
class Queueing(Protocol):
    """A policy that may hold requests (`route` answered `HELD`) and dispatch them later."""

    def dispatch(
        self, servers: Sequence[ServerView], now: float
    ) -> list[tuple[SimRequestSpec, int | Route | RefusedError]]:
        """Held requests that leave now: each with its server (or `Route`), or why it was refused."""
        ...

    def wakeup(self, now: float) -> float | None:
        """When `dispatch` should run next while nothing else happens (None: nothing is held)."""
        ...


@runtime_checkable
class MembershipAware(Protocol):
    """A policy told when a server leaves the pool and when it comes back (discovery's view of a
    restart that takes the server down for a while, `Churn.downtime` > 0)."""

    def server_left(self, server: int, now: float) -> None:
        """Server `server` is gone: its requests have failed and its cache is lost."""
        ...

    def server_joined(self, server: int, now: float) -> None:
        """Server `server` is back, its cache empty."""
        ...


@dataclass(frozen=True, slots=True)
class Churn:
    """Servers restarting during a run: every `interval` seconds of virtual time (the first at
    `interval`), the next server in turn (0, 1, 2, …) restarts. Its requests fail and its KV cache
    is lost.

    With `downtime` > 0 the server leaves the pool (discovery removes it; a `MembershipAware` policy
    hears it) and comes back `downtime` seconds later, empty. With `downtime` 0 it restarts in place,
    faster than discovery notices (a crashed engine restarted within one readiness-probe period): it
    stays in the pool, and only a policy that hears KV events learns of it, from the restarted
    engine's first event, as the service's subscriber does when an engine's sequence numbers start
    over.
    """

    interval: float
    downtime: float = 0.0

    def __post_init__(self) -> None:
        if not self.interval > 0:
            raise ValueError(f"the restart interval must be positive, not {self.interval:g}")
        if self.downtime < 0:
            raise ValueError(f"the restart downtime cannot be negative, not {self.downtime:g}")
