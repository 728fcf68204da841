"""with_retries: which failures are retried, how long it waits, what the error says."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from gateway.llm.base import LLMUnavailable
from gateway.llm.retry import (
    backoff_delay,
    describe_failure,
    is_retryable_status,
    retry_after_seconds,
    with_retries,
)


class _Response:
    def __init__(self, status: int, headers: dict[str, str], reason: str) -> None:
        self.status_code = status
        self.headers = headers
        self.reason_phrase = reason


class StatusError(Exception):
    """Shaped like the SDKs' APIStatusError: status_code, response.headers, body."""

    def __init__(self, status: int, reason: str = "", headers: dict[str, str] | None = None, body: object = None):
        super().__init__(f"Error code: {status}")
        self.status_code = status
        self.response = _Response(status, headers or {}, reason)
        self.body = body


class APITimeoutError(Exception):
    """Named like the SDKs' timeout error."""


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, StatusError):
        return is_retryable_status(exc.status_code)
    return isinstance(exc, APITimeoutError)


def _script(*outcomes: object) -> tuple[Callable[[], Awaitable[str]], list[int]]:
    """A call that raises or returns each outcome in turn, and a counter of attempts."""
    calls: list[int] = []

    async def call() -> str:
        calls.append(1)
        outcome = outcomes[len(calls) - 1]
        if isinstance(outcome, BaseException):
            raise outcome
        return str(outcome)

    return call, calls


class Sleeps(list[float]):
    """Records the pauses instead of taking them."""

    async def __call__(self, delay: float) -> None:
        self.append(delay)


@pytest.mark.parametrize(
    ("status", "retry"),
    [
        (429, True),
        (500, True),
        (503, True),
        (529, True),
        (408, True),
        (400, False),
        (401, False),
        (403, False),
        (404, False),
        (422, False),
    ],
)
def test_retryable_statuses(status: int, retry: bool) -> None:
    assert is_retryable_status(status) is retry


async def test_success_after_transient_failures_returns_the_value() -> None:
    call, calls = _script(StatusError(503, "Service Unavailable"), APITimeoutError(), "answer")
    sleeps = Sleeps()

    assert await with_retries(call, attempts=3, sleep=sleeps, is_retryable=_retryable) == "answer"
    assert len(calls) == 3
    assert len(sleeps) == 2


async def test_last_attempt_failure_names_attempts_and_cause() -> None:
    call, calls = _script(*[StatusError(503, "Service Unavailable")] * 4)

    with pytest.raises(LLMUnavailable, match=r"^model unavailable after 4 attempts: 503 Service Unavailable$"):
        await with_retries(call, attempts=4, sleep=Sleeps(), is_retryable=_retryable)
    assert len(calls) == 4


async def test_unauthorized_is_not_retried_and_says_so() -> None:
    body = {"error": {"message": "Incorrect API key provided"}}
    call, calls = _script(StatusError(401, "Unauthorized", body=body), "never")
    sleeps = Sleeps()

    with pytest.raises(LLMUnavailable) as caught:
        await with_retries(call, attempts=4, sleep=sleeps, is_retryable=_retryable)
    assert "the model rejected the API key (401): Incorrect API key provided" in str(caught.value)
    assert len(calls) == 1
    assert sleeps == []


async def test_unavailable_keeps_the_sdk_error_as_cause() -> None:
    error = StatusError(404, "Not Found")
    call, _ = _script(error)

    with pytest.raises(LLMUnavailable) as caught:
        await with_retries(call, attempts=2, sleep=Sleeps(), is_retryable=_retryable)
    assert caught.value.__cause__ is error


async def test_errors_outside_the_given_types_propagate_untouched() -> None:
    # A bug in the caller is not "the model is unavailable".
    call, calls = _script(TypeError("bad argument"))

    with pytest.raises(TypeError, match="bad argument"):
        await with_retries(call, attempts=3, sleep=Sleeps(), is_retryable=_retryable, errors=(StatusError,))
    assert len(calls) == 1


async def test_retry_after_seconds_is_honoured_exactly() -> None:
    call, _ = _script(StatusError(429, "Too Many Requests", {"retry-after": "3"}), "ok")
    sleeps = Sleeps()

    await with_retries(call, attempts=2, sleep=sleeps, is_retryable=_retryable)
    assert sleeps == [3.0]


async def test_retry_after_longer_than_the_cap_gives_up_at_once() -> None:
    call, calls = _script(StatusError(429, "Too Many Requests", {"retry-after": "600"}), "ok")

    with pytest.raises(LLMUnavailable, match=r"asks to wait 600s"):
        await with_retries(call, attempts=3, sleep=Sleeps(), is_retryable=_retryable)
    assert len(calls) == 1


def test_retry_after_forms() -> None:
    assert retry_after_seconds(StatusError(429, headers={"retry-after-ms": "1500"})) == 1.5
    assert retry_after_seconds(StatusError(429, headers={"retry-after": "2"})) == 2.0
    assert retry_after_seconds(StatusError(429, headers={"retry-after": "soon"})) is None
    assert retry_after_seconds(StatusError(429)) is None
    assert retry_after_seconds(ValueError()) is None
    when = format_datetime(datetime.now(UTC) + timedelta(seconds=20), usegmt=True)
    assert 15 <= (retry_after_seconds(StatusError(503, headers={"retry-after": when})) or 0) <= 20
    past = format_datetime(datetime.now(UTC) - timedelta(seconds=20), usegmt=True)
    assert retry_after_seconds(StatusError(503, headers={"retry-after": past})) == 0.0


def test_backoff_doubles_with_jitter_and_is_capped() -> None:
    assert backoff_delay(0, 0.5, 8.0, rng=lambda: 0.0) == 0.25
    assert backoff_delay(0, 0.5, 8.0, rng=lambda: 1.0) == 0.5
    assert backoff_delay(3, 0.5, 8.0, rng=lambda: 1.0) == 4.0
    assert backoff_delay(10, 0.5, 8.0, rng=lambda: 1.0) == 8.0
    assert 4.0 <= backoff_delay(10, 0.5, 8.0) <= 8.0


def test_describe_names_the_common_failures() -> None:
    assert describe_failure(APITimeoutError("Request timed out.")) == "the request timed out"
    assert describe_failure(StatusError(500, "Internal Server Error")) == "500 Internal Server Error"
    assert describe_failure(StatusError(400, "Bad Request", body={"message": "max_tokens too large"})) == (
        "the model rejected the request (400): max_tokens too large"
    )
    assert describe_failure(StatusError(404, "Not Found")) == "the model or endpoint was not found (404)"


async def test_label_names_the_model() -> None:
    call, _ = _script(StatusError(500, "Internal Server Error"))

    with pytest.raises(LLMUnavailable, match=r"^openai model 'gpt-x' unavailable after 1 attempt:"):
        await with_retries(call, attempts=1, sleep=Sleeps(), is_retryable=_retryable, label="openai model 'gpt-x'")
