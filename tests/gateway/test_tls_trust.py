"""aiohttp's CA bundle, read on a thread while ``goclaw serve`` imports (``gateway/tls_trust.py``), still verifies.

The unit tests run ``gateway.tls_trust`` in a fresh interpreter each: the module
patches ``ssl.SSLContext`` while its block runs and keeps the pending load in
module state. They check that a context made inside ``loaded_aside()`` is
recorded, not loaded, and after ``wait()`` holds the same CA certificates as one
made normally (aiohttp's own two contexts among them); that ``SSL_CERT_FILE`` is
honoured; that a failed load is raised by ``wait()``; and that ``wait()`` with
nothing pending has no thread to join.

The end-to-end test runs ``goclaw serve`` as a real process whose model is the
OpenAI-compatible peer behind HTTPS on 127.0.0.1, its certificate issued by a
throwaway CA (trustme). With that CA in ``SSL_CERT_FILE`` a chat turn gets the
peer's reply; without it the turn fails with the gateway's "model unavailable"
answer and the peer never sees a request: verification is on.

No timing assertions: each limit only stops a hung process.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme
from aiohttp import web

from gateway.db import make_engine, upgrade
from pairing import PairingStore
from tests.gateway.test_serve import free_port
from tests.peers.fake_openai import FakeOpenAI

ROOT = Path(__file__).resolve().parents[2]
LIMIT_S = 90  # only stops a hang; a loaded 2-core machine needs far less
TOKEN = "tls-trust-test-token-0123456789"
REPLY = "Verified hello from the HTTPS model."
CERT_ENV = ("SSL_CERT_FILE", "SSL_CERT_DIR")


def run_isolated(code: str, env: dict[str, str] | None = None) -> str:
    """Run ``code`` in a fresh interpreter (the repository importable); its stdout, once it ran to the end."""
    base = {k: v for k, v in os.environ.items() if k not in CERT_ENV} if env is not None else dict(os.environ)
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code) + '\nprint("done")\n'],
        cwd=ROOT,
        env={**base, **(env or {}), "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.endswith("done\n"), result.stdout
    return result.stdout


@pytest.fixture
def ca_pem(tmp_path: Path) -> tuple[trustme.CA, Path]:
    """A throwaway CA and its certificate as a PEM file."""
    ca = trustme.CA()
    path = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return ca, path


# ---- the module, in a fresh interpreter each ------------------------------------------------


def test_contexts_made_aside_are_loaded_by_wait_like_normal_ones() -> None:
    out = run_isolated(
        """
        import _ssl
        import ssl
        import sys

        from gateway import tls_trust

        assert "aiohttp" not in sys.modules
        normal = ssl.create_default_context().cert_store_stats()["x509_ca"]
        with tls_trust.loaded_aside():
            assert "set_default_verify_paths" in ssl.SSLContext.__dict__  # replaced while the block runs
            aside = ssl.create_default_context()
            # Recorded, not loaded: the thread starts only once the block ends.
            assert aside.cert_store_stats()["x509_ca"] == 0
            import aiohttp.connector
        assert "set_default_verify_paths" not in ssl.SSLContext.__dict__
        assert ssl.SSLContext.set_default_verify_paths is _ssl._SSLContext.set_default_verify_paths
        tls_trust.wait()
        assert aside.cert_store_stats()["x509_ca"] == normal, (aside.cert_store_stats(), normal)
        for ctx in (aiohttp.connector._SSL_CONTEXT_VERIFIED, aiohttp.connector._SSL_CONTEXT_UNVERIFIED):
            assert ctx.cert_store_stats()["x509_ca"] == normal, (ctx.cert_store_stats(), normal)
        assert aiohttp.connector._SSL_CONTEXT_VERIFIED.verify_mode == ssl.CERT_REQUIRED
        # A context made after the block loads at once, as always.
        assert ssl.create_default_context().cert_store_stats()["x509_ca"] == normal
        print(normal)
        """
    )
    normal = int(out.split()[0])
    assert normal > 0, "this machine's default CA bundle is empty: the comparison above proved nothing"


def test_ssl_cert_file_is_honoured_by_the_load_aside(ca_pem: tuple[trustme.CA, Path]) -> None:
    _ca, path = ca_pem
    run_isolated(
        """
        import os
        import ssl

        from gateway import tls_trust

        with tls_trust.loaded_aside():
            aside = ssl.create_default_context()
        tls_trust.wait()
        assert aside.cert_store_stats()["x509_ca"] == 1, aside.cert_store_stats()
        with open(os.environ["SSL_CERT_FILE"]) as f:
            der = ssl.PEM_cert_to_DER_cert(f.read())
        assert aside.get_ca_certs(binary_form=True) == [der]
        """,
        env={"SSL_CERT_FILE": str(path)},
    )


def test_a_failed_load_is_raised_by_wait_once(ca_pem: tuple[trustme.CA, Path]) -> None:
    # OpenSSL ignores an SSL_CERT_FILE it cannot read or parse (set_default_verify_paths succeeds
    # with no certificates), so the failure is made by the recorded context's own method: the thread
    # calls ctx.set_default_verify_paths(), which here raises as a failing OpenSSL call would.
    _ca, path = ca_pem
    run_isolated(
        """
        import ssl

        from gateway import tls_trust

        def refuse() -> None:
            raise ssl.SSLError("cannot read the CA bundle")

        with tls_trust.loaded_aside():
            first = ssl.create_default_context()
            failing = ssl.create_default_context()
            failing.set_default_verify_paths = refuse  # set before the thread starts (at the block's end)
        try:
            tls_trust.wait()
        except ssl.SSLError as exc:
            assert "cannot read the CA bundle" in str(exc), exc
        else:
            raise AssertionError("wait() returned although the load failed")
        assert first.cert_store_stats()["x509_ca"] == 1  # loaded, in order, before the one that failed
        tls_trust.wait()  # raised once; nothing pending now
        """,
        env={"SSL_CERT_FILE": str(path)},
    )


def test_wait_with_nothing_pending_returns() -> None:
    run_isolated(
        """
        import threading

        from gateway import tls_trust

        tls_trust.wait()  # nothing recorded yet
        with tls_trust.loaded_aside():
            pass  # no context made: no thread started
        assert tls_trust._loader is None
        assert threading.active_count() == 1, threading.enumerate()
        tls_trust.wait()
        """
    )


# ---- goclaw serve, its model behind HTTPS ---------------------------------------------------


class HttpsOpenAI(FakeOpenAI):
    """The scripted OpenAI-compatible peer, listening with TLS (``base_url`` is https)."""

    def __init__(self, ssl_context: ssl.SSLContext) -> None:
        """The peer; ``ssl_context`` holds its certificate."""
        super().__init__()
        self._ssl_context = ssl_context

    async def start(self) -> None:
        """Listen on 127.0.0.1 with TLS, on a port the OS picks."""
        app = web.Application()
        app.router.add_post(self.PATH, self._endpoint())
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self._ssl_context).start()
        self.port = int(self._runner.addresses[0][1])

    @property
    def base_url(self) -> str:
        """What the gateway's config gives as ``llm.base_url``."""
        return f"https://127.0.0.1:{self.port}/v1"


async def _seed(url: str) -> str:
    """A migrated database with one user; that user's id."""
    engine = make_engine(url)
    try:
        await upgrade(engine)
        return (await PairingStore(engine).add_user("Tess", "user")).id
    finally:
        await engine.dispose()


async def _healthy(proc: asyncio.subprocess.Process, http: aiohttp.ClientSession, port: int) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + LIMIT_S
    while True:
        assert proc.returncode is None, f"goclaw serve exited ({proc.returncode}) before answering /healthz"
        assert loop.time() < deadline, "goclaw serve did not answer /healthz (hung for 90 s)"
        try:
            async with http.get(f"http://127.0.0.1:{port}/healthz") as r:
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("trusted", [True, False], ids=["ca-in-SSL_CERT_FILE", "ca-not-trusted"])
async def test_serve_reaches_an_https_model_only_when_its_ca_is_trusted(
    tmp_path: Path, ca_pem: tuple[trustme.CA, Path], trusted: bool
) -> None:
    ca, path = ca_pem
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_ctx)
    url = f"sqlite+aiosqlite:///{tmp_path / 'goclaw.db'}"
    user = await _seed(url)
    port = free_port()
    # The processes' own environment minus its CA settings: the default bundle, which lacks the CA.
    env = {k: v for k, v in os.environ.items() if k not in CERT_ENV}
    env.update(NO_PROXY="127.0.0.1", PYTHONPATH=str(ROOT))
    if trusted:
        env["SSL_CERT_FILE"] = str(path)
    log = tmp_path / "serve.log"
    async with HttpsOpenAI(server_ctx) as peer:
        peer.reply_text(REPLY)
        config: dict[str, Any] = {
            "database": {"url": url},
            "llm": {
                "provider": "openai",
                "model": "gpt-test",
                "base_url": peer.base_url,
                "api_key": "sk-test",
                "max_retries": 0,
                "timeout_seconds": 30,
            },
            "server": {"host": "127.0.0.1", "port": port, "api_users": [{"token": TOKEN, "user": user}]},
            "logging": {"level": "INFO"},
        }
        (tmp_path / "config.yaml").write_text(json.dumps(config))
        with log.open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "gateway",
                "serve",
                "--config",
                "config.yaml",
                cwd=tmp_path,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=LIMIT_S)) as http:
                await _healthy(proc, http, port)
                async with http.post(
                    f"http://127.0.0.1:{port}/v1/chat",
                    json={"session": "tls", "text": "hello over TLS", "message_id": "tls-1"},
                    headers={"Authorization": f"Bearer {TOKEN}"},
                ) as r:
                    status, body = r.status, await r.json(content_type=None)
        finally:
            if proc.returncode is None:
                proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                proc.kill()
                await proc.wait()
    output = log.read_text(errors="replace")
    assert proc.returncode == 0, output
    assert "Traceback" not in output, output
    assert peer.rejections == [], peer.rejections
    if trusted:
        assert (status, body.get("reply")) == (200, REPLY), (status, body, output)
        assert len(peer.requests) == 1, peer.requests
        assert "hello over TLS" in peer.requests[0]["messages"][-1]["content"]
    else:
        # What the person sees: the gateway's apology, not the model's words; the model saw nothing.
        assert status == 503, (status, body, output)
        assert body.get("error") == "model unavailable", body
        assert REPLY not in json.dumps(body)
        assert peer.requests == [], peer.requests
        assert peer.pending == 1
        assert "CERTIFICATE_VERIFY_FAILED" in output, output  # refused by verification, not some other fault
