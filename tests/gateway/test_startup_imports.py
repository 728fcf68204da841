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
    "orjson",
)


def _config(tmp_path: Path, llm: str = "") -> Path:
    config = tmp_path / "config.yaml"
    config.write_text(
        f"database: {{url: 'sqlite+aiosqlite:///{tmp_path / 'g.db'}'}}\n{llm}"
        "server: {dashboard_token: 'a-dashboard-token-for-tests-0123456789'}\n"
    )
    return config


def _python(tmp_path: Path, code: str, *args: str) -> str:
    """Run ``python -c code args`` on this tree; its stdout."""
    run = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    return run.stdout


def _loaded(tmp_path: Path, llm: str) -> set[str]:
    config = _config(tmp_path, llm)
    modules: set[str] = set()
    for _ in range(2):  # the first start migrates the new database; the second starts at head, as a restart does
        modules = set(_python(tmp_path, SERVE_LIKE, str(config)).split())
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
            ("openai", "anthropic", "orjson"),  # orjson (~20 ms to import) comes with the first request body
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


# Made at every start, each a dataclass's generated code compiled (a frozen one: six functions,
# about 0.6 ms on a 2-core machine); msgspec's Struct builds a class in C, about 40 times faster.
# These stay dataclasses: a field left out of equality (Principal.from_users), an __init__ of its own
# (WriteAccess), a default that is a function (Tool.authorize, AutomationStore.clock,
# WebContext.channel_status).
DATACLASSES_ON_A_START = {"Principal", "WriteAccess", "Tool", "AutomationStore", "WebContext"}

COUNT_DATACLASSES = """
import dataclasses, sys
made = []
_process = dataclasses._process_class
def _counted(cls, *args, **kwargs):
    if cls.__module__.split(".")[0] in ("gateway", "memory", "pairing", "channels"):
        made.append(cls.__qualname__)
    return _process(cls, *args, **kwargs)
dataclasses._process_class = _counted
exec(compile(open(sys.argv[2]).read(), "serve_like", "exec"))
print("DATACLASSES", " ".join(sorted(made)))
"""


def test_serve_makes_its_value_classes_without_dataclass_code_generation(tmp_path: Path) -> None:
    (tmp_path / "serve_like.py").write_text(SERVE_LIKE)
    out = _python(tmp_path, COUNT_DATACLASSES, str(_config(tmp_path)), str(tmp_path / "serve_like.py"))
    modules, made_line = out.split("DATACLASSES", 1)
    assert "gateway.web.dashboard" in modules.split()  # it did start
    made = set(made_line.split())
    assert made - DATACLASSES_ON_A_START == set(), "use msgspec.Struct for a value class on serve's path"


def _serve_until_healthz(tmp_path: Path) -> str:
    """Run the real `goclaw serve` (``python -X importtime -m gateway serve``) to its first /healthz; its stderr."""
    import socket
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    config = tmp_path / "config.yaml"
    config.write_text(
        f"database: {{url: 'sqlite+aiosqlite:///{tmp_path / 'g.db'}'}}\n"
        f"server: {{host: 127.0.0.1, port: {port}, dashboard_token: 'a-dashboard-token-for-tests-0123456789'}}\n"
    )
    # Its stderr to a file, not a pipe: -X importtime writes a line per module, and a pipe nobody
    # reads until the end stops the process at its first write past 64 KB, before /healthz.
    err_path = tmp_path / "stderr.txt"
    err = err_path.open("w")
    proc = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "gateway", "serve", "--config", str(config)],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(ROOT), NO_PROXY="127.0.0.1"),
        stdout=subprocess.DEVNULL,
        stderr=err,
        text=True,
    )
    try:
        deadline = time.monotonic() + 90  # only stops a hung process (bench/startup.py measures the time)
        answered = False
        while not answered and time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as resp:
                    answered = resp.status == 200
            except OSError:
                time.sleep(0.05)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        err.close()
    stderr = err_path.read_text()
    assert answered, stderr[-2000:]
    assert proc.returncode == 0, stderr[-2000:]
    return stderr


def test_goclaw_serve_starts_without_the_typer_cli(tmp_path: Path) -> None:
    # gateway/__main__.py runs a plain `serve` line itself: no Typer, no command groups, no Click commands built.
    _serve_until_healthz(tmp_path)  # migrates the new database
    stderr = _serve_until_healthz(tmp_path)  # at head, as a restart is
    modules = {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines() if line.startswith("import time:")}
    assert "gateway.server" in modules and "aiosqlite" in modules  # it did start
    assert _present(modules, ("typer", "click", "gateway.cli", *NEVER_ON_A_PLAIN_START)) == []


@pytest.mark.parametrize(
    ("args", "options"),
    [
        (["serve"], {"config": None, "workers": 1, "child": None}),
        (["serve", "--config", "c.yaml"], {"config": "c.yaml", "workers": 1, "child": None}),
        (["serve", "-c", "c.yaml", "--workers=3"], {"config": "c.yaml", "workers": 3, "child": None}),
        (["serve", "--config=c.yaml", "--child", "0"], {"config": "c.yaml", "workers": 1, "child": 0}),
        # The CLI reads these (its help, its messages, its own number parsing, shell completion):
        (["serve", "--help"], None),
        (["serve", "--config"], None),
        (["serve", "--config="], None),
        (["serve", "--config", "-x"], None),
        (["serve", "-c=c.yaml"], None),
        (["serve", "--config", "a.yaml", "--config", "b.yaml"], None),
        (["serve", "--workers", "abc"], None),
        (["serve", "--workers", "03"], None),
        (["serve", "--workers", "-1"], None),
        (["serve", "--bogus", "1"], None),
        (["serve", "extra"], None),
        (["--version"], None),
        (["users", "list"], None),
        ([], None),
    ],
)
def test_only_a_plain_serve_line_skips_the_cli(args: list[str], options: dict[str, object] | None) -> None:
    from gateway.__main__ import serve_options

    assert serve_options(args) == options


_CLI = "import sys; from gateway.cli import main; main(sys.argv[1:])"


@pytest.mark.parametrize(
    "case",
    ["missing config", "invalid config", "workers on sqlite", "workers 0", "port in use"],
)
def test_serve_without_the_cli_fails_as_the_cli_does(tmp_path: Path, case: str) -> None:
    import socket

    db = f"database: {{url: 'sqlite+aiosqlite:///{tmp_path / 'g.db'}'}}\n"
    (tmp_path / "bad.yaml").write_text("server: {bogus: 1}\nllm: {provider: nope}\n")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        server = f"server: {{host: 127.0.0.1, port: {port}}}\n"
        (tmp_path / "good.yaml").write_text(f"{db}{server}logging: {{level: ERROR}}\n")
        args = {
            "missing config": ["serve", "--config", "missing.yaml"],
            "invalid config": ["serve", "-c", "bad.yaml"],
            "workers on sqlite": ["serve", "--config", "good.yaml", "--workers", "2"],
            "workers 0": ["serve", "--workers=0", "--config=good.yaml"],
            "port in use": ["serve", "--config", "good.yaml"],
        }[case]
        runs = [
            subprocess.run(
                [sys.executable, *entry, *args],
                cwd=tmp_path,
                env=dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="200"),
                capture_output=True,
                text=True,
                timeout=120,
            )
            for entry in (["-m", "gateway"], ["-c", _CLI])
        ]
    fast, cli = ((r.returncode, r.stdout, r.stderr) for r in runs)
    assert fast == cli
    assert fast[0] == 2 and "error: " in fast[2]
