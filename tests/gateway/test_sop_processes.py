"""Two gateway processes on one PostgreSQL database: each due SOP run fires exactly once."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import select

from gateway.automation.models import SopRun
from gateway.db import make_engine, upgrade

ROOT = Path(__file__).resolve().parents[2]
STEPS = 8
SOPS = 5


def test_two_processes_fire_each_due_run_once(pg_url: str, tmp_path: Path) -> None:
    # Migrate first, so the two processes race on the runs, not on creating the tables.
    async def migrate() -> None:
        engine = make_engine(pg_url)
        await upgrade(engine)
        await engine.dispose()

    asyncio.run(migrate())
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.gateway.sop_process",
                pg_url,
                str(tmp_path / f"ready-{n}"),
                str(go),
                str(STEPS),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(2)
    ]
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"ready-{n}").exists() for n in range(2)):
            assert time.monotonic() < deadline, "the gateway processes did not start"
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.05)
        go.touch()
        outputs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (_out, errors) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, errors
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]

    async def rows() -> list[SopRun]:
        engine = make_engine(pg_url)
        try:
            async with engine.connect() as conn:
                return list((await conn.execute(select(SopRun))).all())  # type: ignore[arg-type]
        finally:
            await engine.dispose()

    runs = asyncio.run(rows())
    due = [(r.sop_name, r.due_at) for r in runs]
    assert len(due) == SOPS * STEPS == len(set(due)), "a due run fired twice, or not at all"
    claimed = [set(r["claimed"]) for r in results]
    assert not claimed[0] & claimed[1], "both processes claimed the same run"
    assert claimed[0] | claimed[1] == {r.id for r in runs}
    assert {r.status for r in runs} <= {"ok", "skipped"}
    # Every run that started reached the model once, in whichever process claimed it.
    assert sum(r["model_calls"] for r in results) == len([r for r in runs if r.status == "ok"])
