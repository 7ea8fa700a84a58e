"""A pool's InferenceModelRewrites and InferenceObjectives from the cluster (resources.py watches
them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from epick.datalayer import objectives
from epick.datalayer.discovery.kubernetes.reflector import Reflector
from epick.datalayer.discovery.kubernetes.resources import API_GROUPS, PoolResourceWatch
from epick.datalayer.objectives import Objective, ObjectiveError, parse_objective
from epick.datalayer.rewrites import KIND, Rewrite, RewriteError, parse_rewrite

REWRITE_API_VERSIONS = API_GROUPS
REWRITE_PLURAL = "inferencemodelrewrites"

RewritesHandler = Callable[[list[Rewrite]], None]
ObjectivesHandler = Callable[[list[Objective]], None]


def rewrite_watch(
    reflector: Reflector, api_client: Any, namespace: str, pool: str, on_change: RewritesHandler
) -> PoolResourceWatch[Rewrite]:
    return PoolResourceWatch(
        reflector, api_client, namespace, pool,
        kind=KIND, plural=REWRITE_PLURAL, parse=parse_rewrite, error=RewriteError, on_change=on_change,
    )  # fmt: skip


def objective_watch(
    reflector: Reflector, api_client: Any, namespace: str, pool: str, on_change: ObjectivesHandler
) -> PoolResourceWatch[Objective]:
    return PoolResourceWatch(
        reflector, api_client, namespace, pool,
        kind=objectives.KIND, plural=objectives.PLURAL, parse=parse_objective, error=ObjectiveError,
        on_change=on_change,
    )  # fmt: skip
