"""Another tree in the same run: a measurement in a child process per tree, alternating, medians.

A script that compares this tree with ``--baseline-source DIR`` runs itself again as a child
with ``GOCLAW_BENCH_SOURCE`` naming the tree whose code it measures (the script puts that
path first on ``sys.path``); the child prints its figures as one JSON object on its last
line. The trees take turns going first, run after run, and each figure's median is kept.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

Figures = dict[str, float]


def run_child(script: str, source: Path, args: list[str]) -> Figures:
    """``script args`` in a process of its own on ``source``'s code; its last line of output, parsed."""
    env = {**os.environ, "GOCLAW_BENCH_SOURCE": str(source)}
    out = subprocess.run([sys.executable, script, *args], env=env, check=True, stdout=subprocess.PIPE, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])  # the child's errors go to our stderr as they come


async def alternate(
    trees: dict[str, Path],
    runs: int,
    measure: Callable[[str, Path, int], Awaitable[Figures]],
    show: Callable[[Figures], str],
) -> dict[str, Figures]:
    """``measure(name, tree, run)`` for each tree, ``runs`` times, the order alternating; each figure's median."""
    results: dict[str, list[Figures]] = {name: [] for name in trees}
    for run in range(runs):
        order = list(trees) if run % 2 == 0 else list(reversed(trees))
        for name in order:
            got = await measure(name, trees[name], run)
            results[name].append(got)
            print(f"run {run + 1}: {name:8} {show(got)}")
    return {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in results.items()}
