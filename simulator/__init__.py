"""The simulated model endpoint (the one stand-in): real HTTP, OpenAI and Ollama wire formats.

Imports ``storage`` only (the corpus format and the error root), never the engine or the analysis
it is measured by. ``waves`` generates measurement waves in process (known truth for
``analysis.waves``).
"""

__all__ = ["app", "config", "model", "process", "server", "waves", "wire"]
