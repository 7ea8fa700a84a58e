"""Data-layer plugins: sources, extractors and discovery, configured by `dataLayer`."""
