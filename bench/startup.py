"""Startup: `goclaw serve` from exec to the first 200 on /healthz, and its idle RSS, median of --runs.

The idle RSS is serve's and its job process's together (shared pages counted twice).

Each run starts the gateway twice: on a new SQLite database (the first start,
migrating) and again on it at head, as a restart does. Baseline in the same
run, interleaved with it: a bare `python -c "import aiohttp.web"` process, the
floor any aiohttp server pays; with --baseline-source DIR, also `goclaw serve`
from another source tree (e.g. the main branch's checkout), run the same way.

The processes use a bytecode cache of their own (PYTHONPYCACHEPREFIX, filled by
one discarded start of each tree), as an installed gateway, or one run once
before, has; --no-bytecode-cache measures a tree whose modules are compiled at
every start (what PYTHONDONTWRITEBYTECODE=1 on a source checkout gives).

    .venv/bin/python bench/startup.py [--runs 7] [--baseline-source /path/to/main]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss_mb(pid: int) -> float:
    """Resident memory of a process and its descendants (``goclaw serve``'s job process), shared pages counted twice."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1024
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the process has used: less sensitive than wall time to a busy machine."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _env(source: Path, pycache: Path | None) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(source))
    if pycache is None:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.pop("PYTHONPYCACHEPREFIX", None)
    else:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(pycache)
    return env


def _start_once(folder: Path, env: dict[str, str]) -> tuple[float, float, float]:
    """Start `goclaw serve` in ``folder`` (its database there): seconds to the first 200 on /healthz, CPU, RSS."""
    folder.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    (folder / "config.yaml").write_text(
        f"server: {{host: 127.0.0.1, port: {port}}}\ndatabase: {{url: 'sqlite+aiosqlite:///{folder}/g.db'}}\n"
        "logging: {level: WARNING}\n"
    )
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--config", str(folder / "config.yaml")],
        cwd=folder,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                if proc.poll() is not None:
                    raise SystemExit("goclaw serve exited during startup") from None
                time.sleep(0.005)
        elapsed = time.perf_counter() - started
        cpu = _cpu_s(proc.pid)
        time.sleep(1.5)  # idle: the job process (started after the listener) has started too
        return elapsed, cpu, _rss_mb(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def _floor(env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import aiohttp.web"], env=env, check=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--baseline-source", type=Path, help="another source tree to start the same way, in the same run")
    ap.add_argument("--no-bytecode-cache", action="store_true", help="compile the modules at every start")
    args = ap.parse_args()
    trees = {"this tree": ROOT}
    if args.baseline_source is not None:
        trees["baseline source"] = args.baseline_source.resolve()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        pycache = None if args.no_bytecode_cache else base / "pycache"
        envs = {name: _env(source, pycache) for name, source in trees.items()}
        for name, env in envs.items():  # fills the bytecode cache (a migrating start and a restart); not counted
            _start_once(base / "warm" / name, env)
            _start_once(base / "warm" / name, env)
        floor_env = _env(ROOT, pycache)
        _floor(floor_env)
        first: dict[str, list[float]] = {name: [] for name in trees}
        restart: dict[str, list[float]] = {name: [] for name in trees}
        rss: dict[str, list[float]] = {name: [] for name in trees}
        cpu: dict[str, list[float]] = {name: [] for name in trees}
        floor: list[float] = []
        for i in range(args.runs):
            for name, env in envs.items():
                folder = base / f"run{i}" / name
                first[name].append(_start_once(folder, env)[0])
                t, c, m = _start_once(folder, env)
                restart[name].append(t)
                cpu[name].append(c)
                rss[name].append(m)
            floor.append(_floor(floor_env))
    cache = "no bytecode cache" if args.no_bytecode_cache else "bytecode cached"
    print(f"goclaw serve to /healthz, median of {args.runs} runs ({cache}; target: under 0.6 s):")
    for name, source in trees.items():
        print(
            f"  {name} ({source}): first start (migrating) {statistics.median(first[name]):.2f} s; "
            f"restart {statistics.median(restart[name]):.2f} s (CPU {statistics.median(cpu[name]):.2f} s); "
            f"idle RSS {statistics.median(rss[name]):.0f} MB"
        )
    print(f"baseline, python -c 'import aiohttp.web': median {statistics.median(floor):.2f} s")
    if args.baseline_source is not None:
        ratio = statistics.median(restart["this tree"]) / statistics.median(restart["baseline source"])
        cpu_ratio = statistics.median(cpu["this tree"]) / statistics.median(cpu["baseline source"])
        print(f"restart, this tree / baseline source: wall {ratio:.2f}, CPU {cpu_ratio:.2f}")


if __name__ == "__main__":
    main()
