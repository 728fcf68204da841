"""The tool loop: ask the model, run the tools it calls, send back the results, repeat.

Permissions are enforced here, in code, not by the model: a tool is offered only
when ``authorize(principal)`` allows it, and every call is checked again when the
model makes it, because a model (or a prompt injected into it) may name a tool it
was never offered.

Streaming: with ``on_delta``, every model round streams, and its text reaches
the sink as it arrives, including text a model writes in a round that then
calls tools ("Let me look that up."): the person watching sees it at once, and
a later round's text follows after a blank line (``ROUND_BREAK``). The loop's
``text`` stays the last round's text alone, as without streaming, because that
is the reply the turn stores; so the pieces sent can differ from ``text``, and a
surface that streams must let its client reconcile (the WebSocket's final
``reply`` frame carries the stored reply).

Tools made per turn: a turn's tools close over its message and run (the handlers
and some checks need them), about 55 objects the cyclic collector counts. Given
as a ``ToolSource`` (a callable that makes them), the loop makes them to choose
what it offers and again for each round of calls, and offers the model one kept
copy of each tool's name, description and parameters (``offered_spec``): a turn
waiting on its model holds none of them. With 200 turns waiting that was about
11,000 objects toward the next young collection (``gateway/heap.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from msgspec import Struct, field

from gateway.llm.base import ChatMessage, Completion, DeltaSink, LLMProvider, Tool, ToolCall
from pairing.principal import Principal

log = logging.getLogger(__name__)

FALLBACK_TEXT = "Sorry, I couldn't put an answer together this time. Please try again, or ask in smaller steps."

# Added before the last, tool-less call so the model knows why its tools are gone.
FINAL_STEP_INSTRUCTION = (
    "You have used all the tool calls allowed for this turn. Answer the person now, in plain text, "
    "with what you have; say what you could not finish."
)

# Between the streamed text of two model rounds.
ROUND_BREAK = "\n\n"


class ToolLoopResult(Struct, frozen=True):
    """What a tool loop produced.

    Attributes:
        text: The answer for the person (never empty: a fallback if the model gave none).
        tool_calls_made: Every call the model made, as (name, arguments, result), in order;
            refusals and errors included, with the text the model was given.
        steps: Model calls made, including a final text-only call.
        model: The model that gave the last answer, as the server named it.
        input_tokens: Prompt tokens summed over all steps.
        output_tokens: Completion tokens summed over all steps.
    """

    text: str
    tool_calls_made: list[tuple[str, Mapping[str, Any], str]] = field(default_factory=list)
    steps: int = 0
    model: str = ""
    input_tokens: int = 0
    output_tokens: int = 0


def _refusal(tool: Tool, principal: Principal) -> str | None:
    """Why the principal may not use the tool, or None; a failing check refuses."""
    try:
        return tool.authorize(principal)
    except Exception:
        log.exception("authorize() of tool %s failed; refusing", tool.name)
        return f"{tool.name} is not available right now"


def offered_tools(tools: Sequence[Tool], principal: Principal) -> list[Tool]:
    """The tools this principal may use, which are the only ones shown to the model."""
    return [t for t in tools if _refusal(t, principal) is None]


ToolSource = Callable[[], Sequence[Tool]]
"""Makes a turn's tools afresh each time it is called (the same tools, made from the same turn)."""

_SPECS: dict[tuple[str, str, int], Tool] = {}
_SPECS_KEPT = 1024


async def _never_run(_principal: Principal, _args: Mapping[str, Any]) -> str:
    raise RuntimeError("a tool as offered to the model is never run: the loop runs the turn's own tool")


def offered_spec(tool: Tool) -> Tool:
    """``tool`` as the model is offered it (name, description, parameters), one kept object per such tool.

    Keyed by the parameters' identity, which the kept copy holds, so the key cannot come
    to name another object. Runs nothing: a call is run by the turn's own tool, made again.
    """
    key = (tool.name, tool.description, id(tool.parameters))
    spec = _SPECS.get(key)
    if spec is None:
        if len(_SPECS) >= _SPECS_KEPT:  # tools made with new parameters each time (tests): start over
            _SPECS.clear()
        spec = _SPECS[key] = Tool(tool.name, tool.description, tool.parameters, _never_run)
    return spec


async def run_tool(tool: Tool | None, call: ToolCall, principal: Principal) -> str:
    """Run one tool call and return the text the model gets back; never raises."""
    if tool is None:
        return f"error: unknown tool {call.name}"
    refusal = _refusal(tool, principal)
    if refusal is not None:
        # The handler does not run: the refusal is the whole answer.
        log.info("refused tool %s for %s: %s", call.name, principal.kind, refusal)
        return refusal
    try:
        result = await tool.handler(principal, call.arguments)
    except Exception as exc:
        log.exception("tool %s failed", call.name)
        return f"error: {call.name} failed: {str(exc) or type(exc).__name__}"
    return result if isinstance(result, str) else str(result)


async def run_tool_loop(
    provider: LLMProvider,
    messages: Sequence[ChatMessage],
    tools: Sequence[Tool] | ToolSource,
    principal: Principal,
    *,
    max_steps: int,
    on_delta: DeltaSink | None = None,
) -> ToolLoopResult:
    """Let the model call tools until it answers in text, or the step budget runs out.

    Args:
        provider: The model.
        messages: The conversation so far (system prompt first).
        tools: Every tool the gateway has; only those the principal may use are offered.
            A ``ToolSource`` is called for them whenever they are needed, and none of
            them is kept while the model answers (the module doc).
        principal: Who the turn runs as; each tool call is authorised for them.
        max_steps: Model calls that may use tools; then one last call without tools.
        on_delta: Receives the text of every round as it streams (see the module doc);
            None makes plain, non-streaming calls.

    Returns:
        The answer and a record of the tool calls made.

    Raises:
        LLMUnavailable: when the model cannot be reached (after the provider's retries).
    """
    source: ToolSource = tools if callable(tools) else (lambda: tools)
    offered = [offered_spec(t) for t in offered_tools(source(), principal)]
    conversation = list(messages)
    made: list[tuple[str, Mapping[str, Any], str]] = []
    steps = input_tokens = output_tokens = 0
    completion: Completion | None = None
    streamed = False  # some round's text has gone to on_delta
    round_started = False

    async def forward(text: str) -> None:
        nonlocal streamed, round_started
        assert on_delta is not None
        if not round_started:
            round_started = True
            if streamed:
                await on_delta(ROUND_BREAK)
        streamed = True
        await on_delta(text)

    async def ask(offer: Sequence[Tool]) -> Completion:
        nonlocal round_started
        if on_delta is None:
            return await provider.complete(conversation, tools=offer)
        round_started = False
        return await provider.complete(conversation, tools=offer, on_delta=forward)

    def result(text: str) -> ToolLoopResult:
        return ToolLoopResult(
            text=text if text.strip() else FALLBACK_TEXT,
            tool_calls_made=made,
            steps=steps,
            model=completion.model if completion else provider.model,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
        )

    for _ in range(max(1, max_steps)):
        completion = await ask(offered)
        steps += 1
        input_tokens += completion.input_tokens
        output_tokens += completion.output_tokens
        if not completion.tool_calls:
            return result(completion.text)
        conversation.append(ChatMessage(role="assistant", content=completion.text, tool_calls=completion.tool_calls))
        # Made afresh from the source for this round's calls, and let go before the next model call. Every
        # known tool by name, offered or not: a call to one not offered gets its refusal ("admins only"),
        # which tells the model more than "unknown tool".
        by_name = {t.name: t for t in source()}
        for call in completion.tool_calls:
            output = await run_tool(by_name.get(call.name), call, principal)
            made.append((call.name, call.arguments, output))
            conversation.append(ChatMessage(role="tool", content=output, tool_call_id=call.id, name=call.name))
        del by_name

    log.info("tool loop reached max_steps=%d; asking for a text answer", max_steps)
    conversation.append(ChatMessage(role="system", content=FINAL_STEP_INSTRUCTION))
    completion = await ask(())
    steps += 1
    input_tokens += completion.input_tokens
    output_tokens += completion.output_tokens
    # Tool calls in this answer are ignored: no tools were offered, and the budget is spent.
    return result(completion.text)
