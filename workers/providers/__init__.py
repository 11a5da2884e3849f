"""Provider clients, one per wire format (OpenAI-compatible, Ollama), behind ``base.Provider``.

``registry.make_provider`` picks one for an endpoint; ``_http`` (sending, status classification,
bounded decoding) is private to this package; ``parse_retirement`` (a 410 body's retirement date
and reference) is the part other layers use.
"""

from workers.providers._http import parse_retirement

__all__ = ["aio", "base", "direct", "ollama", "openai_compat", "parse_retirement", "pooled", "registry", "retry_after", "streaming"]
