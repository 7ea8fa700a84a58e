"""Config errors: every problem found, each with where it is and how to fix it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ConfigIssue:
    path: str  # inside the document, e.g. "schedulingProfiles[1].plugins[0].pluginRef"; "" for the whole file
    message: str
    fix: str = ""

    def render(self, source: str) -> str:
        where = f"{source}: {self.path}" if self.path else source
        text = f"{where}: {self.message}"
        return f"{text} (fix: {self.fix})" if self.fix else text


class ConfigError(Exception):
    """A config could not be loaded. Nothing was built; whatever ran before keeps running."""

    def __init__(self, source: str, issues: list[ConfigIssue]) -> None:
        self.source = source
        self.issues = issues
        super().__init__("\n".join(issue.render(source) for issue in issues))
