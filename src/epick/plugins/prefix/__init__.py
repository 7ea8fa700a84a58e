"""The approximate prefix-cache index and the scorer built on it."""
