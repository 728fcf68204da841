"""The ``automation:`` section of the YAML: SOPs and their triggers.

Validated like the rest of the config (``gateway.config.load_config`` names the
key path and line of every problem). Example::

    automation:
      sops:
        - name: daily-report
          instruction: "Produce the daily report and post it."
          trigger: {cron: "0 7 * * 1-5", tz: Europe/Berlin}
          deliver_to: "teams:19:abc@thread.tacv2"
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from gateway.automation.schedule import Trigger, check_cron, check_tz, make_trigger, parse_at, parse_every

SOP_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
DELIVERY_CHANNELS = ("discord", "teams")
MIN_SECRET_CHARS = 16


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def check_name(name: str) -> str:
    """An SOP name: lower-case letters, digits, '-' and '_', at most 64 characters.

    Raises:
        ValueError: otherwise (names appear in URLs, /hooks/<name>, and session keys).
    """
    if not SOP_NAME.match(name):
        raise ValueError(
            f"SOP name {name!r}: use lower-case letters, digits, '-' and '_' "
            "(at most 64, starting with a letter or digit)"
        )
    return name


def check_target(target: str) -> str:
    """A delivery target: ``discord:<channel id>`` or ``teams:<conversation id>``.

    Raises:
        ValueError: naming the unknown channel, or what is missing.
    """
    channel, sep, where = target.partition(":")
    if not sep:
        raise ValueError(f"delivery target {target!r}: write discord:<channel id> or teams:<conversation id>")
    if channel not in DELIVERY_CHANNELS:
        raise ValueError(
            f"unknown delivery channel {channel!r} in {target!r}: use discord:<channel id> or teams:<conversation id>"
        )
    if not where.strip():
        raise ValueError(
            f"delivery target {target!r} has no {'channel' if channel == 'discord' else 'conversation'} id"
        )
    if channel == "discord" and not where.isdigit():
        raise ValueError(
            f"delivery target {target!r}: a Discord channel id is a number (e.g. discord:123456789012345678)"
        )
    return target


def check_secret(secret: str) -> str:
    """A webhook secret long enough to sign with.

    Raises:
        ValueError: shorter than 16 characters.
    """
    if len(secret) < MIN_SECRET_CHARS:
        raise ValueError(f"a webhook secret must be at least {MIN_SECRET_CHARS} characters (e.g. openssl rand -hex 32)")
    return secret


class WebhookTriggerConfig(_Model):
    """``webhook: {secret: ${ENV}}``: callers sign POST /hooks/<name> with this secret."""

    secret: SecretStr

    @field_validator("secret")
    @classmethod
    def _long_enough(cls, v: SecretStr) -> SecretStr:
        check_secret(v.get_secret_value())
        return v


class TriggerConfig(_Model):
    """Exactly one of ``cron`` (with optional ``tz``), ``every``, ``at``, ``manual``, ``webhook``."""

    cron: str | None = None
    tz: str | None = None
    every: str | None = None
    at: str | datetime | None = None
    manual: bool | None = None
    webhook: WebhookTriggerConfig | None = None

    @field_validator("cron")
    @classmethod
    def _cron(cls, v: str | None) -> str | None:
        return None if v is None else check_cron(" ".join(v.split()))

    @field_validator("tz")
    @classmethod
    def _tz(cls, v: str | None) -> str | None:
        if v is not None:
            check_tz(v)
        return v

    @field_validator("every")
    @classmethod
    def _every(cls, v: str | None) -> str | None:
        if v is not None:
            parse_every(v)
        return v

    @field_validator("at")
    @classmethod
    def _at(cls, v: str | datetime | None) -> str | datetime | None:
        if v is not None:
            parse_at(v)
        return v

    @model_validator(mode="after")
    def _exactly_one(self) -> TriggerConfig:
        self.trigger()
        return self

    def trigger(self) -> Trigger:
        """The validated trigger."""
        return make_trigger(
            cron=self.cron,
            tz=self.tz,
            every=self.every,
            at=self.at,
            manual=bool(self.manual),
            webhook=self.webhook is not None,
        )


class SopConfig(_Model):
    """One standing procedure."""

    name: str
    instruction: str = Field(min_length=1, max_length=20_000)
    trigger: TriggerConfig
    deliver_to: str | None = None
    enabled: bool = True
    research: bool = False
    scope: list[str] = Field(default_factory=list)
    catch_up: Literal["once", "skip"] = "once"

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_name(v)

    @field_validator("instruction")
    @classmethod
    def _instruction(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("instruction is empty: say what the agent is to do")
        return v.strip()

    @field_validator("deliver_to")
    @classmethod
    def _target(cls, v: str | None) -> str | None:
        return None if v is None else check_target(v)

    @field_validator("scope", mode="before")
    @classmethod
    def _tags(cls, v: object) -> object:
        return [str(x) for x in v] if isinstance(v, list) else v


class AutomationConfig(_Model):
    """SOPs, the scheduler's step and the webhook body limit."""

    sops: list[SopConfig] = Field(default_factory=list)
    poll_seconds: float = Field(default=15.0, ge=0.05, le=3600)
    webhook_max_bytes: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _unique_names(self) -> AutomationConfig:
        seen: set[str] = set()
        for sop in self.sops:
            if sop.name in seen:
                raise ValueError(f"two SOPs are named {sop.name!r}: names must be unique")
            seen.add(sop.name)
        return self
