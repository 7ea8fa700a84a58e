"""Request-header processors: read a request's headers before admission and publish what they find."""
