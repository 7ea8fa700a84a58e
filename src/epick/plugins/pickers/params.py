"""Parameters shared by every picker."""

from pydantic import Field

from epick.plugins.registry import Parameters


class PickerParameters(Parameters):
    max_num_of_endpoints: int = Field(default=1, ge=1)
