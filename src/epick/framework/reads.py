"""What a plugin's result depends on: a declaration the runtime and the simulator act on.

A plugin class says what it reads with `reads = Reads.METRICS | ...` (see `NamedPlugin`); one that
says nothing is taken to read everything. The runtime computes a scorer that reads nothing but the
candidates' metrics once per snapshot version and reuses its scores for every request on that
snapshot (`SchedulerProfile`); the fleet simulator builds a request's text only when some plugin reads
the prompt or its tokens, and refreshes metrics only when some plugin reads them. A wrong declaration
gives wrong results, so declare what the code reads, no less.

The candidates themselves (their names, addresses and labels) are always available and need no
declaration: a change to one makes a new snapshot version.
"""

from __future__ import annotations

from enum import Flag, auto
from typing import cast


class Reads(Flag):
    NOTHING = 0
    METRICS = auto()  # the candidates' scraped metrics (queues, KV-cache use, adapters)
    MODEL = auto()  # the model the request names, and its target model
    PROMPT = auto()  # the prompt's text or chat messages
    PROMPT_SIZE = auto()  # the prompt's length alone (RequestBody.prefix_bytes and the like)
    TOKENS = auto()  # the prompt's token ids
    HEADERS = auto()  # the request's headers
    BODY = auto()  # other fields of the request body (stream, max tokens, cache salt, ...)
    # What the plugin learned from earlier requests and responses, or its own running state (a
    # counter, a random draw): its result can change with nothing else changing.
    HISTORY = auto()
    EVERYTHING = METRICS | MODEL | PROMPT | PROMPT_SIZE | TOKENS | HEADERS | BODY | HISTORY


def reads_of(plugin: object) -> Reads:
    """The plugin's declaration; `Reads.EVERYTHING` when it makes none."""
    return cast(Reads, getattr(plugin, "reads", Reads.EVERYTHING))


def depends_on_metrics_alone(plugin: object) -> bool:
    """True when the plugin's result is a function of the candidates and their metrics, nothing else."""
    return reads_of(plugin) in Reads.METRICS
