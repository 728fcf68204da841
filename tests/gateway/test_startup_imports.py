"""`goclaw serve` loads only what its config uses: the start-up gain stays (bench/startup.py measures it).

Each check runs a fresh interpreter that imports what `goclaw serve` imports,
builds and starts the gateway as serve does (web app, dashboard, channels,
worker) on a SQLite database already at head, stops it, and prints the
modules it loaded.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SERVE_LIKE = """
import asyncio, sys
import gateway.cli, gateway.server
from gateway.app import Gateway
from gateway.cli.common import load

async def main():
    gw = Gateway(load(sys.argv[1]))
    await gw.start(channels=False)
    await gw.start_channels()
    await gw.stop()

asyncio.run(main())
print(" ".join(sorted(sys.modules)))
"""

# Loaded only where used: a migration to run, a channel enabled, a provider chosen, a PostgreSQL
# database, a cron SOP, a dashboard page, a CLI command that prints a table.
NEVER_ON_A_PLAIN_START = (
    "alembic",
    "discord",
    "botbuilder",
    "botframework",
    "anthropic",
    "openai",
    "asyncpg",
    "sqlalchemy.dialects.postgresql",
    "croniter",
    "jinja2",
    "rich",
)


def _loaded(tmp_path: Path, llm: str) -> set[str]:
    config = tmp_path / "config.yaml"
    config.write_text(
        f"database: {{url: 'sqlite+aiosqlite:///{tmp_path / 'g.db'}'}}\n{llm}"
        "server: {dashboard_token: 'a-dashboard-token-for-tests-0123456789'}\n"
    )
    modules: set[str] = set()
    for _ in range(2):  # the first start migrates the new database; the second starts at head, as a restart does
        run = subprocess.run(
            [sys.executable, "-c", SERVE_LIKE, str(config)],
            cwd=tmp_path,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stderr
        modules = set(run.stdout.split())
    return modules


def _present(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return [n for n in names if any(m == n or m.startswith(n + ".") for m in modules)]


def test_serve_with_the_builtin_model_loads_no_sdk_channel_or_migration_code(tmp_path: Path) -> None:
    modules = _loaded(tmp_path, "")
    assert "gateway.web.dashboard" in modules and "aiosqlite" in modules  # it did start
    assert _present(modules, NEVER_ON_A_PLAIN_START) == []


@pytest.mark.parametrize(
    ("llm", "loaded", "absent"),
    [
        # The openai provider speaks the wire format over aiohttp: no SDK at all.
        (
            "llm: {provider: openai, model: m, base_url: 'http://127.0.0.1:9/v1', api_key: k}\n",
            "gateway.llm.openai_provider",
            ("openai", "anthropic"),
        ),
        (
            "llm: {provider: anthropic, model: m, base_url: 'http://127.0.0.1:9', api_key: k}\n",
            "anthropic",
            ("openai", "gateway.llm.openai_provider"),
        ),
    ],
)
def test_serve_loads_only_the_configured_providers_sdk(
    tmp_path: Path, llm: str, loaded: str, absent: tuple[str, ...]
) -> None:
    modules = _loaded(tmp_path, llm)
    assert loaded in modules
    assert _present(modules, (*absent, "discord", "botbuilder", "alembic")) == []
