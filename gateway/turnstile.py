"""A turnstile on the event loop: a burst of turns is spread over the loop's passes, with I/O between.

One pass of asyncio's loop polls the sockets, then runs every callback that was
ready by then, back to back. A turn's CPU comes in pieces, each from an await to
the next: from its message to the model's request, and from the model's answer to
the reply sent. When many pieces are ready at once, the pass runs them all before
any new socket is read. With a real model that is the usual case: its answers come
back as they were asked, so a stall of the loop (a collection, a burst of messages)
makes a clump of turns whose answers then arrive together, every model time again.
Measured with 200 sessions on a 500 ms model (``bench/model_load.py``), ``/healthz``
waited 20-45 ms behind such clumps, and so did a new message, a Discord heartbeat
or a Teams activity arriving meanwhile.

The turnstile stands where each piece begins (``await turnstile()``). A piece goes
through at once while the loop has been busy for less than ``budget_s`` since it
last polled its sockets, and nobody waits; otherwise it waits its turn, in arrival
order, and one waiting piece goes through per pass, each pass starting with a poll
of the sockets (which then does not wait while pieces do). A turn whose piece went
through in this pass and comes back in it (nothing it awaited suspended it: the
builtin model) goes on within the budget although others wait; past it, it waits
first in line. Nothing is added to a turn's work, a lone turn never waits, and no
pass of the loop is added when nothing waits.

The loop knows when it polled only if its selector says so: ``goclaw serve`` runs
its turns on a :class:`TurnLoop`. On any other loop (a test's, a thread's) the
turnstile lets every piece through.
"""

from __future__ import annotations

import asyncio
import selectors
import time
from collections import deque
from typing import Any

BUDGET_S = 0.005
"""The loop's time since it last polled its sockets after which the next piece of a turn waits for a later pass.

Under ``bench/model_load.py`` 2 ms measured a ``/healthz`` p99 of 6.4 ms against 21.5 without a
turnstile, but with the builtin model at 8 clients (a turn one piece of about a millisecond,
several ready in each pass) a piece in every turn waited, and 4% fewer turns a second were
answered; 5 ms measured 10.9 against 16.5 ms, and no fewer turns at 8 clients.
"""


class _Stats:
    """What every turnstile in this process did (``/metrics``: ``goclaw_turnstile_waits_total``)."""

    waited = 0  # pieces that waited for a later pass


STATS = _Stats()


class Turnstile:
    """One loop's turnstile (see the module's docstring); its :class:`TurnLoop` tells it of each poll."""

    def __init__(self, budget_s: float = BUDGET_S) -> None:
        self.budget_s = budget_s
        self._polled_at = time.perf_counter()
        self._passes = 0  # polls so far
        # The last piece through: its task, and the pass it went in. Only that task can come back
        # in the same pass (nothing else runs until it suspends, and a suspended task resumes later).
        self._went: tuple[asyncio.Task[Any] | None, int] | None = None
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> bool:
        """Whether a piece waits (the next poll then does not wait for the sockets)."""
        return bool(self._waiters)

    def polled(self) -> None:
        """The loop has just polled its sockets: a new pass begins, and the next waiting piece goes in it."""
        self._polled_at = time.perf_counter()
        self._passes += 1
        waiters = self._waiters
        while waiters:
            fut = waiters.popleft()
            if not fut.done():  # else cancelled while it waited
                # Its wake-up is ready before the callbacks of this poll's sockets: it runs first in this pass.
                fut.set_result(None)
                return

    async def __call__(self) -> None:
        """Go through now, or wait for a later pass of the loop."""
        went = (asyncio.current_task(), self._passes)
        again = self._went == went
        if time.perf_counter() - self._polled_at < self.budget_s and (again or not self._waiters):
            self._went = went
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if again:
            self._waiters.appendleft(fut)  # its turn went on past the budget: it is next
        else:
            self._waiters.append(fut)
        STATS.waited += 1
        try:
            await fut
        except asyncio.CancelledError:
            if not fut.done():
                self._waiters.remove(fut)
            raise
        self._went = (went[0], self._passes)


class _PollingSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """The platform's selector, telling a turnstile when it polled (and not waiting while pieces do)."""

    def __init__(self, turnstile: Turnstile) -> None:
        super().__init__()
        self._turnstile = turnstile

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        """Poll, as the platform's selector does; then a new pass begins."""
        turnstile = self._turnstile
        ready = super().select(0 if turnstile.waiting else timeout)
        turnstile.polled()
        return ready


class TurnLoop(asyncio.SelectorEventLoop):
    """An asyncio event loop (the platform's selector) with a :class:`Turnstile` for the turns it runs."""

    def __init__(self, budget_s: float = BUDGET_S) -> None:
        self.turnstile = Turnstile(budget_s)
        super().__init__(_PollingSelector(self.turnstile))


async def turnstile() -> None:
    """Where a piece of a turn begins: through the running loop's turnstile, if it has one."""
    gate: Turnstile | None = getattr(asyncio.get_running_loop(), "turnstile", None)
    if gate is not None:
        await gate()
