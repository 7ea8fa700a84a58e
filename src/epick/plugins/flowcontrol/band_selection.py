"""`strict-band-selection-policy`: the bands in priority order, highest first (upstream's
flowcontrol/bandselection, llm-d-router #2920, Beta), the order a dispatch cycle takes without a
`flowControl.bandSelectionPolicyPluginRef`. Naming it changes nothing; it exists so configs that
name it load, and as the shape of other orders."""

from __future__ import annotations

from collections.abc import Sequence

from epick.framework import NamedPlugin, Reads
from epick.plugins.registry import Handle, NoParameters, PluginSpec

TYPE = "strict-band-selection-policy"


class StrictBandSelection(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.NOTHING

    def rank(
        self, saturation: float, priorities: Sequence[int], ceilings: Sequence[float], order: list[int]
    ) -> None:
        """Leave `order` as it comes: highest priority first."""


def _factory(name: str, params: NoParameters, handle: Handle) -> StrictBandSelection:
    return StrictBandSelection(name)


SPEC = PluginSpec(
    TYPE, _factory, NoParameters, "flow-control band selection: highest priority first", worker_state=""
)
