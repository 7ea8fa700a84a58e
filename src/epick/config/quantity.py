"""Kubernetes resource quantities ("1Gi", "500M", "1k", "1e3", 100), as the flowControl limits take
them, read as a whole number the way apimachinery's Quantity.Value() does (rounded up)."""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation
from typing import Annotated

from pydantic import BeforeValidator

_SUFFIXES = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}
_QUANTITY_RE = re.compile(r"([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?")


def parse_quantity(value: object) -> int:
    """The whole number a quantity stands for, rounded up ("1.5" → 2, "1Gi" → 1073741824)."""
    if isinstance(value, bool):
        raise ValueError("a quantity is a number or a string like '500', '1k' or '1Gi'")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return math.ceil(value)
    if not isinstance(value, str):
        raise ValueError("a quantity is a number or a string like '500', '1k' or '1Gi'")
    m = _QUANTITY_RE.fullmatch(value.strip())
    if m is None:
        raise ValueError(
            f"{value!r} is not a Kubernetes quantity (write a number with an optional suffix: "
            "k, M, G, T, P, E or Ki, Mi, Gi, Ti, Pi, Ei, e.g. '1k' or '10Gi')"
        )
    try:
        number = Decimal(m.group(1))
        if m.group(2):
            number *= Decimal(10) ** int(m.group(2)[1:])
        else:
            number *= _SUFFIXES[m.group(3) or ""]
    except InvalidOperation:
        raise ValueError(f"{value!r} is not a Kubernetes quantity") from None
    return math.ceil(number)


Quantity = Annotated[int, BeforeValidator(parse_quantity)]
