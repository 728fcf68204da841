"""Startup: `goclaw serve` from exec to the first 200 on /healthz, and its idle RSS, median of --runs.

The first run migrates a new SQLite database; the rest start on it at head, as
a restart does. Baseline in the same run: a bare `python -c "import aiohttp"`
process, the floor any aiohttp server pays.

    .venv/bin/python bench/startup.py [--runs 7]
"""

from __future__ import annotations

import argparse
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
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _start_once(folder: Path) -> tuple[float, float]:
    port = _free_port()
    (folder / "config.yaml").write_text(
        f"server: {{host: 127.0.0.1, port: {port}}}\ndatabase: {{url: 'sqlite+aiosqlite:///{folder}/g.db'}}\n"
        "logging: {level: WARNING}\n"
    )
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--config", str(folder / "config.yaml")],
        cwd=folder,
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
        time.sleep(0.5)
        return elapsed, _rss_mb(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        first, _ = _start_once(folder)
        times, rss = [], []
        for _ in range(args.runs):
            t, m = _start_once(folder)
            times.append(t)
            rss.append(m)
    floor = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import aiohttp.web"], check=True)
        floor.append(time.perf_counter() - t0)
    restart = statistics.median(times)
    print(f"goclaw serve to /healthz: first start (migrating) {first:.2f} s; restart median {restart:.2f} s")
    print(f"idle RSS median {statistics.median(rss):.0f} MB (target: startup under 0.6 s)")
    print(f"baseline, python -c 'import aiohttp.web': median {statistics.median(floor):.2f} s")


if __name__ == "__main__":
    main()
