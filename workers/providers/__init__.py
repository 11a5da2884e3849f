"""Provider clients, one per wire format (OpenAI-compatible, Ollama), behind ``base.Provider``.

``registry.make_provider`` picks one for an endpoint; ``_http`` (sending, status classification,
bounded decoding) is private to this package, except ``parse_retirement``, which other layers use
through this package.
"""

from workers.providers._http import parse_retirement

__all__ = ["base", "ollama", "openai_compat", "parse_retirement", "registry"]
