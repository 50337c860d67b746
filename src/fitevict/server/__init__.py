"""The front door: an OpenAI-compatible ASGI app plus the admin API, /metrics and /health."""
