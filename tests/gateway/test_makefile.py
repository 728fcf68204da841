"""The Makefile's promises to a new operator, checked with the real make (recipes dry-run, config made for real)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    for name in ("Makefile", "pyproject.toml", "config.example.yaml"):
        shutil.copy(ROOT / name, tmp_path / name)
    return tmp_path


def make(cwd: Path, *args: str) -> str:
    done = subprocess.run(["make", *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=True)
    return done.stdout


def test_make_run_installs_runtime_only_and_serves_config_yaml(clone: Path) -> None:
    recipe = make(clone, "-n", "run")
    assert "pip install -q -e .\n" in recipe
    assert "[dev]" not in recipe
    assert "cp config.example.yaml config.yaml" in recipe
    assert "goclaw serve --config config.yaml" in recipe


def test_make_test_installs_the_dev_extra(clone: Path) -> None:
    recipe = make(clone, "-n", "test")
    assert "pip install -q -e '.[dev]'" in recipe
    assert "apt-get install -y -qq chromium" in recipe  # the browser tests' Chromium, where it is missing
    assert "pytest -q" in recipe


def test_config_yaml_is_made_once_from_the_example_and_never_overwritten(clone: Path) -> None:
    make(clone, "config.yaml")
    made = clone / "config.yaml"
    assert made.read_text() == (clone / "config.example.yaml").read_text()
    made.write_text("agent:\n  name: mine\n")
    make(clone, "config.yaml")
    assert made.read_text() == "agent:\n  name: mine\n"
    assert "cp config.example.yaml" not in make(clone, "-n", "run")
