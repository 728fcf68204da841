"""aiohttp's TLS trust store, read on the second core while ``goclaw serve`` imports the rest of the gateway.

Importing aiohttp makes its two default client ``SSLContext`` objects, and each
reads the system's CA bundle (``set_default_verify_paths``: about 150 PEM
certificates parsed, 20-35 ms each on a 2-core machine, 8% of a restart to
``/healthz``). OpenSSL does that work with the GIL released, so it can run on a
thread beside the imports that follow (SQLAlchemy, pydantic, the gateway's own
modules), which take ten times as long. :func:`loaded_aside` records the
contexts an import asks to load and starts that thread; :func:`wait` joins it,
and ``goclaw serve`` calls it before it builds anything that could open a TLS
connection (the model provider, a channel). The contexts are aiohttp's own
objects, loaded in place: the same certificates, ``SSL_CERT_FILE`` and
``SSL_CERT_DIR`` honoured as before, read when the thread runs.

The gateway embedded in code (the tests) and every other command import aiohttp
as usual.
"""

from __future__ import annotations

import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_METHOD = "set_default_verify_paths"

_loader: threading.Thread | None = None
_failure: BaseException | None = None


@contextmanager
def loaded_aside() -> Iterator[None]:
    """Within: a context's ``set_default_verify_paths`` is recorded, not run; after: run on a thread.

    For a single-threaded import only (``gateway/__main__.py``'s, before any
    other thread runs): the method is replaced on :class:`ssl.SSLContext` while
    the block runs.
    """
    global _loader
    pending: list[ssl.SSLContext] = []
    own = ssl.SSLContext.__dict__.get(_METHOD)

    def record(ctx: ssl.SSLContext) -> None:
        pending.append(ctx)

    setattr(ssl.SSLContext, _METHOD, record)
    try:
        yield
    finally:
        if own is None:
            delattr(ssl.SSLContext, _METHOD)
        else:
            setattr(ssl.SSLContext, _METHOD, own)
    if pending:
        _loader = threading.Thread(target=_load, args=(pending,), name="goclaw-tls-trust", daemon=True)
        _loader.start()


def _load(contexts: list[ssl.SSLContext]) -> None:
    global _failure
    try:
        for ctx in contexts:
            ctx.set_default_verify_paths()
    except BaseException as exc:  # raised where the import would have raised it: in wait()
        _failure = exc


def wait() -> None:
    """Return once the contexts :func:`loaded_aside` recorded are loaded (at once when there were none).

    Raises:
        ssl.SSLError: the system's CA bundle could not be read, as importing aiohttp would have raised.
    """
    global _loader, _failure
    if _loader is not None:
        _loader.join()
        _loader = None
    if _failure is not None:
        failure, _failure = _failure, None
        raise failure
