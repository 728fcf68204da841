"""run_tool_loop against a scripted in-process model: authorisation, errors, budget."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from gateway.llm.base import ChatMessage, Completion, JsonSchema, LLMUnavailable, Tool, ToolCall
from gateway.llm.loop import FALLBACK_TEXT, ToolSource, offered_spec, offered_tools, run_tool_loop
from pairing.principal import Principal, Role

ADMIN = Principal.human("u_admin", Role.ADMIN, "Ada")
USER = Principal.human("u_user", Role.USER, "Bo")
CRON = Principal.system("cron-system")
PROMPT = [ChatMessage(role="system", content="persona"), ChatMessage(role="user", content="hello")]


class ScriptedModel:
    """An LLMProvider that answers from a list and records what it was asked."""

    name = "scripted"
    model = "scripted-1"

    def __init__(self, *answers: Completion | Exception) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[list[ChatMessage], list[str]]] = []

    async def start(self) -> None:
        """Nothing to open."""

    async def stop(self) -> None:
        """Nothing to close."""

    async def complete(
        self, messages: Sequence[ChatMessage], *, tools: Sequence[Tool] = (), json_schema: JsonSchema | None = None
    ) -> Completion:
        self.calls.append((list(messages), [t.name for t in tools]))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def calls(*specs: tuple[str, Mapping[str, Any]]) -> Completion:
    """A completion asking for tool calls."""
    return Completion(text="", tool_calls=tuple(ToolCall(f"c{i}", n, a) for i, (n, a) in enumerate(specs)))


def text(value: str, tokens: tuple[int, int] = (0, 0)) -> Completion:
    """A completion answering in text."""
    return Completion(text=value, model="scripted-1", input_tokens=tokens[0], output_tokens=tokens[1])


def make_tool(name: str, ran: list[tuple[Principal, Mapping[str, Any]]], *, admin_only: bool = False) -> Tool:
    async def handler(principal: Principal, args: Mapping[str, Any]) -> str:
        ran.append((principal, args))
        return f"{name} ok"

    def authorize(principal: Principal) -> str | None:
        return None if principal.role is Role.ADMIN else f"{name} is for admins only"

    return Tool(name, f"The {name} tool.", {"type": "object"}, handler, authorize if admin_only else (lambda _p: None))


def tool_results(messages: list[ChatMessage]) -> list[tuple[str | None, str]]:
    return [(m.tool_call_id, m.content) for m in messages if m.role == "tool"]


async def test_answer_without_tool_calls_is_one_step() -> None:
    model = ScriptedModel(text("hi there", (10, 3)))

    result = await run_tool_loop(model, PROMPT, [], USER, max_steps=3)

    assert (result.text, result.steps, result.tool_calls_made, result.model) == ("hi there", 1, [], "scripted-1")
    assert (result.input_tokens, result.output_tokens) == (10, 3)


async def test_only_authorized_tools_are_offered() -> None:
    ran: list[tuple[Principal, Mapping[str, Any]]] = []
    tools = [make_tool("memory_search", ran), make_tool("review_learned", ran, admin_only=True)]

    assert [t.name for t in offered_tools(tools, USER)] == ["memory_search"]
    assert [t.name for t in offered_tools(tools, ADMIN)] == ["memory_search", "review_learned"]
    assert [t.name for t in offered_tools(tools, CRON)] == ["memory_search"]


def given(tools: list[Tool], form: str) -> list[Tool] | ToolSource:
    """The tools as a list, or (as a turn gives them) a source that makes them again each time it is called."""
    if form == "list":
        return tools
    return lambda: [Tool(t.name, t.description, t.parameters, t.handler, t.authorize) for t in tools]


@pytest.mark.parametrize("form", ["list", "source"])
@pytest.mark.parametrize("principal", [USER, CRON, Principal.unpaired("stranger")])
async def test_non_admin_calling_an_admin_tool_gets_the_refusal_and_nothing_runs(
    principal: Principal, form: str
) -> None:
    ran: list[tuple[Principal, Mapping[str, Any]]] = []
    tools = [make_tool("memory_search", ran), make_tool("review_learned", ran, admin_only=True)]
    model = ScriptedModel(calls(("review_learned", {"confirm": "all"})), text("ok"))

    result = await run_tool_loop(model, PROMPT, given(tools, form), principal, max_steps=3)

    assert ran == []
    assert result.tool_calls_made == [("review_learned", {"confirm": "all"}, "review_learned is for admins only")]
    assert tool_results(model.calls[1][0]) == [("c0", "review_learned is for admins only")]
    assert model.calls[0][1] == ["memory_search"]


@pytest.mark.parametrize("form", ["list", "source"])
async def test_admin_may_call_an_admin_tool(form: str) -> None:
    ran: list[tuple[Principal, Mapping[str, Any]]] = []
    model = ScriptedModel(calls(("review_learned", {})), text("done"))
    tools = given([make_tool("review_learned", ran, admin_only=True)], form)

    result = await run_tool_loop(model, PROMPT, tools, ADMIN, max_steps=3)

    assert ran == [(ADMIN, {})]
    assert result.tool_calls_made == [("review_learned", {}, "review_learned ok")]


@pytest.mark.parametrize("form", ["list", "source"])
async def test_unknown_tool_gets_an_error_result(form: str) -> None:
    model = ScriptedModel(calls(("rm_rf", {})), text("sorry"))

    result = await run_tool_loop(model, PROMPT, given([], form), USER, max_steps=3)

    assert result.tool_calls_made == [("rm_rf", {}, "error: unknown tool rm_rf")]
    assert result.text == "sorry"


async def test_a_tool_source_is_made_to_offer_and_again_for_each_round_of_calls_the_offer_a_kept_copy() -> None:
    # A turn's tools hold its message and run; given as a source, none is held while the model answers: the
    # model is offered one kept copy of each (name, description, parameters), and each round's calls are run
    # by the tools made again for it, each call's principal checked again.
    ran: list[tuple[Principal, Mapping[str, Any]]] = []
    made: list[int] = []

    def source() -> list[Tool]:
        made.append(1)
        return [make_tool("memory_search", ran), make_tool("review_learned", ran, admin_only=True)]

    model = ScriptedModel(
        calls(("memory_search", {"q": "report"})), calls(("memory_search", {"q": "again"})), text("done")
    )
    offers: list[Sequence[Tool]] = []
    real = model.complete

    async def complete(messages: Sequence[ChatMessage], *, tools: Sequence[Tool] = (), **kw: Any) -> Completion:
        offers.append(tools)
        return await real(messages, tools=tools, **kw)

    model.complete = complete  # type: ignore[method-assign]
    result = await run_tool_loop(model, PROMPT, source, USER, max_steps=3)

    assert result.text == "done" and ran == [(USER, {"q": "report"}), (USER, {"q": "again"})]
    assert len(made) == 3  # to choose the offer, then once for each of the two rounds of calls
    assert [[t.name for t in offer] for offer in offers] == [["memory_search"]] * 3
    (spec,) = offers[0]
    assert all(offer[0] is spec for offer in offers)  # the same kept copy each round (and each turn)
    assert offered_spec(source()[0]) is not spec  # another parameters object: another copy, never a wrong one
    with pytest.raises(RuntimeError, match="never run"):
        await spec.handler(USER, {})


async def test_handler_exception_becomes_an_error_result_and_the_loop_goes_on() -> None:
    async def broken(principal: Principal, args: Mapping[str, Any]) -> str:
        raise ValueError("database is locked")

    tool = Tool("memory_write", "Write.", {"type": "object"}, broken)
    model = ScriptedModel(calls(("memory_write", {"content": "x"})), text("I couldn't save that."))

    result = await run_tool_loop(model, PROMPT, [tool], USER, max_steps=3)

    assert result.tool_calls_made[0][2] == "error: memory_write failed: database is locked"
    assert result.text == "I couldn't save that."


async def test_failing_authorize_refuses_rather_than_allows() -> None:
    ran: list[tuple[Principal, Mapping[str, Any]]] = []

    def broken_check(principal: Principal) -> str | None:
        raise RuntimeError("role lookup failed")

    base = make_tool("notes_distill", ran)
    tool = Tool(base.name, base.description, base.parameters, base.handler, broken_check)
    model = ScriptedModel(calls(("notes_distill", {})), text("ok"))

    result = await run_tool_loop(model, PROMPT, [tool], ADMIN, max_steps=2)

    assert ran == []
    assert model.calls[0][1] == []
    assert result.tool_calls_made == [("notes_distill", {}, "notes_distill is not available right now")]


async def test_several_calls_in_one_step_run_in_order_and_answer_each_id() -> None:
    ran: list[tuple[Principal, Mapping[str, Any]]] = []
    model = ScriptedModel(calls(("a", {"n": 1}), ("b", {"n": 2})), text("both done"))

    result = await run_tool_loop(model, PROMPT, [make_tool("a", ran), make_tool("b", ran)], USER, max_steps=2)

    assert result.text == "both done"
    assert [args for _, args in ran] == [{"n": 1}, {"n": 2}]
    assert tool_results(model.calls[1][0]) == [("c0", "a ok"), ("c1", "b ok")]
    assistant = model.calls[1][0][-3]
    assert assistant.role == "assistant" and [c.id for c in assistant.tool_calls] == ["c0", "c1"]


async def test_max_steps_makes_one_last_call_without_tools() -> None:
    ran: list[tuple[Principal, Mapping[str, Any]]] = []
    model = ScriptedModel(calls(("a", {})), calls(("a", {})), text("final answer"))

    result = await run_tool_loop(model, PROMPT, [make_tool("a", ran)], USER, max_steps=2)

    assert result.text == "final answer"
    assert result.steps == 3
    assert [offered for _, offered in model.calls] == [["a"], ["a"], []]
    assert model.calls[2][0][-1].role == "system"  # told why the tools are gone


async def test_tool_calls_in_the_last_answer_are_ignored_and_fallback_given() -> None:
    ran: list[tuple[Principal, Mapping[str, Any]]] = []
    model = ScriptedModel(calls(("a", {})), calls(("a", {})))

    result = await run_tool_loop(model, PROMPT, [make_tool("a", ran)], USER, max_steps=1)

    assert result.text == FALLBACK_TEXT
    assert len(ran) == 1


async def test_empty_text_answer_gets_the_fallback() -> None:
    result = await run_tool_loop(ScriptedModel(text("   ")), PROMPT, [], USER, max_steps=2)

    assert result.text == FALLBACK_TEXT


async def test_model_unavailable_propagates() -> None:
    model = ScriptedModel(LLMUnavailable("model unavailable after 4 attempts: 503 Service Unavailable"))

    with pytest.raises(LLMUnavailable, match="503"):
        await run_tool_loop(model, PROMPT, [], USER, max_steps=2)


async def test_the_callers_messages_are_not_modified() -> None:
    ran: list[tuple[Principal, Mapping[str, Any]]] = []
    prompt = list(PROMPT)

    await run_tool_loop(ScriptedModel(calls(("a", {})), text("ok")), prompt, [make_tool("a", ran)], USER, max_steps=2)

    assert prompt == PROMPT
