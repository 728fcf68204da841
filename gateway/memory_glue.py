"""Memory wired into the turn: prompt sections, tools, directives, archive trust, the extraction job.

Placeholder until the memory package lands: memory is off.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.turn import MemoryGlue, NoMemory
from gateway.worker import JobHandler

if TYPE_CHECKING:
    from gateway.app import Gateway


def build_memory(gw: Gateway) -> tuple[MemoryGlue, dict[str, JobHandler]]:
    """The memory glue and the job handlers it brings."""

    async def extract(job: object) -> None:
        return None

    return NoMemory(), {"extract": extract}  # type: ignore[dict-item]
