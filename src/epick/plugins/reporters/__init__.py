"""Plugins that report what a response cost back to the gateway (request-control response hooks)."""
