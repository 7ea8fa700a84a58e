"""The data layer: which endpoints exist (discovery) and what state they are in (scraping)."""
