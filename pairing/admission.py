"""Admission: whether a sender on a channel is served. Pure functions."""

from __future__ import annotations

from collections.abc import Collection
from enum import StrEnum


class DmPolicy(StrEnum):
    """How a channel treats direct messages from people."""

    PAIRING = "pairing"
    ALLOWLIST = "allowlist"
    OPEN = "open"
    DISABLED = "disabled"


class GroupPolicy(StrEnum):
    """How a channel treats group conversations."""

    OPEN = "open"
    ALLOWLIST = "allowlist"
    DISABLED = "disabled"


class Admission(StrEnum):
    """What to do with a sender."""

    SERVE = "serve"  # run the turn (paired, or let in by allow_from / open)
    PAIR = "pair"  # send a pairing code and nothing else
    DENY = "deny"  # ignore (logged by the caller)


def admit_direct(
    policy: DmPolicy, *, paired: bool, platform_user_id: str, allow_from: Collection[str] = ()
) -> Admission:
    """Decide whether a direct message is served.

    A paired person is served under every policy but ``disabled``. Under
    ``pairing`` an unknown sender gets a code and nothing else, unless
    ``allow_from`` names them; under ``allowlist`` only ``allow_from`` senders
    (and paired people) are served; under ``open`` anyone is.
    """
    if policy is DmPolicy.DISABLED:
        return Admission.DENY
    if paired or platform_user_id in allow_from or policy is DmPolicy.OPEN:
        return Admission.SERVE
    if policy is DmPolicy.PAIRING:
        return Admission.PAIR
    return Admission.DENY


def admit_group(
    policy: GroupPolicy,
    *,
    conversation_ids: Collection[str],
    allow_channels: Collection[str] = (),
) -> Admission:
    """Decide whether a group conversation is served at all.

    ``conversation_ids`` are every id the conversation is known by (channel,
    parent channel, guild or team); under ``allowlist`` one of them must be in
    ``allow_channels``. Group messages never trigger pairing codes.
    """
    if policy is GroupPolicy.DISABLED:
        return Admission.DENY
    if policy is GroupPolicy.OPEN:
        return Admission.SERVE
    return Admission.SERVE if any(c in allow_channels for c in conversation_ids) else Admission.DENY
