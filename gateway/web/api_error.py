"""The one error type web handlers raise: answered as JSON (or an error frame) with a status."""

from __future__ import annotations


class ApiError(Exception):
    """An error answered as JSON with a status; ``message`` says what was wrong and what to do."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
