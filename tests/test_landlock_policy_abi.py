"""The Landlock rights the policy handles are pinned to a named ABI (rulesets.POLICY_ABI).

When the Landlock binding learns a newer ABI (its LATEST_ABI), the rights a command is
confined by must not change with it: this test lists them by name, so a bump is a
deliberate edit here and in rulesets.py, and a binding upgrade alone changes nothing.
"""
from __future__ import annotations

from hcp_linux import landlock
from hcp_linux.plan.rulesets import POLICY_ABI, landlock_ruleset
from hcp_linux.policy.policy import LAYERS, Policy

HANDLED_FS = {"EXECUTE", "WRITE_FILE", "READ_FILE", "READ_DIR", "REMOVE_DIR", "REMOVE_FILE",
              "MAKE_CHAR", "MAKE_DIR", "MAKE_REG", "MAKE_SOCK", "MAKE_FIFO", "MAKE_BLOCK",
              "MAKE_SYM", "REFER", "TRUNCATE", "IOCTL_DEV", "RESOLVE_UNIX"}
HANDLED_NET = {"BIND_TCP", "CONNECT_TCP"}
SCOPES = {"ABSTRACT_UNIX_SOCKET", "SIGNAL"}


def _names(flags: landlock.AccessFs | landlock.AccessNet | landlock.Scope) -> set[str]:
    return {m.name for m in type(flags) if m & flags and m.name}


def test_the_policy_abi_is_pinned_and_known_to_the_binding() -> None:
    assert POLICY_ABI == 9
    assert POLICY_ABI <= landlock.LATEST_ABI


def test_the_handled_rights_are_those_of_the_pinned_abi(tmp_path) -> None:
    # without a network namespace the policy also handles TCP (network = none)
    rs = landlock_ruleset(Policy(jail=str(tmp_path)), frozenset(LAYERS) - {"netns"})
    assert _names(rs.requested_fs) == HANDLED_FS
    # what the kernel handles: the same, less what this kernel's ABI lacks
    assert _names(rs.handled_fs) == HANDLED_FS & _names(
        landlock.AccessFs.from_abi(landlock.abi_version()))
    assert _names(rs.handled_net) == HANDLED_NET
    assert _names(rs.scoped) == SCOPES
