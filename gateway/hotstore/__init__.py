"""The hot path's store: one per engine, on the engine's database, closed with it.

``hot_store(engine)`` gives the same object for every store built on one
engine (``SessionStore``, ``PairingStore``, ``MemoryStore``), so a process has
one inline SQLite connection or one asyncpg pool beside SQLAlchemy's. Nothing
connects until the first statement. ``engine.dispose()`` closes it (the
gateway's stop, every test fixture that disposes its engine); the next use
reconnects, so a dispose that moves the engine into or out of a fault moves
this store with it.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.hotstore.base import HotStore

__all__ = ["HotStore", "hot_store"]

log = logging.getLogger(__name__)

# The cold path's busy timeout (gateway.db sets SQLite's to 30 s): a hot write waits as long.
SQLITE_BUSY_TIMEOUT_S = 30.0

_STORES: weakref.WeakKeyDictionary[Any, HotStore] = weakref.WeakKeyDictionary()


def hot_store(engine: AsyncEngine) -> HotStore:
    """The hot store on ``engine``'s database (made once per engine; no I/O here)."""
    sync = engine.sync_engine
    store = _STORES.get(sync)
    if store is None:
        store = _STORES[sync] = _make(engine)
        event.listen(sync, "engine_disposed", lambda _e: _close_in_dispose(store))
    return store


def _make(engine: AsyncEngine) -> HotStore:
    url = engine.url
    if url.get_backend_name() == "sqlite":
        from gateway.hotstore.sqlite import SQLiteHotStore

        if not url.database or url.database == ":memory:":
            raise ValueError("the hot store needs a SQLite file (an in-memory database is private to one connection)")
        # Weakly: the store is the value of a weak map keyed by this engine (``_STORES``), and a
        # value that holds its key keeps both for the life of the process.
        engine_ref = weakref.ref(engine.sync_engine)

        def on_connect(conn: Any) -> None:
            # The engine's own "connect" hooks, so this connection is set up like SQLAlchemy's
            # (gateway.db's pragmas, and whatever a test or an operator registers); not
            # SQLAlchemy's internal ones, which expect its driver's adapter.
            sync = engine_ref()
            if sync is None:
                raise RuntimeError("the hot store's engine is gone; make a new engine")
            for fn in sync.pool.dispatch.connect:
                if not getattr(fn, "__module__", "").startswith("sqlalchemy"):
                    fn(conn, None)

        return SQLiteHotStore(url.database, busy_timeout_s=SQLITE_BUSY_TIMEOUT_S, on_connect=on_connect)
    from gateway.hotstore.postgres import PostgresHotStore

    dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
    return PostgresHotStore(dsn)


def _close_in_dispose(store: HotStore) -> None:
    """Close ``store`` from inside ``AsyncEngine.dispose`` (a greenlet that may await)."""
    from gateway.hotstore.sqlite import SQLiteHotStore

    if isinstance(store, SQLiteHotStore):
        store.close_now()
        return
    from gateway.hotstore.postgres import PostgresHotStore

    assert isinstance(store, PostgresHotStore)
    from sqlalchemy.util import await_only

    try:
        await_only(store.close())
    except Exception as exc:  # a dispose outside AsyncEngine's greenlet cannot await: drop the connections
        log.debug("hot store: closing without awaiting (%s)", exc)
        store.terminate()
