"""The serving shell: OpenAI-compatible HTTP API, admission control, auth, metrics, health, drain."""
