"""The model rewrites in force: a file's InferenceModelRewrites and the cluster's, under GIE's precedence."""

from __future__ import annotations

import logging
import random

import yaml

from epick.datalayer.rewrites import ModelRewrites, Rewrite, RewriteError, for_pool, parse_rewrites

log = logging.getLogger(__name__)


class RewriteSources:
    """Holds the rewrites of each source; `current()` is what the director applies."""

    def __init__(self, path: str | None, pool: str | None, seed: int | None) -> None:
        self.path = path
        self.pool = pool
        self.file: list[Rewrite] = self.read()
        self.cluster: list[Rewrite] = []
        self._rng = random.Random(seed)  # one stream of weighted picks across reloads

    def current(self) -> ModelRewrites:
        return ModelRewrites((*self.file, *self.cluster), self._rng)

    def read(self) -> list[Rewrite]:
        """The file's resources for this pool; raises `RewriteError` naming what is wrong."""
        path = self.path
        if path is None:
            return []
        try:
            with open(path, encoding="utf-8") as f:
                documents = list(yaml.safe_load_all(f))
        except (OSError, yaml.YAMLError) as e:
            raise RewriteError(f"{path}: cannot read model rewrites: {e}") from None
        found = parse_rewrites(documents, path)
        kept = for_pool(found, self.pool)
        for skipped in sorted({r.name for r in found} - {r.name for r in kept}):
            log.warning("%s: %s %r names another pool; skipped", path, "InferenceModelRewrite", skipped)
        return kept
