"""A vLLM-compatible model-server simulator: an engine model in `engine`, a server in `server`."""
