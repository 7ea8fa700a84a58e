"""The predicted-latency producer's parameters: upstream's, and the predictor's (its learner, window
and the analytic model it starts from)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from epick.plugins.duration import parse_duration
from epick.plugins.latency.learners import GBDT_MISSING, gbdt_available
from epick.plugins.latency.predictor import AnalyticModel
from epick.plugins.registry import Parameters


def _go_nanoseconds(value: object) -> object:
    """Upstream decodes a time.Duration from JSON as integer nanoseconds; epick also takes "5m"."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value / 1e9
    return parse_duration(value)


class AnalyticParameters(Parameters):
    step_ms: float = Field(default=6.0, ge=0)
    prefill_tokens_per_second: float = Field(default=15928.0, gt=0)
    ttft_per_running_ms: float = Field(default=0.1, ge=0)
    tpot_per_running_ms: float = Field(default=0.05, ge=0)
    tpot_full_kv_ms: float = Field(default=17.0, ge=0, alias="tpotFullKvMs")

    def model(self) -> AnalyticModel:
        return AnalyticModel(
            self.step_ms,
            self.prefill_tokens_per_second,
            self.ttft_per_running_ms,
            self.tpot_per_running_ms,
            self.tpot_full_kv_ms,
        )


class PredictorParameters(Parameters):
    # None: gbdt where LightGBM is installed, else the analytic model (the image has no LightGBM)
    learner: Literal["gbdt", "analytic"] | None = None
    window: int = Field(default=4000, ge=1)
    min_samples: int = Field(default=200, ge=1)
    retrain_every: int = Field(default=200, ge=1)
    analytic: AnalyticParameters = Field(default_factory=AnalyticParameters)

    @field_validator("learner")
    @classmethod
    def _learner_installed(cls, v: str | None) -> str | None:
        if v == "gbdt" and not gbdt_available():
            raise ValueError(f"learner gbdt: {GBDT_MISSING}; or set learner: analytic")
        return v

    @property
    def learner_name(self) -> str:
        """The learner that runs: the one named, else gbdt where LightGBM is installed."""
        if self.learner is not None:
            return self.learner
        return "gbdt" if gbdt_available() else "analytic"

    @model_validator(mode="after")
    def _window_holds_min_samples(self) -> PredictorParameters:
        if self.window < self.min_samples:
            raise ValueError(
                f"window ({self.window}) must hold at least minSamples ({self.min_samples}) responses, "
                "or no model is ever fitted"
            )
        return self


class PredictedLatencyParameters(Parameters):
    sampling_mean: float = 1000.0
    max_decode_token_samples_for_prediction: int = 0
    slo_buffer_factor: float = Field(default=1.0, alias="sloBufferFactor")
    context_ttl: Annotated[float, BeforeValidator(_go_nanoseconds)] = Field(default=300.0, alias="contextTTL")
    streaming_mode: bool = False
    endpoint_role_label: str = ""
    predict_in_produce: bool = True
    prefix_match_info_producer_name: str = ""
    in_flight_load_producer_name: str = ""
    use_encoder_cache_features: bool = False
    encoder_cache_match_info_producer_name: str = ""
    predictor: PredictorParameters = Field(default_factory=PredictorParameters)

    @field_validator("slo_buffer_factor")
    @classmethod
    def _buffer(cls, v: float) -> float:
        if not v > 0:
            raise ValueError(f"sloBufferFactor must be > 0, got {v}")
        return v
