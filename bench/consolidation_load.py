"""Turns during a consolidation run: a real ``goclaw serve`` on SQLite, its turns' latency before and during the run.

The nightly consolidation clusters every current agent note (a first run over
65,536 notes took 30-37 s of CPU in this script's runs of 2026-12-06, about 15 s since
``685a194``, whose related-note lookups leave out words in every note). Wherever ``goclaw serve`` runs
it (a worker thread of the serving process, which holds the GIL the turns'
event loop needs, or the child job process, ``gateway/jobproc.py``), this is
what a person chatting notices: how much slower the turns are while it runs.

For each tree (this one, then ``--baseline-source DIR``'s; with ``--runs N``
the order alternates from run to run), on a fresh temporary directory and
SQLite database:

1. seed the database with that tree's own code (its migrations, its models):
   this script runs again as a child with ``GOCLAW_BENCH_SOURCE`` pointing at
   the tree, migrates and adds the bench user and ``--seed-messages`` past
   messages as ``bench/turn_overhead.py`` does, then ``--notes`` live agent
   notes, ``--dup-rate`` of them repeats, with ``bench/consolidation.py``'s fill;
2. start ``goclaw serve`` from the tree (builtin model, ``worker.mode: inline``,
   logging at INFO, its stderr captured; ``memory.auto_distill: false`` where
   the tree has the key) with ``memory.consolidation_time`` the first UTC minute
   at least ``LEAD_S`` away, so the nightly run starts at a known wall time T0
   at least 20 s after ``/healthz`` answers;
3. warm up (100 turns), then from ``QUIET_S`` (15 s) before T0 drive turns
   through ``POST /v1/chat`` with ``--clients`` clients over 50 sessions,
   recording each turn's start (wall time) and latency (``--text``: the
   message, by default one that shares no word with the notes, see
   ``QUIET_TEXT``), until the line ``consolidation (nightly):``
   (logged when the run ends; with a ``[job process]`` prefix if the job process
   ran it) is in serve's stderr, plus 2 s; past ``--timeout`` s after T0 without
   it, give up with an error.

Per tree it prints the quiet window [T0 - 15 s, T0) and the consolidation
window [T0, the line): length, turns (by their start), turns/s, p50, p99 and
max latency, and the CPU seconds used in the window by serve's own process (all
its threads; in brackets its event loop's thread) and by its child processes
(the job process), from ``/proc`` (``cpu_seconds`` of ``bench/turn_overhead.py``).
At the end, each tree's consolidation window p50 and p99 over its quiet
window's (medians of the runs' ratios with ``--runs`` above 1).

    .venv/bin/python bench/consolidation_load.py [--notes 65536] [--dup-rate 0.01] [--clients 1]
        [--runs 1] [--timeout 180] [--text "produce the daily report number {i}"] [--baseline-source DIR]
    .venv/bin/python bench/consolidation_load.py --notes 2000      # a quick smoke run, this tree only

A tree takes about 2 to 2.5 minutes at the default 65,536 notes on the project's
2-core machine (2026-12-06): the seed 26-30 s, serve's start and the wait for T0
(the first minute boundary 30 s after the seed, so 30-90 s), then the run
itself (36-42 s with one client) and 2 s; under a minute with ``--notes 2000``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from turn_overhead import ROOT, TOKEN, Gateway, cpu_seconds, gateway_waits, pct, wait_up

END_MARK = "consolidation (nightly):"
"""Logged by ``gateway.scheduler`` when the nightly run ends (``log.info("consolidation (%s): %s", ...)``)."""
FAIL_MARKS = ("nightly consolidation failed", "consolidation (nightly) skipped")
QUIET_S = 15.0
"""The quiet window: turns from this long before T0 until T0."""
LEAD_S = 30.0
"""T0 is the first minute boundary at least this long after the config is written (serve starts within it)."""
MIN_AFTER_UP_S = 20.0
"""T0 must be at least this long after ``/healthz`` answers."""
AFTER_END_S = 2.0
WARMUP_TURNS = 100
QUIET_TEXT = "how is the weather looking this afternoon, question q{i}"
"""The turns' message: none of its words is in a seeded note, so no turn's prompt matches one (a chat's usual case).

With ``bench/turn_overhead.py``'s "produce the daily report number {i}" each turn's prompt matched a twentieth of
the notes on "report" (3,230 of 65,536) and the notes' numbers, and a turn took 70-75 ms of the event loop's CPU
before any consolidation (2026-12-06): the turns' own cost hid the run's.
"""
SESSIONS = 50


@dataclass
class Cpu:
    """CPU seconds so far of serve's own process (all threads), its event loop's thread, and its children."""

    own: float
    loop: float
    children: float

    @classmethod
    def read(cls, pid: int) -> Cpu:
        tick = os.sysconf("SC_CLK_TCK")
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        own = (int(fields[11]) + int(fields[12])) / tick  # utime, stime: not the reaped children's
        return cls(own, cpu_seconds(pid, thread=pid), cpu_seconds(pid) - own)

    def __sub__(self, other: Cpu) -> Cpu:
        return Cpu(self.own - other.own, self.loop - other.loop, self.children - other.children)


@dataclass
class Window:
    """The turns that started in a window, and the CPU serve used in it."""

    seconds: float
    latencies: list[float]
    cpu: Cpu
    waits: tuple[float, float, float]
    """The turns' writes that waited for SQLite's write lock in the window: (writes, busy tries, seconds)."""

    @property
    def turns_per_s(self) -> float:
        return len(self.latencies) / self.seconds

    def p(self, q: float) -> float:
        return pct(self.latencies, q) if self.latencies else float("nan")


@dataclass
class Result:
    tree: str
    run: int
    quiet: Window
    consolidation: Window
    end_line: str
    seed_s: float


@dataclass
class StderrWatch:
    """Reads serve's stderr on a thread (so the pipe never fills), copies it to a file and watches for the end line."""

    pid: int
    pipe: IO[str]
    copy: Path
    loop: asyncio.AbstractEventLoop
    lines: list[str] = field(default_factory=list)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    end: tuple[float, str, Cpu] | None = None
    failure: str | None = None

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._read, name="serve-stderr", daemon=True)
        thread.start()
        return thread

    def _read(self) -> None:
        with self.copy.open("w") as out:
            for line in self.pipe:
                at = time.time()
                out.write(line)
                self.lines.append(line.rstrip("\n"))
                if self.end is None and END_MARK in line:
                    # The window ends here: its CPU is read now, not when the event loop gets to it.
                    self.end = (at, line.rstrip("\n"), Cpu.read(self.pid))
                    self.loop.call_soon_threadsafe(self.ended.set)
                elif self.failure is None and any(mark in line for mark in FAIL_MARKS):
                    self.failure = line.rstrip("\n")
                    self.loop.call_soon_threadsafe(self.ended.set)

    def tail(self, n: int = 20) -> str:
        return "\n".join(self.lines[-n:])


class ConsolidatingGateway(Gateway):
    """``goclaw serve`` from a tree on a fresh SQLite database with ``notes`` agent notes, consolidating at T0."""

    def __init__(self, name: str, source: Path, tmp: Path) -> None:
        super().__init__(name, source, f"sqlite+aiosqlite:///{tmp / 'bench.db'}", tmp)
        self.watch: StderrWatch | None = None
        self.reader: threading.Thread | None = None

    async def seed_notes(self, notes: int, dup_rate: float, messages: int, seed: int) -> tuple[str, int]:
        """Seed with the tree's own code (a child process); return (the bench user's id, repeats)."""
        cmd = [sys.executable, __file__, "--seed-into", self.db_url, "--notes", str(notes)]
        cmd += ["--dup-rate", str(dup_rate), "--seed-messages", str(messages), "--seed", str(seed)]
        env = {**os.environ, "GOCLAW_BENCH_SOURCE": str(self.source)}
        done = await asyncio.to_thread(subprocess.run, cmd, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{self.name}: seeding failed:\n{done.stderr[-3000:]}")
        out = json.loads(done.stdout.strip().splitlines()[-1])
        return out["user"], out["repeats"]

    async def start_at(self, user_id: str, t0: datetime) -> None:
        """Start serve with its nightly consolidation at ``t0`` (a UTC minute), logging at INFO to a pipe."""
        memory: dict[str, object] = {"consolidation_time": f"{t0:%H:%M}"}
        if "auto_distill" in (self.source / "gateway" / "config.py").read_text():
            memory["auto_distill"] = False  # no automatic run 5 minutes after start
        cfg = self.tmp / "config.yaml"
        cfg.write_text(
            json.dumps(
                {
                    "database": {"url": self.db_url},
                    "server": {"port": self.port, "api_users": [{"token": TOKEN, "user": user_id}]},
                    "memory": memory,
                    "logging": {"level": "INFO"},  # the end line is INFO
                    "worker": {"mode": "inline"},
                }
            )
        )
        env = {**os.environ, "NO_PROXY": "127.0.0.1", "PYTHONPATH": str(self.source)}
        cmd = [sys.executable, "-m", "gateway", "serve", "--config", str(cfg)]
        # stdout has only the dashboard's login link; the logs are on stderr.
        self.proc = subprocess.Popen(
            cmd, cwd=self.tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        assert self.proc.stderr is not None
        self.watch = StderrWatch(self.proc.pid, self.proc.stderr, self.tmp / "serve.log", asyncio.get_running_loop())
        self.reader = self.watch.start()
        try:
            await wait_up(f"http://127.0.0.1:{self.port}/healthz", timeout=120)
        except RuntimeError:
            raise RuntimeError(f"{self.name}: serve did not answer /healthz:\n{self.watch.tail()}") from None

    def stop(self) -> None:
        super().stop()
        if self.reader is not None:
            self.reader.join(10)


def next_minute(after: datetime) -> datetime:
    """The first whole UTC minute at or after ``after``."""
    floor = after.replace(second=0, microsecond=0)
    return floor if floor == after else floor + timedelta(minutes=1)


async def sleep_until(wall: float) -> None:
    await asyncio.sleep(max(0.0, wall - time.time()))


async def drive(
    url: str, clients: int, text: str, stop: asyncio.Event, limit: int = 10**9
) -> list[tuple[float, float]]:
    """Turns with ``clients`` in flight until ``stop`` (or ``limit`` turns): (start, wall time s; latency ms) each."""
    turns: list[tuple[float, float]] = []
    counter = iter(range(limit))
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as http:

        async def client(c: int) -> None:
            for i in counter:
                if stop.is_set():
                    return
                body = {"session": f"bench-{(c * 7 + i) % SESSIONS}", "text": text.format(i=i)}
                started, t = time.time(), time.perf_counter()
                async with http.post(url, json=body) as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"{url}: HTTP {r.status}")
                turns.append((started, (time.perf_counter() - t) * 1000))

        await asyncio.gather(*(client(c) for c in range(clients)))
    return turns


async def measure(name: str, source: Path, run: int, tmp: Path, args: argparse.Namespace) -> Result:
    """One tree's run: seed, serve, drive turns across T0 until the run's end line; its two windows."""
    g = ConsolidatingGateway(name, source, tmp)
    t = time.monotonic()
    user_id, repeats = await g.seed_notes(args.notes, args.dup_rate, args.seed_messages, args.seed)
    seed_s = time.monotonic() - t
    print(f"{name} (run {run}): seeded {args.notes} notes ({repeats} repeats) in {seed_s:.1f} s", flush=True)
    t0 = next_minute(datetime.now(UTC) + timedelta(seconds=LEAD_S))
    try:
        await g.start_at(user_id, t0)
        assert g.proc is not None and g.watch is not None
        t0_wall = t0.timestamp()
        up_by = t0_wall - time.time()
        if up_by < MIN_AFTER_UP_S:
            raise RuntimeError(f"{name}: serve answered /healthz only {up_by:.1f} s before T0 {t0:%H:%M}")
        print(f"{name} (run {run}): serve up, T0 {t0:%H:%M:%S} UTC in {up_by:.1f} s", flush=True)
        await drive(g.url, args.clients, args.text, asyncio.Event(), WARMUP_TURNS)
        await sleep_until(t0_wall - QUIET_S)

        pid, stop = g.proc.pid, asyncio.Event()
        quiet_start, cpu_start, waits_start = time.time(), Cpu.read(pid), await gateway_waits(g.port)
        cpu_at_t0: list[Cpu] = []
        waits_at: list[tuple[float, float, float, float]] = []

        async def at_t0() -> None:
            await sleep_until(t0_wall)
            cpu_at_t0.append(Cpu.read(pid))
            waits_at.append(await gateway_waits(g.port))

        driving = asyncio.create_task(drive(g.url, args.clients, args.text, stop))
        sampling = asyncio.create_task(at_t0())
        ended = asyncio.create_task(g.watch.ended.wait())
        try:
            # Until the end line (or a failure line), a failed turn, or the timeout.
            timeout = t0_wall + args.timeout - time.time()
            await asyncio.wait({driving, ended}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if ended.done():
                waits_at.append(await gateway_waits(g.port))  # a turn or two past the end line: its window's
                await asyncio.sleep(AFTER_END_S)
        finally:
            stop.set()
            ended.cancel()
            sampling.cancel()  # a no-op once T0 has passed, as it has unless a turn failed before it
            turns = await driving  # raises a failed turn's error
        if not g.watch.ended.is_set():
            raise RuntimeError(
                f"{name}: no {END_MARK!r} line in serve's stderr within {args.timeout:g} s of T0 {t0:%H:%M} UTC; "
                f"its last lines:\n{g.watch.tail()}"
            )
        if g.watch.failure:
            raise RuntimeError(f"{name}: the nightly consolidation did not run: {g.watch.failure}")
        assert g.watch.end is not None
        end_wall, end_line, cpu_end = g.watch.end
    finally:
        g.stop()

    quiet = Window(
        t0_wall - quiet_start,
        [ms for at, ms in turns if quiet_start <= at < t0_wall],
        cpu_at_t0[0] - cpu_start,
        _less(waits_at[0], waits_start),
    )
    busy = Window(
        end_wall - t0_wall,
        [ms for at, ms in turns if t0_wall <= at < end_wall],
        cpu_end - cpu_at_t0[0],
        _less(waits_at[1], waits_at[0]),
    )
    return Result(name, run, quiet, busy, end_line, seed_s)


def _less(a: tuple[float, ...], b: tuple[float, ...]) -> tuple[float, float, float]:
    return (a[0] - b[0], a[1] - b[1], a[2] - b[2])


def table(results: list[Result]) -> str:
    head = (
        f"{'tree':8} {'run':>3} {'window':13} {'secs':>6} {'turns':>6} {'turns/s':>8} {'p50 ms':>7} {'p99 ms':>8}"
        f" {'max ms':>8}  {'CPU s: serve (loop)':>19} {'children':>8}  {'lock waits':>10} {'ms waited':>9}"
    )
    rows = [head, "-" * len(head)]
    for r in results:
        for label, w in (("quiet", r.quiet), ("consolidation", r.consolidation)):
            rows.append(
                f"{r.tree:8} {r.run:>3} {label:13} {w.seconds:6.1f} {len(w.latencies):6d} {w.turns_per_s:8.1f}"
                f" {w.p(0.5):7.2f} {w.p(0.99):8.2f} {max(w.latencies, default=float('nan')):8.2f}"
                f"  {w.cpu.own:11.2f} ({w.cpu.loop:5.2f}) {w.cpu.children:8.2f}"
                f"  {w.waits[0]:10.0f} {w.waits[2] * 1000:9.1f}"
            )
    return "\n".join(rows)


async def seed_into(db_url: str, notes: int, dup_rate: float, messages: int, seed: int) -> None:
    """The child: seed one database with the tree ``GOCLAW_BENCH_SOURCE`` names (on sys.path via turn_overhead)."""
    from consolidation import fill  # the tree's memory and gateway (it too honours GOCLAW_BENCH_SOURCE)
    from turn_overhead import seed as seed_messages

    from gateway.db import make_engine

    user_id = await seed_messages(db_url, messages)  # the tree's migrations, the bench user, past conversations
    engine = make_engine(db_url)
    repeats = await fill(engine, notes, dup_rate, random.Random(seed))
    await engine.dispose()
    print(json.dumps({"user": user_id, "repeats": repeats}))


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--notes", type=int, default=65_536, help="live agent notes seeded")
    ap.add_argument("--dup-rate", type=float, default=0.01, help="the share of them that repeat another")
    ap.add_argument("--clients", type=int, default=1, help="turns in flight")
    ap.add_argument("--runs", type=int, default=1, help="runs per tree, the order alternating")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds after T0 to wait for the run's end line")
    ap.add_argument(
        "--text",
        default=QUIET_TEXT,
        help="each turn's message ({i}: the turn's number); bench/turn_overhead.py's matches a twentieth of the notes",
    )
    ap.add_argument("--seed-messages", type=int, default=2000, help="past messages seeded (200 conversations)")
    ap.add_argument("--seed", type=int, default=7, help="the notes' random seed")
    ap.add_argument("--baseline-source", type=Path, default=None, help="also run a gateway from this tree")
    ap.add_argument("--seed-into", default=None, help=argparse.SUPPRESS)  # the child that seeds one database
    args = ap.parse_args()
    if args.seed_into:
        await seed_into(args.seed_into, args.notes, args.dup_rate, args.seed_messages, args.seed)
        return

    trees = [("this", ROOT)] + ([("baseline", args.baseline_source.resolve())] if args.baseline_source else [])
    results: list[Result] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmpdir:
        for run in range(1, args.runs + 1):
            for name, source in trees if run % 2 else trees[::-1]:
                tmp = Path(tmpdir) / f"{name}-{run}"
                tmp.mkdir()
                t = time.monotonic()
                results.append(r := await measure(name, source, run, tmp, args))
                where = "the job process" if "[job process]" in r.end_line else "serve's own process"
                print(
                    f"{name} (run {run}): {time.monotonic() - t:.0f} s; the run ended in {where}: "
                    f"{r.end_line.split(END_MARK, 1)[1].strip()}",
                    flush=True,
                )

    print(
        f"\n{args.notes} notes ({args.dup_rate:.0%} repeats), {args.clients} client(s), SQLite, "
        f"quiet window {QUIET_S:.0f} s before T0, consolidation window from T0 to the end line; "
        f"{time.monotonic() - started:.0f} s in all"
    )
    print(table(results))
    print()
    for name, _ in trees:
        mine = [r for r in results if r.tree == name]
        p50 = statistics.median(r.consolidation.p(0.5) / r.quiet.p(0.5) for r in mine)
        p99 = statistics.median(r.consolidation.p(0.99) / r.quiet.p(0.99) for r in mine)
        secs = statistics.median(r.consolidation.seconds for r in mine)
        of = f" (medians of {len(mine)} runs)" if len(mine) > 1 else ""
        print(f"{name:8} consolidation/quiet: p50 {p50:.2f}x, p99 {p99:.2f}x; the run {secs:.1f} s{of}")


if __name__ == "__main__":
    asyncio.run(main())
