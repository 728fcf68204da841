"""What one turn's prompt held, as a small record stored with the reply (pure; the dashboard reads it).

The dashboard's "explain a turn" shows which memory records went into the
prompt and why, the tokens each prompt section took, and the model calls made.
It is built here at turn time from values the turn already has, so the hot
path pays one extra row in the reply's transaction and nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from msgspec import Struct

from gateway.llm.base import ChatMessage
from gateway.prompt import estimate_tokens


class TurnExplanation(Struct, frozen=True):
    """The values of one ``turn_records`` row (the session and message ids are added by the store)."""

    memory: list[dict[str, str]]
    sections: dict[str, int]
    model_calls: dict[str, Any]


def section_tokens(system_prompt: str) -> dict[str, int]:
    """Tokens per ``## SECTION`` of a system prompt, in prompt order (the same estimate as the budgets)."""
    out: dict[str, int] = {}
    for block in system_prompt.split("\n\n## "):
        block = block.removeprefix("## ")
        name, _, body = block.partition("\n")
        key = name.strip().lower() or "preamble"
        out[key] = out.get(key, 0) + estimate_tokens(body)
    return out


def explain_turn(
    *,
    messages: Sequence[ChatMessage],
    history_tokens: int,
    used_ids: Sequence[str],
    why: Sequence[str],
    provider: str,
    model: str,
    steps: int,
    tools: Sequence[str],
    input_tokens: int,
    output_tokens: int,
) -> TurnExplanation:
    """The explanation of one answered turn from what the turn had in hand.

    ``history_tokens`` are the tokens of ``messages[1:]``, as the turn counted them
    when it chose the history (``estimate_tokens``, the budgets' estimate).
    """
    sections = section_tokens(messages[0].content) if messages and messages[0].role == "system" else {}
    sections["conversation history"] = history_tokens
    memory = [{"id": rid, "why": why[i] if i < len(why) else ""} for i, rid in enumerate(used_ids)]
    return TurnExplanation(
        memory=memory,
        sections=sections,
        model_calls={
            "provider": provider,
            "model": model,
            "steps": steps,
            "tools": list(tools),
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
        },
    )


def directive_explanation(provider: str) -> TurnExplanation:
    """An ``@notes:`` directive is answered by code: no prompt, no model call."""
    return TurnExplanation(memory=[], sections={}, model_calls={"provider": provider, "model": "", "steps": 0})
