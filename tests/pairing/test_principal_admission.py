"""Pure rules: who is an admin, and who is served on a channel."""

import pytest

from pairing import Admission, DmPolicy, GroupPolicy, Principal, Role, admit_direct, admit_group, is_human_admin
from pairing.commands import parse_command, refusal_for


@pytest.mark.parametrize(
    ("principal", "expected"),
    [
        (Principal.human("u_a", Role.ADMIN, "Alice"), True),
        (Principal.human("u_b", Role.USER, "Bob"), False),
        (Principal.unpaired("Mallory, admin"), False),
        (Principal.system("cron-system"), False),
        (Principal.system("sop-system"), False),
        (Principal.system("webhook-system"), False),
        (None, False),
    ],
)
def test_only_a_paired_human_with_stored_admin_role_is_admin(principal: Principal | None, expected: bool) -> None:
    assert is_human_admin(principal) is expected


def test_unknown_system_principal_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown system principal"):
        Principal.system("root-system")


def test_stored_role_of_each_kind() -> None:
    assert Principal.human("u_a", Role.ADMIN).stored_role == "admin"
    assert Principal.human("u_b", Role.USER).stored_role == "user"
    assert Principal.unpaired("x").stored_role is None
    assert Principal.system("webhook-system").stored_role == "webhook-system"


@pytest.mark.parametrize(
    ("policy", "paired", "allowed", "expected"),
    [
        (DmPolicy.PAIRING, True, False, Admission.SERVE),
        (DmPolicy.PAIRING, False, False, Admission.PAIR),
        (DmPolicy.PAIRING, False, True, Admission.SERVE),
        (DmPolicy.ALLOWLIST, True, False, Admission.SERVE),
        (DmPolicy.ALLOWLIST, False, False, Admission.DENY),
        (DmPolicy.ALLOWLIST, False, True, Admission.SERVE),
        (DmPolicy.OPEN, False, False, Admission.SERVE),
        (DmPolicy.OPEN, True, False, Admission.SERVE),
        (DmPolicy.DISABLED, True, False, Admission.DENY),
        (DmPolicy.DISABLED, False, True, Admission.DENY),
    ],
)
def test_dm_admission_policy(policy: DmPolicy, paired: bool, allowed: bool, expected: Admission) -> None:
    allow = ["111"] if allowed else ["999"]
    assert admit_direct(policy, paired=paired, platform_user_id="111", allow_from=allow) is expected


@pytest.mark.parametrize(
    ("policy", "ids", "allow", "expected"),
    [
        (GroupPolicy.OPEN, ["c1"], [], Admission.SERVE),
        (GroupPolicy.DISABLED, ["c1"], ["c1"], Admission.DENY),
        (GroupPolicy.ALLOWLIST, ["c1", "guild9"], ["guild9"], Admission.SERVE),
        (GroupPolicy.ALLOWLIST, ["c1"], ["c2"], Admission.DENY),
    ],
)
def test_group_admission_policy(policy: GroupPolicy, ids: list[str], allow: list[str], expected: Admission) -> None:
    assert admit_group(policy, conversation_ids=ids, allow_channels=allow) is expected


@pytest.mark.parametrize("text", ["/pair list", "/pair approve ABCDEFGH admin", "/role u_x admin"])
@pytest.mark.parametrize(
    "principal",
    [Principal.human("u_b", Role.USER), Principal.unpaired("I am the admin"), Principal.system("cron-system"), None],
)
def test_admin_commands_refused_for_everyone_but_human_admins(text: str, principal: Principal | None) -> None:
    command = parse_command(text)
    assert command is not None
    refusal = refusal_for(principal, command)
    assert refusal is not None and "administrators" in refusal


def test_admin_commands_allowed_for_human_admin() -> None:
    command = parse_command("/pair approve ABCDEFGH")
    assert command is not None
    assert refusal_for(Principal.human("u_a", Role.ADMIN), command) is None


def test_ordinary_text_and_unknown_commands_are_not_commands() -> None:
    assert parse_command("please /pair me") is None
    assert parse_command("/shrug") is None
    assert parse_command("  /PAIR list") == parse_command("/pair list")
