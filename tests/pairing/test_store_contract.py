"""The pairing store's contract, on real SQLite and real PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from pairing import PairingError, PairingStore, Principal, Role
from pairing.commands import handle_command
from pairing.models import Identity, User
from pairing.store import CODE_ALPHABET, CODE_LENGTH
from tests.conftest import Clock


@pytest.fixture
def store(engine: AsyncEngine, clock: Clock) -> PairingStore:
    return PairingStore(engine, clock=clock)


async def _count(engine: AsyncEngine, model: type) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(model))).scalar_one())


async def test_added_user_resolves_with_stored_role(store: PairingStore) -> None:
    alice = await store.add_user("Alice", "admin", links=["discord:100", "teams:aad-1"])
    assert alice.id.startswith("u_")
    assert alice.identities == ("discord:100", "teams:aad-1")
    p = await store.resolve("discord", "100")
    assert p == Principal.human(alice.id, Role.ADMIN, "Alice")
    assert await store.resolve("teams", "aad-1") is not None
    assert await store.resolve("discord", "999") is None


async def test_role_change_is_recorded_with_who_and_when(store: PairingStore, clock: Clock) -> None:
    bob = await store.add_user("Bob", "user")
    clock.advance(minutes=5)
    await store.set_role(bob.id, "admin", by="u_root")
    assert (await store.get_user(bob.id)).role is Role.ADMIN
    history = await store.role_history(bob.id)
    assert [(old, new, by) for old, new, by, _ in history] == [(None, "user", "operator"), ("user", "admin", "u_root")]
    assert history[1][3] == clock.now


async def test_pairing_code_shape_and_repeat_dm_gets_same_code(store: PairingStore) -> None:
    first = await store.request_code("discord", "555", "Carol")
    assert len(first.code) == CODE_LENGTH
    assert set(first.code) <= set(CODE_ALPHABET)
    assert not set(first.code) & set("0O1IL")
    again = await store.request_code("discord", "555", "Carol")
    assert (again.code, again.new) == (first.code, False)


async def test_codes_expire_after_an_hour(store: PairingStore, clock: Clock) -> None:
    issued = await store.request_code("discord", "555", "Carol")
    clock.advance(minutes=61)
    assert await store.list_pending() == []
    with pytest.raises(PairingError, match="expired"):
        await store.approve("discord", issued.code, by="operator")
    fresh = await store.request_code("discord", "555", "Carol")
    assert fresh.new and fresh.code != issued.code


async def test_at_most_three_pending_per_channel(store: PairingStore, clock: Clock) -> None:
    for pid in ("1", "2", "3"):
        await store.request_code("discord", pid, f"p{pid}")
    with pytest.raises(PairingError, match="too many pending"):
        await store.request_code("discord", "4", "p4")
    # Another channel has its own limit, and expired requests stop counting.
    await store.request_code("teams", "4", "p4")
    clock.advance(hours=1, seconds=1)
    await store.request_code("discord", "4", "p4")


async def test_approve_creates_person_with_role(store: PairingStore, engine: AsyncEngine) -> None:
    issued = await store.request_code("teams", "aad-9", "Dana")
    user = await store.approve("teams", issued.code.lower(), role="admin", by="operator")
    assert user.role is Role.ADMIN and user.identities == ("teams:aad-9",)
    assert await store.list_pending() == []
    p = await store.resolve("teams", "aad-9")
    assert p is not None and p.role is Role.ADMIN


async def test_approve_with_user_links_existing_person(store: PairingStore) -> None:
    erin = await store.add_user("Erin", "user", links=["discord:42"])
    issued = await store.request_code("teams", "aad-42", "Erin (Teams)")
    linked = await store.approve("teams", issued.code, user_id=erin.id, by="operator")
    assert linked.id == erin.id
    assert linked.identities == ("discord:42", "teams:aad-42")


@pytest.mark.parametrize(
    ("setup", "call", "message"),
    [
        ("none", lambda s, code: s.approve("discord", "ZZZZZZZZ", by="op"), "no pairing code"),
        ("code", lambda s, code: s.approve("teams", code, by="op"), "belongs to channel discord"),
        ("approved", lambda s, code: s.approve("discord", code, by="op"), "already approved"),
        ("code", lambda s, code: s.approve("discord", code, role="owner", by="op"), "unknown role"),
        ("code", lambda s, code: s.approve("discord", code, user_id="u_nobody", by="op"), "no user 'u_nobody'"),
        ("none", lambda s, code: s.set_role("u_nobody", "admin", by="op"), "no user"),
        ("none", lambda s, code: s.link("u_nobody", "discord:1"), "no user"),
        ("none", lambda s, code: s.add_user("X", "user", links=["discord"]), "CHANNEL:PLATFORM_ID"),
    ],
)
async def test_bad_input_is_refused_without_partial_writes(
    store: PairingStore, engine: AsyncEngine, setup: str, call: object, message: str
) -> None:
    code = ""
    if setup in ("code", "approved"):
        code = (await store.request_code("discord", "77", "Frank")).code
    if setup == "approved":
        await store.approve("discord", code, by="op")
    users_before = await _count(engine, User)
    idents_before = await _count(engine, Identity)
    with pytest.raises((PairingError, ValueError), match=message):
        await call(store, code)  # type: ignore[operator]
    assert await _count(engine, User) == users_before
    assert await _count(engine, Identity) == idents_before


async def test_identity_cannot_be_linked_twice(store: PairingStore, engine: AsyncEngine) -> None:
    await store.add_user("G", "user", links=["discord:1"])
    with pytest.raises(PairingError, match="already linked"):
        await store.add_user("H", "user", links=["discord:1"])
    assert await _count(engine, User) == 1


async def test_reject_leaves_sender_unpaired(store: PairingStore) -> None:
    code = (await store.request_code("discord", "88", "Ivan")).code
    await store.reject("discord", code, by="op")
    assert await store.resolve("discord", "88") is None
    with pytest.raises(PairingError, match="rejected"):
        await store.approve("discord", code, by="op")


# ---- admin commands by DM ---------------------------------------------------------------------


async def _dm(store: PairingStore, channel: str, pid: str, text: str) -> str | None:
    principal = await store.resolve(channel, pid)
    return await handle_command(
        store, channel=channel, platform_user_id=pid, principal=principal, text=text, is_direct=True
    )


async def test_admin_approves_by_dm_and_non_admin_is_refused_and_logged(store: PairingStore) -> None:
    await store.add_user("Admin", "admin", links=["discord:1"])
    await store.add_user("User", "user", links=["discord:2"])
    code = (await store.request_code("teams", "aad-new", "Newcomer")).code

    refused = await _dm(store, "discord", "2", f"/pair approve {code} admin")
    assert refused is not None and "administrators" in refused
    assert await store.resolve("teams", "aad-new") is None
    log = await store.audit_log()
    assert log[0][3:5] == ("pair", "refused")

    listing = await _dm(store, "discord", "1", "/pair list")
    assert listing is not None and code in listing
    ok = await _dm(store, "discord", "1", f"/pair approve {code} user")
    assert ok is not None and "role user" in ok
    p = await store.resolve("teams", "aad-new")
    assert p is not None and p.role is Role.USER


async def test_role_command_by_dm(store: PairingStore) -> None:
    await store.add_user("Admin", "admin", links=["teams:a"])
    bob = await store.add_user("Bob", "user", links=["teams:b"])
    assert "now has role admin" in (await _dm(store, "teams", "a", f"/role {bob.id} admin") or "")
    assert "unknown role" in (await _dm(store, "teams", "a", f"/role {bob.id} superuser") or "")
    assert "no user" in (await _dm(store, "teams", "a", "/role u_missing user") or "")


async def test_text_claiming_admin_never_grants_the_command(store: PairingStore) -> None:
    await store.add_user("Mallory", "user", links=["discord:666"])
    code = (await store.request_code("discord", "667", "Sock puppet")).code
    reply = await _dm(store, "discord", "666", f"/pair approve {code} admin   # I am the admin, trust me")
    assert reply is not None and "administrators" in reply
    assert await store.resolve("discord", "667") is None


async def test_link_command_joins_two_channels_into_one_person(store: PairingStore, clock: Clock) -> None:
    judy = await store.add_user("Judy", "user", links=["discord:10"])
    reply = await _dm(store, "discord", "10", "/link")
    assert reply is not None
    code = reply.split("code is ")[1].split(".")[0]
    # The same code from the same channel is refused; from Teams it links.
    assert "another channel" in (await _dm(store, "discord", "10", f"/link {code}") or "")
    linked = await _dm(store, "teams", "aad-judy", f"/link {code}")
    assert linked is not None and judy.id in linked
    p = await store.resolve("teams", "aad-judy")
    assert p is not None and p.user_id == judy.id
    assert "unknown or used" in (await _dm(store, "teams", "aad-other", f"/link {code}") or "")


async def test_link_code_expires(store: PairingStore, clock: Clock) -> None:
    await store.add_user("Kim", "user", links=["discord:11"])
    reply = await _dm(store, "discord", "11", "/link") or ""
    code = reply.split("code is ")[1].split(".")[0]
    clock.advance(minutes=16)
    assert "expired" in (await _dm(store, "teams", "aad-kim", f"/link {code}") or "")
    assert await store.resolve("teams", "aad-kim") is None


async def test_commands_are_ignored_in_group_conversations(store: PairingStore) -> None:
    await store.add_user("Admin", "admin", links=["discord:1"])
    principal = await store.resolve("discord", "1")
    reply = await handle_command(
        store, channel="discord", platform_user_id="1", principal=principal, text="/pair list", is_direct=False
    )
    assert reply is None
