"""Secret comparison and the /metrics access rule (pure decisions, no I/O)."""

from __future__ import annotations

import hmac

from pydantic import SecretStr


def _as_bytes(value: str) -> bytes:
    # surrogatepass: a header or query value may carry lone surrogates (aiohttp decodes
    # undecodable bytes with surrogateescape); they must compare unequal, not raise.
    return value.encode("utf-8", "surrogatepass")


def tokens_match(given: str, expected: SecretStr) -> bool:
    """Whether a presented token equals the configured secret, in constant time.

    ``hmac.compare_digest`` on two ``str`` raises ``TypeError`` when either holds a
    non-ASCII character, which made a non-ASCII bearer token a 500; on bytes it is
    defined for every input.
    """
    return hmac.compare_digest(_as_bytes(given), _as_bytes(expected.get_secret_value()))


def metrics_refusal(*, loopback_host: bool, metrics_token: SecretStr | None, given: str | None) -> str | None:
    """Why a /metrics request is refused (answered 401), or None when it may read the metrics.

    On a loopback host the metrics are open (only this machine can reach them). On any
    other host they need ``server.metrics_token`` as a bearer token; without one
    configured, nobody can read them and the message says how to enable them.
    """
    if loopback_host:
        return None
    if metrics_token is None:
        return (
            "/metrics on a non-loopback host needs a token: set server.metrics_token (16+ characters) "
            "and send it as 'Authorization: Bearer TOKEN'"
        )
    if given is None or not tokens_match(given, metrics_token):
        return "missing or wrong metrics token: send server.metrics_token as 'Authorization: Bearer TOKEN'"
    return None
