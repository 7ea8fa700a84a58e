"""Token ids for the request: the token producer and its backends."""
