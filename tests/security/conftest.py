"""Fixtures for the security tests: the web app over each database backend."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.security.webapp import Web, running_web


@pytest.fixture
async def web(db_url: str) -> AsyncIterator[Web]:
    """The web app over a fresh SQLite file and a fresh PostgreSQL database."""
    async with running_web(db_url) as w:
        yield w
