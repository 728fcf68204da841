"""Who someone is and what role they hold.

The pairing store is the only source of authority in goclaw: a person's role is
the one an operator or admin gave them when they were paired, never anything a
message says. This package depends on nothing else in the project.
"""

from pairing.admission import Admission, DmPolicy, GroupPolicy, admit_direct, admit_group
from pairing.principal import (
    SYSTEM_PRINCIPALS,
    Principal,
    PrincipalKind,
    Role,
    is_human_admin,
)
from pairing.store import PairingError, PairingStore

__all__ = [
    "SYSTEM_PRINCIPALS",
    "Admission",
    "DmPolicy",
    "GroupPolicy",
    "PairingError",
    "PairingStore",
    "Principal",
    "PrincipalKind",
    "Role",
    "admit_direct",
    "admit_group",
    "is_human_admin",
]
