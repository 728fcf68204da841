"""``goclaw sop`` as a real process against a real SQLite file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.gateway.test_cli import goclaw

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "config.yaml").write_text((ROOT / "config.example.yaml").read_text())
    return tmp_path


def test_the_example_configs_manual_sop_runs_offline_and_is_recorded(workdir: Path) -> None:
    ran = goclaw("sop", "run", "summary", cwd=workdir)
    assert ran.returncode == 0, ran.stderr
    assert "[offline model]" in ran.stdout
    (run,) = json.loads(goclaw("sop", "runs", "summary", "--json", cwd=workdir).stdout)
    assert (run["sop"], run["trigger"], run["principal"], run["status"], run["model_calls"]) == (
        "summary",
        "manual",
        "sop-system",
        "ok",
        1,
    )
    assert run["reply"].strip().splitlines()[0] == "[offline model]"
    (listed,) = json.loads(goclaw("sop", "list", "--json", cwd=workdir).stdout)
    assert listed["name"] == "summary" and listed["origin"] == "yaml"
    assert [r["id"] for r in listed["last_runs"]] == [run["id"]]


def test_add_show_disable_enable_remove(workdir: Path) -> None:
    added = goclaw(
        "sop", "add", "queue-check", "--instruction", "Check the import queue.", "--every", "15m", cwd=workdir
    )
    assert added.returncode == 0, added.stderr
    assert "added SOP queue-check: every 15m, next run" in added.stdout
    cron = goclaw(
        "sop",
        "add",
        "daily-report",
        "--instruction",
        "Produce the daily report.",
        "--cron",
        "0 7 * * 1-5",
        "--tz",
        "Europe/Berlin",
        "--deliver-to",
        "discord:123456789",
        "--research",
        cwd=workdir,
    )
    assert cron.returncode == 0, cron.stderr
    shown = goclaw("sop", "show", "daily-report", cwd=workdir)
    assert "cron 0 7 * * 1-5 (Europe/Berlin)" in shown.stdout and "discord:123456789" in shown.stdout
    assert "research:    yes" in shown.stdout

    assert goclaw("sop", "disable", "queue-check", cwd=workdir).returncode == 0
    by_name = {s["name"]: s for s in json.loads(goclaw("sop", "list", "--json", cwd=workdir).stdout)}
    assert set(by_name) == {"daily-report", "queue-check", "summary"}
    assert by_name["queue-check"]["enabled"] is False and by_name["queue-check"]["next_run"] is None
    assert by_name["daily-report"]["next_run"] is not None
    assert goclaw("sop", "enable", "queue-check", cwd=workdir).returncode == 0
    assert json.loads(goclaw("sop", "show", "queue-check", "--json", cwd=workdir).stdout)["next_run"]

    assert goclaw("sop", "remove", "queue-check", cwd=workdir).returncode == 0
    again = goclaw("sop", "remove", "queue-check", cwd=workdir)
    assert again.returncode == 2 and "no SOP named 'queue-check'" in again.stderr
    yaml_one = goclaw("sop", "remove", "summary", cwd=workdir)
    assert yaml_one.returncode == 2 and "defined in the config" in yaml_one.stderr


def test_add_webhook_prints_its_secret_once(workdir: Path) -> None:
    added = goclaw("sop", "add", "deploy-hook", "--instruction", "Summarise the deploy.", "--webhook", cwd=workdir)
    assert added.returncode == 0, added.stderr
    assert "POST /hooks/deploy-hook, secret " in added.stdout
    shown = goclaw("sop", "show", "deploy-hook", "--json", cwd=workdir).stdout
    secret = added.stdout.split("secret ", 1)[1].split()[0]
    assert len(secret) == 64 and secret not in shown


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cron", "0 25 * * *"], "the hour field '25' is not valid"),
        (["--cron", "0 7 * * 1-9"], "the day of week field '1-9' is not valid"),
        (["--cron", "0 7 *"], "has 3 field(s)"),
        (["--cron", "0 7 * * *", "--tz", "Mars/Olympus"], "unknown time zone 'Mars/Olympus'"),
        (["--every", "15m", "--deliver-to", "slack:C123"], "unknown delivery channel 'slack'"),
        (["--every", "soon"], "interval 'soon'"),
        (["--at", "2026-12-01T07:00:00"], "no UTC offset"),
        ([], "exactly one of cron, every, at, manual, webhook (got none)"),
        (["--manual", "--every", "1h"], "exactly one of cron, every, at, manual, webhook (got every, manual)"),
    ],
)
def test_add_errors_are_one_line_with_exit_2(workdir: Path, args: list[str], message: str) -> None:
    result = goclaw("sop", "add", "report", "--instruction", "Produce the report.", *args, cwd=workdir)
    assert result.returncode == 2
    assert message in result.stderr
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "Traceback" not in result.stderr


def test_run_of_an_unknown_sop_is_one_line(workdir: Path) -> None:
    result = goclaw("sop", "run", "nope", cwd=workdir)
    assert result.returncode == 2 and "no SOP named 'nope'" in result.stderr
    assert result.stderr.strip().count("\n") == 0


def test_a_bad_sop_in_the_config_names_key_and_line(workdir: Path) -> None:
    text = (workdir / "config.yaml").read_text().replace("trigger: {manual: true}", 'trigger: {cron: "0 7 * * 8"}')
    (workdir / "config.yaml").write_text(text)
    result = goclaw("sop", "list", cwd=workdir)
    assert result.returncode == 2
    assert "automation.sops.0.trigger.cron (line" in result.stderr and "day of week field '8'" in result.stderr


def test_run_of_a_held_sop_is_refused_naming_the_obligation(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The real holds check is memory's obligations router (wired by the gateway); here a
    # gateway whose holds function holds 'summary' under one obligation.
    from typer.testing import CliRunner

    import gateway.app
    from gateway.cli import app

    class HeldGateway(gateway.app.Gateway):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]

            async def holds(name: str) -> str | None:
                return "obl_42" if name == "summary" else None

            self.sop_holds = holds

    monkeypatch.setattr(gateway.app, "Gateway", HeldGateway)
    monkeypatch.chdir(workdir)
    result = CliRunner().invoke(app, ["sop", "run", "summary"])
    assert result.exit_code == 2
    assert "held by obligation obl_42" in result.output
    assert "[offline model]" not in result.output
    (run,) = json.loads(goclaw("sop", "runs", "--json", cwd=workdir).stdout)
    assert (run["status"], run["held_by"], run["started_at"]) == ("held", "obl_42", None)
