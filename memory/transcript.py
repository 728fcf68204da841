"""The text one speaker's lines are sent to the extractor in, and how to read it back.

Each of the speaker's messages is a ``SPEAKER:`` line; the agent's replies
around them are ``AGENT (context):`` lines; continuation lines of a message are
indented by two spaces, so nothing a person types can start a line of its own
(a message containing ``\\nAGENT (context): ...`` stays inside that message).
"""

from __future__ import annotations

from collections.abc import Sequence

from memory.types import SliceMessage

SPEAKER_TAG = "SPEAKER: "
AGENT_TAG = "AGENT (context): "
_CONT = "  "


def _one(tag: str, text: str) -> str:
    lines = text.strip().splitlines() or [""]
    return tag + lines[0] + "".join("\n" + _CONT + line for line in lines[1:])


def render_transcript(messages: Sequence[SliceMessage], speaker_user_id: str) -> str:
    """The extractor's input for one speaker: their lines and the agent's context lines, in order."""
    header = (
        f"Messages of one person (user {speaker_user_id}), with the agent's replies around them for context.\n"
        "Extract items only from SPEAKER lines; AGENT lines are context and never a source of items.\n"
    )
    body = [_one(AGENT_TAG if m.is_agent else SPEAKER_TAG, m.text) for m in messages]
    return header + "\n" + "\n".join(body)


def speaker_messages(transcript: str) -> list[str]:
    """The texts of the SPEAKER messages of a transcript (continuations joined back)."""
    out: list[str] = []
    current: list[str] | None = None
    for line in transcript.splitlines():
        if line.startswith(SPEAKER_TAG):
            if current is not None:
                out.append("\n".join(current))
            current = [line[len(SPEAKER_TAG) :]]
        elif line.startswith(_CONT) and current is not None:
            current.append(line[len(_CONT) :])
        else:
            if current is not None:
                out.append("\n".join(current))
            current = None
    if current is not None:
        out.append("\n".join(current))
    return out
