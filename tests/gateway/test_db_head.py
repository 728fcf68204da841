"""The database is migrated once; a gateway starting on an up-to-date database does not load Alembic."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from alembic.config import Config as AlembicConfig
from alembic.script import ScriptDirectory

from gateway import db
from gateway.db import MIGRATIONS, current_revision, head_revision, make_engine, upgrade

ROOT = Path(__file__).resolve().parents[2]


def test_head_revision_read_from_files_is_alembics_head() -> None:
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    assert head_revision() == ScriptDirectory.from_config(cfg).get_current_head()


async def test_upgrade_on_a_database_at_head_runs_no_migration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = make_engine(f"sqlite+aiosqlite:///{tmp_path / 'g.db'}")
    try:
        await upgrade(engine)
        assert await current_revision(engine) == head_revision()

        def _must_not_run(*_a: object) -> None:
            raise AssertionError("migrations ran on a database already at head")

        monkeypatch.setattr(db, "_upgrade", _must_not_run)
        await upgrade(engine)  # one query, no Alembic
    finally:
        await engine.dispose()


def test_serving_modules_do_not_import_alembic() -> None:
    code = "import sys, gateway.server, gateway.app, gateway.web.app; print('alembic' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert out.strip() == "False"
