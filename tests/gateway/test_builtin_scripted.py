"""The offline model's scripted tool calls: FINDING / PROPOSE lines, only when the tool is offered."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.llm.base import ChatMessage, Tool
from gateway.llm.builtin import LABEL, BuiltinProvider
from gateway.llm.loop import run_tool_loop
from pairing.principal import Principal

FINDING = 'FINDING severity=blocking affects=daily-report claim="Refunds dropped" evidence="export.py:88"'
PROPOSE = 'PROPOSE scope=agent_config subject=boundaries text="Never email customers" rationale="legal"'


def _tool(name: str, seen: list[Mapping[str, Any]], *, offered: bool = True) -> Tool:
    async def handler(_p: Principal, args: Mapping[str, Any]) -> str:
        seen.append(args)
        return f"{name} recorded"

    return Tool(name, "", {"type": "object"}, handler, lambda _p: None if offered else "not for you")


async def test_finding_and_propose_lines_become_calls_of_the_offered_tools() -> None:
    seen: list[Mapping[str, Any]] = []
    tools = [_tool("report_intelligence", seen), _tool("propose_policy_change", seen)]
    messages = [ChatMessage("system", "sys"), ChatMessage("user", f"[sop-system · unpaired] Go.\n{FINDING}\n{PROPOSE}")]
    result = await run_tool_loop(BuiltinProvider(), messages, tools, Principal.system("sop-system"), max_steps=4)
    assert [name for name, _, _ in result.tool_calls_made] == ["report_intelligence", "propose_policy_change"]
    assert seen[0]["reported_severity"] == "blocking" and seen[0]["affected_sops"] == ["daily-report"]
    assert seen[1] == {"scope": "agent_config", "subject": "boundaries", "text": "Never email customers",
                       "rationale": "legal"}  # fmt: skip
    assert result.text.startswith(LABEL) and "report_intelligence recorded" in result.text
    assert result.steps == 2


async def test_nothing_is_called_when_the_tool_is_not_offered() -> None:
    seen: list[Mapping[str, Any]] = []
    tools = [_tool("report_intelligence", seen, offered=False), _tool("propose_policy_change", seen, offered=False)]
    messages = [ChatMessage("system", "sys"), ChatMessage("user", f"{FINDING}\n{PROPOSE}")]
    result = await run_tool_loop(BuiltinProvider(), messages, tools, Principal.unpaired(), max_steps=4)
    assert result.tool_calls_made == [] and seen == []
    assert result.text.startswith(LABEL) and result.steps == 1


async def test_the_offline_model_streams_its_reply_word_by_word_through_the_tool_loop() -> None:
    seen: list[Mapping[str, Any]] = []
    pieces: list[str] = []

    async def sink(text: str) -> None:
        pieces.append(text)

    messages = [ChatMessage("system", "sys"), ChatMessage("user", f"[sop-system · unpaired] Go.\n{FINDING}")]
    result = await run_tool_loop(
        BuiltinProvider(), messages, [_tool("report_intelligence", seen)], Principal.system("sop-system"),
        max_steps=4, on_delta=sink,
    )  # fmt: skip
    # The tool round says nothing, so no round break comes first; the answer streams in words.
    assert len(pieces) > 3
    assert "".join(pieces) == result.text
    assert result.text.startswith(LABEL) and seen
