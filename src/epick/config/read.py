"""Reading a config: its file's text, parsed as YAML and validated against the schema (strict:
unknown fields are errors), each problem a `ConfigIssue` naming its path and a fix."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from epick.config.errors import ConfigError, ConfigIssue
from epick.config.issues import _issue_from_pydantic
from epick.config.schema import EndpointPickerConfigFile

__all__ = ["parse_document", "read_text"]


def read_text(path: str | Path) -> str:
    """The file's text; raises `ConfigError` when it cannot be read or is not UTF-8."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(str(path), [ConfigIssue("", f"cannot read the file: {e.strerror or e}")]) from None
    except UnicodeDecodeError:
        raise ConfigError(str(path), [ConfigIssue("", "the file is not UTF-8 text")]) from None


def parse_document(text: str, source: str) -> EndpointPickerConfigFile:
    """The document `text` holds (`source` names it in errors), validated."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError(
            source, [ConfigIssue("", f"not valid YAML: {where}{problem}", "correct the YAML syntax there")]
        ) from None
    if raw is None:
        raise ConfigError(
            source,
            [
                ConfigIssue(
                    "", "the file is empty", "write an EndpointPickerConfig, or give no config file at all"
                )
            ],
        )
    if not isinstance(raw, dict):
        raise ConfigError(
            source,
            [
                ConfigIssue(
                    "",
                    f"expected a mapping at the top, found {type(raw).__name__}",
                    "start with 'apiVersion:'",
                )
            ],
        )
    try:
        return EndpointPickerConfigFile.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(
            source, [_issue_from_pydantic(err, EndpointPickerConfigFile) for err in e.errors()]
        ) from None
