"""The simulated model endpoint (the one stand-in): real HTTP, OpenAI and Ollama wire formats.

Imports ``storage`` only (the corpus format and the error root), never the engine or the analysis
it is measured by.
"""

__all__ = ["app", "config", "model", "process", "server", "wire"]
