"""Pickers: choose the targets from the scored survivors of a profile."""
