"""Provider clients, one per wire format (OpenAI-compatible, Ollama), behind ``base.Provider``.

``registry.make_provider`` picks one for an endpoint; ``_http`` (sending, status classification,
bounded decoding) is private to this package.
"""

__all__ = ["base", "ollama", "openai_compat", "registry"]
