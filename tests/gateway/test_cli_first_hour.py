"""The CLI as a new operator meets it: one config and database, secrets only when used, whole ids, one-line errors.

Each command runs as a real process against a real SQLite file.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gateway.cli.ids import IdError, choose
from gateway.config import ConfigError, check_secrets, load_config
from gateway.db import make_engine, upgrade
from memory.store import MemoryStore
from memory.writer import MemoryWriter
from pairing import Principal, Role

UNSET = "GOCLAW_TEST_FIRSTHOUR_UNSET"


def goclaw(*args: str, cwd: Path, columns: int = 200) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in (UNSET, "GOCLAW_CONFIG")}
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        cwd=cwd,
        env={**env, "COLUMNS": str(columns)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def one_line_error(done: subprocess.CompletedProcess[str], text: str) -> None:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert text in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr and "╭" not in done.stderr


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """An operator's folder: config.yaml with a relative SQLite path, a secret from an unset variable."""
    folder = tmp_path / "gateway-home"
    folder.mkdir()
    (folder / "config.yaml").write_text(
        "database:\n"
        "  url: sqlite+aiosqlite:///data/goclaw.db\n"
        "server:\n"
        "  api_users:\n"
        f"    - token: ${{{UNSET}}}\n"
        "      user: u_alice\n"
    )
    return folder


# ---- item 4: one config, one database ---------------------------------------------------


def test_cli_from_another_folder_uses_the_database_next_to_the_config(home: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    relative = "../gateway-home/config.yaml"
    added = goclaw("users", "add", "--name", "Alice", "--role", "admin", "--json", "--config", relative, cwd=elsewhere)
    assert added.returncode == 0, added.stderr
    assert (home / "data" / "goclaw.db").exists()
    assert not (elsewhere / "data").exists()
    # And from the config's own folder, the same person is there.
    listed = json.loads(goclaw("users", "list", "--json", cwd=home).stdout)
    assert [u["id"] for u in listed] == [json.loads(added.stdout)["id"]]


def test_relative_sqlite_path_is_resolved_against_the_config_folder(home: Path) -> None:
    cfg = load_config(home / "config.yaml", env={})
    assert cfg.database.url == f"sqlite+aiosqlite:///{home.resolve() / 'data' / 'goclaw.db'}"
    absolute = home / "abs.yaml"
    absolute.write_text("database:\n  url: sqlite+aiosqlite:////srv/goclaw/x.db\n")
    assert load_config(absolute, env={}).database.url == "sqlite+aiosqlite:////srv/goclaw/x.db"


# ---- item 5: secrets resolved when used ---------------------------------------------------


def test_a_command_that_does_not_use_a_secret_does_not_need_it(home: Path) -> None:
    assert goclaw("users", "list", cwd=home).returncode == 0
    # The reported case: review confirm failed on GOCLAW_TOKEN_ALICE; now it gets to the record.
    one_line_error(goclaw("memory", "review", "confirm", "m_0000000000000000", cwd=home), "no memory record")


def test_serve_and_config_check_name_the_unset_variable_and_its_key(home: Path) -> None:
    for command in (("config", "check"), ("serve",)):
        done = goclaw(*command, cwd=home)
        one_line_error(done, f"server.api_users.0.token (line 5): environment variable {UNSET} is not set")


def test_a_secret_is_checked_only_where_the_config_uses_it(home: Path) -> None:
    path = home / "c.yaml"
    path.write_text(f"channels:\n  discord:\n    enabled: false\n    token: ${{{UNSET}}}\n")
    check_secrets(load_config(path, env={}))  # disabled: not used, no error
    path.write_text(f"channels:\n  discord:\n    enabled: true\n    token: ${{{UNSET}}}\n")
    with pytest.raises(ConfigError, match=rf"channels.discord.token \(line 4\): environment variable {UNSET}"):
        check_secrets(load_config(path, env={}))
    cfg = load_config(path, env={UNSET: "a-real-token"})
    check_secrets(cfg)
    assert cfg.channels.discord.token is not None and cfg.channels.discord.token.get_secret_value() == "a-real-token"


# ---- item 6: whole ids, unique prefixes ---------------------------------------------------


def _seed_notes(home: Path, count: int) -> list[str]:
    async def go() -> list[str]:
        engine = make_engine(f"sqlite+aiosqlite:///{home / 'data' / 'goclaw.db'}")
        await upgrade(engine)
        writer = MemoryWriter(MemoryStore(engine))
        admin = Principal.human("u_admin0001", Role.ADMIN, "Ada")
        ids = []
        for i in range(count):
            done = await writer.write(
                admin,
                "agent_notes",
                "memory_write",
                subject=f"report {i} table",
                content=f"report {i} uses table t{i}",
                said_at=datetime(2026, 11, 1, tzinfo=UTC),
            )
            assert done.record is not None
            ids.append(done.record.id)
        await engine.dispose()
        return ids

    (home / "data").mkdir(exist_ok=True)
    return asyncio.run(go())


def test_ids_are_whole_in_a_narrow_table_and_a_prefix_is_accepted(home: Path) -> None:
    (record,) = _seed_notes(home, 1)
    listed = goclaw("memory", "list", cwd=home, columns=60)
    assert listed.returncode == 0, listed.stderr
    assert record in listed.stdout
    shown = goclaw("memory", "show", record[:8], "--json", cwd=home)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["id"] == record
    one_line_error(goclaw("memory", "show", record[:4], cwd=home), "at least 6 characters")
    admin = json.loads(goclaw("users", "add", "--name", "Ann", "--role", "admin", "--json", cwd=home).stdout)["id"]
    missing = goclaw("memory", "retract", "m_ffffffffffff", "--by", admin, "--reason", "x", cwd=home)
    one_line_error(missing, "no memory record")


def test_users_role_takes_a_prefix(home: Path) -> None:
    uid = json.loads(goclaw("users", "add", "--name", "Bo", "--role", "user", "--json", cwd=home).stdout)["id"]
    done = goclaw("users", "role", uid[:8], "admin", cwd=home)
    assert done.returncode == 0, done.stderr
    assert f"{uid} (Bo) now has role admin" in done.stdout


def test_choose_resolves_exact_unique_and_refuses_ambiguous_or_short() -> None:
    ids = ["m_9ed1aa", "m_9ed1bb"]
    assert choose("m_9ed1aa", ids, kind="memory record", hint="h") == "m_9ed1aa"
    assert choose("m_9ed1b", ["m_9ed1bb"], kind="memory record", hint="h") == "m_9ed1bb"
    with pytest.raises(IdError, match=r"matches 2 memory records \(m_9ed1aa, m_9ed1bb\)"):
        choose("m_9ed1", ids, kind="memory record", hint="h")
    with pytest.raises(IdError, match="at least 6"):
        choose("m_9e", ids, kind="memory record", hint="h")
    with pytest.raises(IdError, match="no memory record m_0000: see 'h'"):
        choose("m_0000", [], kind="memory record", hint="h")


# ---- item 7: one-line errors, --version, known channels, no such person ----------------------


def test_version(home: Path) -> None:
    done = goclaw("--version", cwd=home)
    assert done.returncode == 0 and done.stdout.startswith("goclaw ")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("users", "add", "--nme", "X"), "No such option: --nme"),
        (("users", "role"), "Missing argument"),
        (("users", "add", "--name", "X", "--role", "user", "--link", "slack:1"), "unknown channel 'slack'"),
        (("pairing", "approve", "slack", "ABCD2345"), "unknown channel 'slack': use one of discord, teams, web, api"),
        (("memory", "list", "--user", "u_nope"), "no user u_nope"),
        # Brackets in what was typed are printed as typed, not read as Rich markup.
        (("users", "add", "--name", "X", "--role", "[owner]"), "unknown role '[owner]'"),
    ],
)
def test_errors_are_one_line(home: Path, args: tuple[str, ...], message: str) -> None:
    one_line_error(goclaw(*args, cwd=home), message)
