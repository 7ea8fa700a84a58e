"""epick: an inference-aware endpoint picker for LLM serving."""

__version__ = "0.1.0"
