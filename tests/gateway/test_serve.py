"""`goclaw serve` as a real process: migrates, listens, answers /healthz."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_migrates_and_answers_healthz(tmp_path: Path) -> None:
    port = free_port()
    root = Path(__file__).resolve().parents[2]
    example = (root / "config.example.yaml").read_text().replace("port: 8080", f"port: {port}")
    (tmp_path / "config.yaml").write_text(example)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--config", "config.yaml"],
        cwd=tmp_path,
        env={**os.environ, "NO_PROXY": "127.0.0.1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        # Startup time is measured in bench/startup.py; here the limit only stops a hung process,
        # generous enough for a loaded 2-core CI machine.
        deadline = time.monotonic() + 90
        body = None
        while time.monotonic() < deadline and body is None and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as resp:
                    body = resp.read().decode()
            except OSError:
                time.sleep(0.1)
        assert body is not None, "gateway did not answer /healthz (exited, or hung for 90 s)"
        assert '"ok"' in body
        assert (tmp_path / "data" / "goclaw.db").exists()
    finally:
        proc.terminate()
        output = proc.communicate(timeout=10)[0]
    assert proc.returncode == 0, output
    assert "Traceback" not in output
