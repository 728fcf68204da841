"""``/help`` lists what the asker may run, and only that (authority from the pairing role)."""

from __future__ import annotations

import pytest

from pairing.commands import ADMIN_COMMANDS, Command, help_for, refusal_for
from pairing.principal import Principal, Role

ADMIN = Principal.human("u_a", Role.ADMIN, "Ada")
USER = Principal.human("u_b", Role.USER, "Bob")


@pytest.mark.parametrize("principal", [ADMIN, USER, Principal.unpaired("Stranger"), None])
def test_help_names_only_commands_the_principal_may_run(principal: Principal | None) -> None:
    text = help_for(principal)
    for name in sorted(ADMIN_COMMANDS):
        listed = f"/{name} " in text
        allowed = refusal_for(principal, Command(name, ("list",))) is None
        assert listed == allowed, (name, text)


def test_a_user_is_shown_whoami_and_link() -> None:
    assert "/whoami" in help_for(USER) and "/link" in help_for(USER)
