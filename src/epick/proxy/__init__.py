"""The standalone OpenAI-compatible proxy: schedules each request and forwards it itself."""
