"""Predicted latency: per-candidate TTFT and TPOT estimates from live state, a predictor trained online
from observed responses, and the plugins that route, filter and admit by them."""
