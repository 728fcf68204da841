"""Webhook signatures: HMAC-SHA256 over ``"<timestamp>.<raw body>"`` with the SOP's secret.

The caller sends ``X-Goclaw-Timestamp: <unix seconds>`` and
``X-Goclaw-Signature: sha256=<hex>``. A timestamp more than five minutes from
the gateway's clock is refused, so a captured request cannot be replayed later.
"""

from __future__ import annotations

import hashlib
import hmac
from datetime import datetime

WINDOW_SECONDS = 300
TIMESTAMP_HEADER = "X-Goclaw-Timestamp"
SIGNATURE_HEADER = "X-Goclaw-Signature"


def sign(secret: str, timestamp: int | str, body: bytes) -> str:
    """The ``X-Goclaw-Signature`` value for ``body`` sent at ``timestamp``."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def check_signature(
    secret: str, timestamp: str | None, signature: str | None, body: bytes, now: datetime
) -> str | None:
    """Why a request is not signed right, or None when it is.

    Args:
        secret: The SOP's webhook secret.
        timestamp: The ``X-Goclaw-Timestamp`` header.
        signature: The ``X-Goclaw-Signature`` header.
        body: The raw body, exactly as received.
        now: The gateway's clock.
    """
    if not timestamp or not signature:
        return (
            f"missing {TIMESTAMP_HEADER} or {SIGNATURE_HEADER} header: sign '<timestamp>.<body>' with "
            "HMAC-SHA256 and the hook's secret"
        )
    ts = timestamp.strip()
    if not ts.isdigit():
        return f"{TIMESTAMP_HEADER} must be unix seconds (e.g. $(date +%s))"
    if abs(now.timestamp() - int(ts)) > WINDOW_SECONDS:
        minutes = WINDOW_SECONDS // 60
        return f"{TIMESTAMP_HEADER} is more than {minutes} minutes from the server's time (a replay, or clock skew)"
    expected = sign(secret, ts, body).encode()
    # Constant time, on bytes: a str with non-ASCII characters would make compare_digest raise.
    if not hmac.compare_digest(expected, signature.strip().encode("utf-8", "replace")):
        return f"{SIGNATURE_HEADER} does not match: sign '<timestamp>.<raw body>' as sha256=<hex HMAC-SHA256>"
    return None
