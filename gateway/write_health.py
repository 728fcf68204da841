"""Storage faults: tell a write failure from bad input, answer 503, and say it once per burst.

A read-only database or a full disk is the operator's problem, not the
sender's: the request is answered 503 with ``Retry-After`` (the client retries
with the same message id, and nothing is acknowledged before it is stored),
``/readyz`` answers 503 until writes work again, and the log says so once when
the burst starts and once when it ends, never a traceback per request.
"""

from __future__ import annotations

import logging
import socket
import sqlite3
import time
from collections.abc import Callable
from datetime import UTC, datetime

from msgspec import Struct
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.db import dialect_insert
from gateway.errors import DatabaseUnavailable
from gateway.models import Heartbeat

log = logging.getLogger(__name__)

RETRY_AFTER_S = 5
STORAGE_MESSAGE = (
    "the gateway cannot store messages right now ({reason}); nothing was kept, "
    "send it again in a few seconds (with the same message_id)"
)
# PostgreSQL SQLSTATE classes that mean "the server cannot write now", not "your input is wrong":
# 25006 read-only transaction, 53 insufficient resources (disk full), 08 connection, 57P operator/shutdown,
# 58 system error (I/O), 40001/40P01 serialization/deadlock.
_PG_WRITE_STATES = ("25006", "53", "08", "57P", "58", "40001", "40P01", "HV")
_SQLITE_WRITE_WORDS = (
    "readonly database",
    "read-only",
    "disk is full",
    "disk i/o error",
    "unable to open database",
    "database is locked",
    "no space left",
)


def storage_reason(exc: BaseException) -> str | None:
    """A short reason when ``exc`` is the database refusing writes (not bad input), else None."""
    if isinstance(exc, DatabaseUnavailable):
        return str(exc)
    if isinstance(exc, OSError) and not isinstance(exc, ConnectionRefusedError | socket.gaierror):
        return f"{type(exc).__name__}: {exc.strerror or exc}"
    if isinstance(exc, ConnectionRefusedError):
        return "the database server refuses connections"
    if not isinstance(exc, DBAPIError):
        return _driver_reason(exc)
    orig = getattr(exc, "orig", None)
    state = str(getattr(orig, "sqlstate", "") or getattr(orig, "pgcode", "") or "")
    detail = (str(orig or exc).strip().splitlines() or [type(exc).__name__])[0]
    if state and state.startswith(_PG_WRITE_STATES):
        return detail
    if isinstance(exc, OperationalError | InterfaceError) and (
        not state or any(w in detail.lower() for w in _SQLITE_WRITE_WORDS)
    ):
        return detail
    if exc.connection_invalidated:
        return detail
    return None


def _driver_reason(exc: BaseException) -> str | None:
    """The same judgement for the raw drivers the hot path uses (``sqlite3``, ``asyncpg``)."""
    detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if isinstance(exc, sqlite3.Error):
        if isinstance(exc, sqlite3.OperationalError | sqlite3.InterfaceError) or any(
            w in detail.lower() for w in _SQLITE_WRITE_WORDS
        ):
            return detail
        return None
    if not type(exc).__module__.startswith("asyncpg"):
        return None
    state = str(getattr(exc, "sqlstate", "") or "")
    if state:
        return detail if state.startswith(_PG_WRITE_STATES) else None
    # No SQLSTATE and not bad input (asyncpg's DataError is a ValueError): the connection
    # itself failed (closed by the server, the pool closing, a broken protocol).
    return None if isinstance(exc, ValueError | TypeError) else detail


class _Burst(Struct):
    started: float
    reason: str
    count: int = 0


class WriteHealth:
    """Whether writes work: failures seen by requests plus a probe write, cached for ``ttl`` seconds.

    A full disk can still let a small in-place update through, so a failure a
    request saw counts until a request write succeeds again or ``hold``
    seconds pass without a new one (then the probe alone decides: recovery
    needs nobody's help).
    """

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        ttl: float = 1.0,
        hold: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        self.ttl = ttl
        self.hold = hold
        self.clock = clock  # monotonic seconds; tests pass their own
        self._probe_at: float | None = None
        self._probe_error: str | None = None
        self._last_failure: float | None = None
        self._burst: _Burst | None = None
        # One shared row: any process's write proves the database takes writes, and the table never grows.
        self._row_id = "probe"

    def failed(self, reason: str) -> None:
        """A write failed: log at the start of a burst only."""
        now = self.clock()
        self._last_failure = now
        if self._burst is None:
            self._burst = _Burst(now, reason)
            log.error(
                "storage: writes are failing (%s); answering 503 until they work again",
                reason,
            )
        self._burst.count += 1

    def succeeded(self) -> None:
        """A write worked: end a burst (logged once, with how many requests it refused)."""
        self._last_failure = None
        if self._burst is not None:
            burst, self._burst = self._burst, None
            log.warning(
                "storage: writes work again after %.0fs; %d requests were refused meanwhile",
                self.clock() - burst.started,
                burst.count,
            )

    async def probe(self) -> str | None:
        """None when a real write works now (cached ``ttl`` seconds), else the reason it does not."""
        now = self.clock()
        if self._probe_at is None or now - self._probe_at >= self.ttl:
            self._probe_at = now
            self._probe_error = await self._write()
            if self._probe_error is not None:
                self.failed(self._probe_error)
            elif self._last_failure is None or now - self._last_failure >= self.hold:
                self.succeeded()
        if self._probe_error is not None:
            return self._probe_error
        if self._last_failure is not None and now - self._last_failure < self.hold:
            return self._burst.reason if self._burst else "a recent write failed"
        return None

    async def _write(self) -> str | None:
        now = datetime.now(UTC)
        stmt = (
            dialect_insert(self.engine.dialect.name, Heartbeat)
            .values(id=self._row_id, at=now)
            .on_conflict_do_update(index_elements=["id"], set_={"at": now})
        )
        try:
            async with self.engine.begin() as conn:
                await conn.execute(stmt)
        except Exception as exc:
            # Readiness never answers 500: any failure to write is "not ready", with its reason.
            return storage_reason(exc) or (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return None
