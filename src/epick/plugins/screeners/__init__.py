"""Screeners: narrow a request's candidates once, before the data producers and every profile."""
