"""Multimodal embeddings: which endpoint already encoded the request's images, audio and video."""
