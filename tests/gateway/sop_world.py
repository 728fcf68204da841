"""A gateway with SOPs on a real database and an injected clock (shared by the SOP tests)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from gateway.app import Gateway
from gateway.config import Config
from gateway.llm.base import LLMProvider
from tests.conftest import Clock


def sop_config(url: str, sops: list[dict[str, Any]], **extra: Any) -> Config:
    """A config on ``url`` with ``automation.sops``."""
    return Config.model_validate({"database": {"url": url}, "automation": {"sops": sops}, **extra})


@asynccontextmanager
async def running(
    url: str,
    sops: list[dict[str, Any]],
    *,
    clock: Clock,
    provider: LLMProvider,
    holds: Callable[[str], Any] | None = None,
    **extra: Any,
) -> AsyncIterator[Gateway]:
    """A started gateway (no channels, no background loops: tests step the scheduler by hand)."""
    gw = Gateway(sop_config(url, sops, **extra), provider=provider, clock=clock)
    gw.sop_holds = holds
    await gw.start(channels=False, worker=False)
    try:
        yield gw
    finally:
        await gw.stop()
