"""The latency objectives a client asks for, in request headers (milliseconds).

llm-d's names (llm-d/llm-d-router, pkg/epp/metadata/consts.go): `x-llm-d-slo-ttft-ms` and
`x-llm-d-slo-tpot-ms`, with the deprecated `x-slo-ttft-ms` and `x-slo-tpot-ms` read only when the
current name is absent (a present current name wins, even "0"). A value that is not a number counts
as no objective (0), as upstream's plugins treat it; so do NaN, infinities and negative values
(epick's choice: upstream passes them on, and no comparison with them means anything).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

TTFT_HEADER = "x-llm-d-slo-ttft-ms"
TPOT_HEADER = "x-llm-d-slo-tpot-ms"
OLD_TTFT_HEADER = "x-slo-ttft-ms"
OLD_TPOT_HEADER = "x-slo-tpot-ms"


def header_value(headers: Mapping[str, str], name: str, old: str) -> str | None:
    """The value of header `name`, else of its deprecated `old` name; None when neither is sent."""
    value = headers.get(name)
    return value if value is not None else headers.get(old)


def _header_ms(headers: Mapping[str, str], name: str, old: str) -> float:
    value = header_value(headers, name, old)
    if value is None:
        return 0.0
    try:
        ms = float(value.strip())
    except ValueError:
        return 0.0
    return ms if math.isfinite(ms) and ms > 0 else 0.0


@dataclass(frozen=True, slots=True)
class Objectives:
    ttft_ms: float = 0.0  # 0: none asked
    tpot_ms: float = 0.0

    @property
    def any(self) -> bool:
        return self.ttft_ms > 0 or self.tpot_ms > 0


def objectives(headers: Mapping[str, str]) -> Objectives:
    """The request's TTFT and TPOT objectives (headers are lower-case, as the front ends give them)."""
    return Objectives(
        _header_ms(headers, TTFT_HEADER, OLD_TTFT_HEADER), _header_ms(headers, TPOT_HEADER, OLD_TPOT_HEADER)
    )
