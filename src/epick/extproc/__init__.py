"""Envoy external processing: how a gateway asks epick where each request goes."""
