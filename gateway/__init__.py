"""The composition root: config, database, sessions, the turn, LLM providers, web, CLI."""

__version__ = "0.1.0"
