"""The operator's CLI, run as a real process against a real SQLite file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def goclaw(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "COLUMNS": "200", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "config.yaml").write_text("database:\n  url: sqlite+aiosqlite:///data/goclaw.db\n")
    return tmp_path


def test_users_add_list_role_link(workdir: Path) -> None:
    added = goclaw("users", "add", "--name", "Alice", "--role", "admin", "--link", "discord:100", "--json", cwd=workdir)
    assert added.returncode == 0, added.stderr
    uid = json.loads(added.stdout)["id"]
    assert (workdir / "data" / "goclaw.db").exists()

    assert goclaw("users", "role", uid, "user", cwd=workdir).returncode == 0
    assert goclaw("users", "link", uid, "teams:aad-1", cwd=workdir).returncode == 0
    listed = json.loads(goclaw("users", "list", "--json", cwd=workdir).stdout)
    assert listed == [
        {
            "id": uid,
            "name": "Alice",
            "role": "user",
            "created_at": listed[0]["created_at"],
            "identities": ["discord:100", "teams:aad-1"],
        }
    ]


def test_pairing_list_approve_reject_via_cli(workdir: Path) -> None:
    # Codes come from DMs; the store is the same one the adapters use.
    import asyncio

    from gateway.db import make_engine, upgrade
    from pairing import PairingStore

    async def issue() -> list[str]:
        engine = make_engine(f"sqlite+aiosqlite:///{workdir / 'data' / 'goclaw.db'}")
        await upgrade(engine)
        store = PairingStore(engine)
        codes = [(await store.request_code("discord", pid, f"P{pid}")).code for pid in ("1", "2")]
        await engine.dispose()
        return codes

    code1, code2 = asyncio.run(issue())
    pending = json.loads(goclaw("pairing", "list", "--json", cwd=workdir).stdout)
    assert {p["code"] for p in pending} == {code1, code2}

    approved = goclaw("pairing", "approve", "discord", code1, "--role", "admin", cwd=workdir)
    assert approved.returncode == 0, approved.stderr
    assert "role admin" in approved.stdout
    assert goclaw("pairing", "reject", "discord", code2, cwd=workdir).returncode == 0
    assert json.loads(goclaw("pairing", "list", "--json", cwd=workdir).stdout) == []

    again = goclaw("pairing", "approve", "discord", code1, cwd=workdir)
    assert again.returncode == 2
    assert again.stderr.strip().count("\n") == 0
    assert "already approved" in again.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("pairing", "approve", "discord", "NOPE2345"), "no pairing code NOPE2345"),
        (("users", "role", "u_missing", "admin"), "no user u_missing"),
        (("users", "add", "--name", "X", "--role", "owner"), "unknown role 'owner'"),
        (("users", "link", "u_missing", "discord"), "CHANNEL:PLATFORM_ID"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(workdir: Path, args: tuple[str, ...], message: str) -> None:
    result = goclaw(*args, cwd=workdir)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert len(result.stderr.strip().splitlines()) == 1


def test_config_check_names_key_path_line_and_suggestion(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("agent:\n  name: x\nsession:\n  max_mesages: 5\nllm:\n  provider: gpt\n")
    result = goclaw("config", "check", "--config", str(cfg), cwd=tmp_path)
    assert result.returncode == 2
    assert "session.max_mesages (line 4): unknown key; did you mean 'max_messages'?" in result.stderr
    assert "llm.provider (line 6)" in result.stderr


def test_config_check_missing_env_var_names_it(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("channels:\n  discord:\n    enabled: true\n    token: ${GOCLAW_TEST_NO_SUCH_VAR}\n")
    result = goclaw("config", "check", "--config", str(cfg), cwd=tmp_path)
    assert result.returncode == 2
    assert "GOCLAW_TEST_NO_SUCH_VAR is not set" in result.stderr
    assert "line 4" in result.stderr


def test_retired_quarantine_setting_loads_with_warning(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("memory:\n  quarantine_learned_facts: true\n")
    result = goclaw("config", "check", "--config", str(cfg), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "quarantine_learned_facts is retired" in result.stderr


def test_config_is_found_through_env_then_cwd(tmp_path: Path) -> None:
    missing = goclaw("config", "check", cwd=tmp_path)
    assert missing.returncode == 2
    assert "config.yaml not found" in missing.stderr
    other = tmp_path / "elsewhere.yaml"
    other.write_text("agent:\n  name: elsewhere\n")
    assert goclaw("config", "check", cwd=tmp_path, env={"GOCLAW_CONFIG": str(other)}).returncode == 0


def test_example_config_is_valid() -> None:
    root = Path(__file__).resolve().parents[2]
    result = goclaw("config", "check", "--config", str(root / "config.example.yaml"), cwd=root)
    assert result.returncode == 0, result.stderr


def test_corrupt_database_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "goclaw.db").write_bytes(b"this is not sqlite" * 100)
    (tmp_path / "config.yaml").write_text("database:\n  url: sqlite+aiosqlite:///data/goclaw.db\n")
    result = goclaw("users", "list", cwd=tmp_path)
    assert result.returncode == 2
    assert "corrupt" in result.stderr
    assert "Traceback" not in result.stderr


def test_unwritable_data_folder_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "data").write_text("a file where the data folder should be")
    (tmp_path / "config.yaml").write_text("database:\n  url: sqlite+aiosqlite:///data/sub/goclaw.db\n")
    result = goclaw("users", "add", "--name", "A", "--role", "user", cwd=tmp_path)
    assert result.returncode == 2
    # The relative path is the config file's folder's, and the error names it in full.
    assert f"cannot create the database folder {tmp_path / 'data' / 'sub'}" in result.stderr


def test_unreachable_postgres_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("database:\n  url: postgresql+asyncpg://nobody@127.0.0.1:1/none\n")
    result = goclaw("db", "upgrade", cwd=tmp_path)
    assert result.returncode == 2
    assert "cannot use the database at postgresql+asyncpg://nobody@127.0.0.1:1/none" in result.stderr


def test_invalid_yaml_names_the_line(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("agent:\n  name: x\n  persona: [unclosed\n")
    result = goclaw("config", "check", "--config", str(cfg), cwd=tmp_path)
    assert result.returncode == 2
    assert "not valid YAML" in result.stderr
    assert "line" in result.stderr


def test_config_check_catches_a_network_provider_without_a_model_name(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("llm:\n  provider: openai\n  base_url: http://127.0.0.1:11434/v1\n")
    result = goclaw("config", "check", "--config", str(cfg), cwd=tmp_path)
    assert result.returncode == 2
    assert "llm.model must name the openai model" in result.stderr


def test_config_check_catches_a_bad_model_url(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("llm:\n  provider: openai\n  model: m\n  base_url: localhost:11434\n")
    result = goclaw("config", "check", "--config", str(cfg), cwd=tmp_path)
    assert result.returncode == 2
    assert "is not an http(s) URL" in result.stderr


def test_archives_export_writes_markdown_that_relearn_reads(workdir: Path) -> None:
    import asyncio
    from datetime import UTC, datetime

    from gateway.app import Gateway
    from gateway.config import Config
    from gateway.sessions import SessionKey
    from gateway.turn import TurnRequest

    async def make_history() -> None:
        url = f"sqlite+aiosqlite:///{workdir / 'data' / 'goclaw.db'}"
        cfg = Config.model_validate({"database": {"url": url}, "session": {"max_messages": 4, "keep_messages": 1}})
        gw = Gateway(cfg)
        await gw.start(channels=False, worker=False)
        admin = await gw.pairing.principal_for_user((await gw.pairing.add_user("Alice", "admin")).id)
        for i, text in enumerate(["the report is produced from example_orders", "answer me in English", "thanks"]):
            req = TurnRequest(SessionKey("api", "r"), admin, text, f"m{i}", datetime.now(UTC), "Alice")
            await gw.turns.handle(req)
        await gw.stop()

    asyncio.run(make_history())
    listed = json.loads(goclaw("archives", "list", "--json", cwd=workdir).stdout)
    assert len(listed) == 1 and listed[0]["trust"] == "admin"
    exported = goclaw("archives", "export", "--out", "out", cwd=workdir)
    assert exported.returncode == 0, exported.stderr
    (path,) = (workdir / "out").glob("*.md")
    text = path.read_text()
    assert "- **Trust**: admin" in text
    assert "example_orders" in text
    relearn = goclaw("memory", "relearn", "--archive", str(path), "--dry-run", cwd=workdir)
    assert relearn.returncode == 0, relearn.stderr
    assert "Traceback" not in relearn.stderr
