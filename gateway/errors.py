"""Errors that reach a person: one line, saying what was wrong and what to do."""


class GoclawError(Exception):
    """An error whose message is meant for the operator or the person chatting."""


class ConfigError(GoclawError):
    """The configuration cannot be used; ``problems`` lists every reason."""

    def __init__(self, problems: list[str], path: str = "") -> None:
        self.problems = problems
        self.path = path
        head = f"{path}: " if path else ""
        super().__init__(head + "; ".join(problems))


class DatabaseUnavailable(GoclawError):
    """The database cannot be opened or reached."""
