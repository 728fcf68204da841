"""Retries for model calls: exponential backoff with jitter, honouring Retry-After.

One policy for every provider, so the SDKs' own retries are switched off
(``max_retries=0``) and this module decides. Errors are read by duck typing
(``status_code``, ``response.headers``, ``body``), which the ``openai`` and
``anthropic`` SDKs' status errors share, so this module imports neither.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

from gateway.llm.base import LLMUnavailable

log = logging.getLogger(__name__)

T = TypeVar("T")

# 408/409 are what the SDKs themselves retry besides 429 and 5xx (529 "overloaded" is a 5xx).
RETRYABLE_STATUSES: frozenset[int] = frozenset({408, 409, 429})

# A server asking for a longer pause than this is not waited for: a person is usually
# waiting on the answer, and an honest "unavailable" beats an early retry it will refuse.
MAX_RETRY_AFTER_SECONDS = 30.0


def is_retryable_status(status: int) -> bool:
    """Whether an HTTP status is worth another attempt (429, 5xx, 408, 409)."""
    return status in RETRYABLE_STATUSES or status >= 500


def status_of(exc: BaseException) -> int | None:
    """The HTTP status an SDK error carries, or None (timeouts, connection errors)."""
    status = getattr(exc, "status_code", None)
    return status if isinstance(status, int) else None


def retry_after_seconds(exc: BaseException) -> float | None:
    """The pause the server asked for (``retry-after-ms`` or ``Retry-After``), if any."""
    headers = getattr(getattr(exc, "response", None), "headers", None)
    if headers is None:
        return None
    raw_ms = headers.get("retry-after-ms")
    if raw_ms:
        try:
            return max(0.0, float(raw_ms) / 1000.0)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if not raw:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    # Retry-After may also be an HTTP date (RFC 9110 section 10.2.3).
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _api_message(exc: BaseException) -> str:
    """The server's own explanation from an error body, in either provider's shape."""
    body: Any = getattr(exc, "body", None)
    if isinstance(body, Mapping):
        inner = body.get("error", body)
        if isinstance(inner, Mapping):
            message = inner.get("message")
            if isinstance(message, str):
                return message.strip()
    return ""


def _reason_phrase(exc: BaseException, status: int) -> str:
    phrase = getattr(getattr(exc, "response", None), "reason_phrase", "")
    return f"{status} {phrase}".strip() if isinstance(phrase, str) else str(status)


def _refusal_in_causes(exc: BaseException) -> BaseException | None:
    """The refused connection somewhere in ``exc``'s causes (the transport's own error), if any."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, ConnectionRefusedError):
            return cur
        for arg in getattr(cur, "args", ()):
            if isinstance(arg, ConnectionRefusedError):
                return arg
        cur = cur.__cause__ or cur.__context__
    return None


def describe_failure(exc: BaseException) -> str:
    """One line naming why a call failed, fit for an operator or a log."""
    status = status_of(exc)
    detail = _api_message(exc)
    suffix = f": {detail}" if detail else ""
    if status is None:
        name = type(exc).__name__
        refused = _refusal_in_causes(exc)
        if refused is not None:
            # Before the timeout check: a transport may report a refused connection as a connect timeout.
            return f"could not connect ({refused})"
        if "Timeout" in name or isinstance(exc, TimeoutError):
            return "the request timed out"
        if "Connection" in name or isinstance(exc, ConnectionError):
            cause = exc.__cause__ or exc.__context__
            return f"could not connect ({cause or exc})"
        return f"{name}: {exc}" if str(exc) else name
    if status == 401:
        return f"the model rejected the API key (401){suffix}"
    if status == 403:
        return f"the model refused this API key access (403){suffix}"
    if status == 404:
        return f"the model or endpoint was not found (404){suffix}"
    if 400 <= status < 500 and not is_retryable_status(status):
        return f"the model rejected the request ({status}){suffix}"
    return f"{_reason_phrase(exc, status)}{suffix}"


def backoff_delay(retry: int, base_delay: float, max_delay: float, rng: Callable[[], float] = random.random) -> float:
    """The pause before retry number ``retry`` (0-based): doubling, capped, with jitter.

    "Equal jitter": half the step is fixed, half random, so concurrent callers spread
    out without any of them retrying almost at once.
    """
    step = min(max_delay, base_delay * (2**retry))
    return step / 2 + rng() * step / 2


async def with_retries(
    call: Callable[[], Awaitable[T]],
    *,
    attempts: int,
    base_delay: float = 0.5,
    max_delay: float = 8.0,
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    is_retryable: Callable[[BaseException], bool],
    errors: tuple[type[BaseException], ...] = (Exception,),
    describe: Callable[[BaseException], str] = describe_failure,
    label: str = "model",
) -> T:
    """Run ``call`` until it succeeds, retrying transient failures.

    Args:
        call: Makes one attempt (a fresh coroutine each time).
        attempts: How many attempts in all (at least 1).
        base_delay: First backoff step in seconds; it doubles each retry.
        max_delay: Cap on one backoff step.
        sleep: Waits between attempts (tests pass a recorder).
        is_retryable: Whether an error is transient (429, 5xx, timeout, connection).
        errors: The exception types that mean "the model failed"; anything else (a bug)
            propagates untouched.
        describe: Names an error in one line for the LLMUnavailable message.
        label: What is unavailable, for the message ("model", "openai model gpt-4o").

    Returns:
        What ``call`` returned.

    Raises:
        LLMUnavailable: at once for a non-retryable error (400/401/404...), or after the
            last attempt, or when the server asks for a pause longer than
            ``MAX_RETRY_AFTER_SECONDS``; the message names the cause.
    """
    attempts = max(1, attempts)
    for attempt in range(1, attempts + 1):
        try:
            return await call()
        except errors as exc:
            reason = describe(exc)
            if not is_retryable(exc):
                raise LLMUnavailable(f"{label} unavailable: {reason}") from exc
            if attempt == attempts:
                tries = f"{attempts} attempts" if attempts != 1 else "1 attempt"
                raise LLMUnavailable(f"{label} unavailable after {tries}: {reason}") from exc
            asked = retry_after_seconds(exc)
            if asked is not None and asked > MAX_RETRY_AFTER_SECONDS:
                raise LLMUnavailable(f"{label} unavailable: {reason} (the server asks to wait {asked:.0f}s)") from exc
            delay = asked if asked is not None else backoff_delay(attempt - 1, base_delay, max_delay)
            log.warning("%s call failed (%s); retry %d/%d in %.2fs", label, reason, attempt, attempts - 1, delay)
            await sleep(delay)
    raise AssertionError("unreachable: the loop returns or raises")  # pragma: no cover
