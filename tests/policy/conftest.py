"""Fixtures of the conformance suite: every test runs once with each model, on a real database.

``model`` is parametrized: the builtin offline model, and the hostile model of
``tests/policy/hostile.py``. ``world`` is a started gateway with the cast of
``tests/policy/world.py`` paired, on a SQLite file; tests marked with
``tests.policy.world.BOTH_BACKENDS`` also run on PostgreSQL (skipped when it is absent, a failure in CI).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Clock
from tests.policy.hostile import HostileProvider, RecordingBuiltin, make_model
from tests.policy.world import MakeWorld, World, close_world, open_world


@pytest.fixture(params=["builtin", "hostile"])
def model(request: pytest.FixtureRequest) -> HostileProvider | RecordingBuiltin:
    """The builtin offline model, then the hostile one."""
    return make_model(request.param)


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    """``sqlite`` unless the test asks for both backends."""
    return str(getattr(request, "param", "sqlite"))


@pytest.fixture
def world_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database of the backend."""
    if backend == "postgres":
        return str(request.getfixturevalue("pg_url"))
    return f"sqlite+aiosqlite:///{tmp_path / 'policy.db'}"


@pytest.fixture
async def make_world(
    world_url: str, model: HostileProvider | RecordingBuiltin, clock: Clock
) -> AsyncIterator[MakeWorld]:
    """Start a gateway with options (``max_messages``, ``write_access_users``, ...); stopped after the test."""
    opened: list[World] = []

    async def factory(**options: Any) -> World:
        assert not opened, "one world per test: they would share the database"
        w = await open_world(world_url, model, clock, **options)
        opened.append(w)
        return w

    yield factory
    for w in opened:
        await close_world(w)


@pytest.fixture
async def world(make_world: MakeWorld) -> World:
    """A gateway with the default options: trims past 8 messages, keeping 1."""
    return await make_world()
