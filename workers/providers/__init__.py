"""Provider clients (OpenAI-compatible and Ollama wire formats) and what other layers may use."""

from workers.providers._http import parse_retirement

__all__ = ["parse_retirement"]
