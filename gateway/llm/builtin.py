"""The built-in offline model: deterministic, no network, clearly labelled.

It is a stand-in so that a fresh install works without any model server: a
rule-based classifier for extraction (``memory.rules``) and a template
responder that answers from the prompt's memory sections and says which items
it used. It is not a language model, and every reply says so.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from functools import lru_cache

from gateway.llm.base import ChatMessage, Completion, DeltaSink, JsonSchema, Tool, ToolCall
from gateway.llm.scripted import SCRIPTED_TOOLS, scripted_calls
from gateway.prompt import LEARN_AT_TRIM, LEARN_ON_PAUSE, OPERATIONAL, PERSONAL, SPEAKER

LABEL = "[offline model]"
_WORD = re.compile(r"[a-z0-9_]{3,}")
_STOP = frozenset(
    "the and for you your are was were this that with from have has had will would can could please "
    "what when where which who how about into onto our ours they them then than there their its it's "
    "not but all any some just now today tomorrow use using used me my mine i'm".split()
)
_CHANGE = re.compile(r"\b(from now on|instead of|no longer|rule:|always use|never use|switch to)\b", re.I)
_ID = re.compile(r"\[(m_[0-9a-f]+)\]")
# How the turn shows a person's line in the history: "[Alice · u_1] text".
_HISTORY_PREFIX = re.compile(r"^\[[^\]\n]{0,80} · [^\]\n]{1,60}\]\s*")


def _words(text: str) -> frozenset[str]:
    return frozenset(w for w in _WORD.findall(text.lower()) if w not in _STOP)


# Each reply reads the words of every memory line in its prompt: the same lines turn after turn, kept by
# their text (a line is one record's, so 4,096 of them are a few MB at most; a message's text is not kept).
_line_words = lru_cache(maxsize=4096)(_words)


def _speaker_role(system: str) -> str:
    start = system.find(SPEAKER + "\n")
    if start < 0:
        return ""
    first = system[start + len(SPEAKER) + 1 :].split("\n", 1)[0]
    return first.removeprefix("Paired role: ").strip() if first.startswith("Paired role: ") else ""


def _section(system: str, heading: str) -> list[str]:
    start = system.find(heading)
    if start < 0:
        return []
    body = system[start + len(heading) :]
    nxt = body.find("\n## ")
    body = body if nxt < 0 else body[:nxt]
    return [line.strip()[2:] for line in body.splitlines() if line.strip().startswith("- ")]


class BuiltinProvider:
    """The offline default provider."""

    name = "builtin"

    def __init__(self, model: str = "builtin-offline") -> None:
        self.model = model

    async def start(self) -> None:
        """Nothing to open."""

    async def stop(self) -> None:
        """Nothing to close."""

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        tools: Sequence[Tool] = (),
        json_schema: JsonSchema | None = None,
        on_delta: DeltaSink | None = None,
    ) -> Completion:
        """Answer deterministically from the prompt (word by word to ``on_delta``, when given)."""
        completion = self._answer(messages, tools, json_schema)
        if on_delta is not None and completion.text:
            for i, word in enumerate(completion.text.split(" ")):
                piece = word if i == 0 else " " + word
                if piece:
                    await on_delta(piece)
        return completion

    def _answer(
        self, messages: Sequence[ChatMessage], tools: Sequence[Tool], json_schema: JsonSchema | None
    ) -> Completion:
        system = "\n".join(m.content for m in messages if m.role == "system")
        user = next((m.content for m in reversed(messages) if m.role == "user"), "")
        if json_schema is not None:
            return Completion(self._structured(json_schema.name, system, user), model=self.model)
        scripted = self._scripted_tools(messages, tools, user)
        if scripted is not None:
            return scripted
        return Completion(self.respond(system, user), model=self.model)

    def _scripted_tools(self, messages: Sequence[ChatMessage], tools: Sequence[Tool], user: str) -> Completion | None:
        """``FINDING`` / ``PROPOSE`` lines become tool calls, when (and only when) that tool is offered.

        The one case where the offline model calls tools, so a research SOP and an
        identity proposal can be walked through offline (format:
        ``gateway.llm.scripted``). Which tools are offered was decided in code
        before this call; nothing here decides it.
        """
        last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=-1)
        results = [m for m in messages[last_user + 1 :] if m.role == "tool"]
        if results:
            if not any(m.name in SCRIPTED_TOOLS for m in results):
                return None
            return Completion("\n".join([LABEL, *(f"{m.name}: {m.content}" for m in results)]), model=self.model)
        calls = scripted_calls(user, {t.name for t in tools})
        if not calls:
            return None
        tool_calls = tuple(ToolCall(f"scripted-{i}", name, args) for i, (name, args) in enumerate(calls))
        return Completion("", tool_calls=tool_calls, model=self.model)

    def _structured(self, name: str, system: str, user: str) -> str:
        from memory import rules  # memory's rule-based classifier and judges

        if name == "extraction_result":
            return rules.builtin_extract(system, user)
        handler = getattr(rules, f"builtin_{name}", None)
        if handler is None:
            return json.dumps({"error": f"the offline model cannot answer {name}"})
        return str(handler(system, user))

    def respond(self, system: str, user: str) -> str:
        """The template reply: what will be learned and when, and which remembered items it used."""
        from memory.rules import classify  # memory's rule-based classifier, the same one extraction uses

        # Authority is read from the first line of CURRENT SPEAKER only: the rest of
        # the prompt (memory, previous context, history) is text people typed.
        role = _speaker_role(system)
        is_admin = role == "administrator"
        has_personal = role in ("administrator", "regular user")
        text = _HISTORY_PREFIX.sub("", user, count=1)
        kinds = {i.kind for i in classify(text)}
        teaches_procedure = bool(_CHANGE.search(text)) or "operational" in kinds
        notes = _section(system, OPERATIONAL)
        personal = _section(system, PERSONAL)
        asked = _words(text)
        relevant_notes = [n for n in notes if asked & _line_words(n)]
        relevant_personal = [p for p in personal if asked & _line_words(p)]
        used = relevant_notes + relevant_personal
        when = _when_learned(system)
        lines: list[str] = [LABEL]
        if teaches_procedure and not is_admin:
            # policy: a non-admin's new procedure is "declining-to-learn": say so, politely.
            lines.append(
                "Operational changes require an administrator, so I will not learn this and will keep "
                "following the procedure the administrators established."
            )
            if relevant_notes:
                lines.append("Current procedure: " + relevant_notes[0])
        elif teaches_procedure:
            lines.append(
                "Understood. As an administrator's instruction, this will be learned as an operational note"
                + (f" {when}" if when else "")
                + ". (@notes: saves a note at once.)"
            )
        if kinds & {"preference", "identity"}:
            if has_personal:
                lines.append(f"I'll remember this about you {when}." if when else "I'll remember this about you.")
            else:
                lines.append("I can't remember this: only paired people have a personal memory.")
        if used and not teaches_procedure:
            lines.append("Using what I have been taught:")
            lines.extend(f"- {item}" for item in used[:5])
        elif len(lines) == 1:
            lines.append(
                "I have nothing remembered that bears on this. (This is the built-in offline model: configure "
                "llm.provider for real answers.)"
            )
        ids = [m for item in used for m in _ID.findall(item)]
        lines.append("Memory used: " + (", ".join(ids) if ids else ("none" if not used else f"{len(used)} item(s)")))
        return "\n".join(lines)


def _when_learned(system: str) -> str:
    """When conversation is learned, as the prompt's MEMORY ROUTING POLICY says ('' if it does not say)."""
    if LEARN_ON_PAUSE in system:
        return "when the conversation pauses"
    if LEARN_AT_TRIM in system:
        return "when older messages are archived"
    return ""
