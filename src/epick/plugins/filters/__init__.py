"""Filters: keep the candidates that may serve the request."""
