"""A burst of turns is spread over the event loop's passes, its sockets read between them (issue 14, target 2).

A real model answers turns as they were asked, so answers that left together come
back together; without the turnstile the loop ran all of their turns' remaining
work in one pass before it read another socket (``/healthz``, a new message, a
channel's heartbeat). The loop's time is a clock moved by hand in most of these
tests (the turnstile reads ``time.perf_counter`` through its module), so what waits
does not depend on how busy the machine is.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import gateway.server
import gateway.turnstile as turnstile_module
from gateway.config import Config, load_config
from gateway.db import make_engine, upgrade
from gateway.metrics import Metrics
from gateway.sessions import SessionKey, SessionStore
from gateway.turn import TurnHandler, TurnRequest
from gateway.turnstile import STATS, TurnLoop, turnstile
from pairing.principal import Principal, Role
from tests.conftest import Clock
from tests.gateway.scripted import ScriptedProvider
from tests.gateway.test_model_limit import GatedModel

ALICE = Principal.human("u_alice", Role.USER, "Alice")


@pytest.fixture
def now(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The loop's time as the turnstile reads it, moved by hand (``now[0] += seconds``)."""
    clock = [1000.0]
    monkeypatch.setattr(turnstile_module, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    return clock


def run_on_turn_loop(main: Callable[[], Awaitable[Any]], budget_s: float = turnstile_module.BUDGET_S) -> Any:
    """``main()`` on a :class:`TurnLoop`, as ``goclaw serve`` runs its turns."""
    with asyncio.Runner(loop_factory=lambda: TurnLoop(budget_s)) as runner:
        return runner.run(main())


class _Socket:
    """A socket the loop watches, logging when its data was read among the rest."""

    def __init__(self, log: list[str]) -> None:
        self._r, self._w = socket.socketpair()
        self._r.setblocking(False)
        self._log = log
        asyncio.get_running_loop().add_reader(self._r, self._read)

    def send(self) -> None:
        self._w.send(b"x")

    def _read(self) -> None:
        self._r.recv(16)
        self._log.append("socket read")

    def close(self) -> None:
        asyncio.get_running_loop().remove_reader(self._r)
        self._r.close()
        self._w.close()


async def _burst(pieces: int, log: list[str], work: Callable[[], None]) -> None:
    """``pieces`` pieces of turns made ready in one pass, each doing ``work``; a socket's data arrives meanwhile."""
    start = asyncio.Event()

    async def piece(i: int) -> None:
        await start.wait()
        await turnstile()
        work()
        log.append(f"piece {i}")

    sock = _Socket(log)
    tasks = [asyncio.create_task(piece(i)) for i in range(pieces)]
    await asyncio.sleep(0)  # every piece waits on the event
    start.set()  # all made ready in this pass: they run in the next one
    sock.send()  # readable at the next poll, which comes before them
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)
    await asyncio.sleep(0.01)
    sock.close()


def test_on_a_plain_loop_a_burst_runs_whole_before_the_socket_is_read(now: list[float]) -> None:
    # What the turnstile is for, and what a loop without one does: every piece, then the socket.
    log: list[str] = []

    def work() -> None:
        now[0] += 0.001

    asyncio.run(_burst(10, log, work))
    assert log.index("socket read") == 10


def test_a_burst_lets_the_socket_be_read_once_the_budget_is_spent(now: list[float]) -> None:
    log: list[str] = []
    waited = STATS.waited

    def work() -> None:
        now[0] += 0.0015  # a piece of 1.5 ms

    run_on_turn_loop(lambda: _burst(10, log, work), budget_s=0.002)
    # The second piece starts 1.5 ms into the 2 ms budget and spends it; the rest wait, one a
    # pass, the socket read first.
    assert log == ["piece 0", "piece 1", "socket read", *(f"piece {i}" for i in range(2, 10))]
    assert STATS.waited - waited == 8


def test_pieces_that_come_one_at_a_time_never_wait(now: list[float]) -> None:
    async def main() -> None:
        for _ in range(20):
            await turnstile()
            now[0] += 0.01  # longer than the budget: what counts is the time since the loop's last poll
            await asyncio.sleep(0)  # the next pass

    waited = STATS.waited
    run_on_turn_loop(main)
    assert STATS.waited == waited


def test_a_turn_goes_on_in_its_own_pass_within_the_budget_and_is_next_past_it(now: list[float]) -> None:
    # The builtin model answers without suspending: a turn's second piece comes in the pass
    # its first went through in.
    log: list[str] = []

    async def main() -> None:
        start = asyncio.Event()

        async def turn(name: str, first_s: float) -> None:
            await start.wait()
            await turnstile()
            now[0] += first_s
            log.append(f"{name} first")
            await turnstile()  # nothing awaited in between: the same pass
            now[0] += 0.0001
            log.append(f"{name} second")

        tasks = [asyncio.create_task(turn(n, s)) for n, s in (("a", 0.003), ("b", 0.001), ("c", 0.001))]
        await asyncio.sleep(0)
        start.set()
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)

    waited = STATS.waited
    run_on_turn_loop(main, budget_s=0.002)
    # a's first piece took 3 ms of a 2 ms budget: its second waited, first in line, and b and c
    # behind it; b's second piece came in the pass b was let through in, so it went on
    # although c was waiting (and likewise c's).
    assert log == ["a first", "a second", "b first", "b second", "c first", "c second"]
    assert STATS.waited - waited == 3


def test_a_piece_cancelled_while_it_waits_leaves_the_others_their_turn(now: list[float]) -> None:
    done: list[int] = []

    async def main() -> None:
        hold = asyncio.Event()

        async def piece(i: int) -> None:
            await hold.wait()
            await turnstile()
            now[0] += 0.003
            done.append(i)

        tasks = [asyncio.create_task(piece(i)) for i in range(4)]
        await asyncio.sleep(0)
        hold.set()
        await asyncio.sleep(0)  # the first goes through and spends the budget; the other three wait
        assert done == [0]
        tasks[1].cancel()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=30)
        assert tasks[1].cancelled()

    run_on_turn_loop(main, budget_s=0.002)
    assert done == [0, 2, 3]


def test_turns_answered_together_let_the_loop_read_a_socket_between_them(tmp_path: Path, clock: Clock) -> None:
    # SQLite: a turn's store runs inline on the loop, so nothing else splits the burst
    # (on PostgreSQL each statement is an await of its own). A budget of 0: one piece a
    # pass once others wait, however quick or busy the machine is.
    log: list[str] = []
    n = 20

    async def main() -> list[str | None]:
        engine = make_engine(f"sqlite+aiosqlite:///{tmp_path / 'goclaw.db'}")
        await upgrade(engine)
        try:
            model = GatedModel()
            sessions = SessionStore(engine, clock=clock)
            turns = TurnHandler(config=Config(), sessions=sessions, provider=ScriptedProvider(model), clock=clock)
            store = sessions.store_message

            async def counted(*args: Any, **kwargs: Any) -> Any:
                row = await store(*args, **kwargs)
                log.append("reply stored")
                return row

            sessions.store_message = counted  # type: ignore[method-assign]
            tasks = [
                asyncio.create_task(
                    turns.handle(
                        TurnRequest(
                            key=SessionKey("api", f"room-{i}"),
                            principal=ALICE,
                            text=f"hello from room {i}",
                            message_id=f"m-{i}",
                            said_at=clock.now,
                        )
                    )
                )
                for i in range(n)
            ]
            for _ in range(600):
                if model.inside == n:
                    break
                await asyncio.sleep(0.01)
            assert model.inside == n
            sock = _Socket(log)
            model.release.set()  # every answer at once, as a real model's come back
            sock.send()
            results = await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)
            sock.close()
            return [r.reply for r in results]
        finally:
            await engine.dispose()

    waited = STATS.waited
    replies = run_on_turn_loop(main, budget_s=0.0)
    assert replies == ["done"] * n
    assert log.count("reply stored") == n
    # The socket was read before the burst's replies were stored (on a loop without the turnstile: after all 20).
    assert log.index("socket read") <= 1, log
    assert STATS.waited - waited >= 2 * n  # each turn's two pieces
    text = Metrics().render().decode()
    assert f"goclaw_turnstile_waits_total {float(STATS.waited)}" in text


def test_goclaw_serve_runs_its_turns_on_a_turn_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[asyncio.AbstractEventLoop] = []

    async def serve_forever(cfg: Config, **_kwargs: Any) -> None:
        seen.append(asyncio.get_running_loop())

    monkeypatch.setattr(gateway.server, "serve_forever", serve_forever)
    (tmp_path / "config.yaml").write_text(f"database: {{url: 'sqlite+aiosqlite:///{tmp_path}/g.db'}}\n")
    monkeypatch.setattr(gateway.server, "load", lambda _path: load_config(tmp_path / "config.yaml", env={}))
    gateway.server.serve_command(None)
    (loop,) = seen
    assert isinstance(loop, TurnLoop)
