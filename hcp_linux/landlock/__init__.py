"""Typed ctypes binding of the Linux Landlock LSM, standalone.

Landlock lets an unprivileged process deny itself filesystem, TCP-port and IPC access,
irreversibly, for itself and its future children. Common case::

    from hcp_linux import landlock
    from hcp_linux.landlock import AccessFs

    rs = landlock.Ruleset(handled_fs=landlock.ACCESS_FS_READ_WRITE)
    rs.add_path("/usr", landlock.ACCESS_FS_READ_EXECUTE)
    rs.add_path("/tmp/work", landlock.ACCESS_FS_READ_WRITE)
    with rs.create() as created:          # kernel ruleset; nothing enforced yet
        prctl(PR_SET_NO_NEW_PRIVS, 1)     # the caller's job: this binding never sets it
        created.restrict_self()           # irreversible, this thread and its children
        print(created.status)             # FULLY / PARTIALLY / NOT_ENFORCED

Rights unknown to the running kernel are masked by its ABI (BEST_EFFORT, recorded in
``created.facts``) or refused (``CompatLevel.HARD_REQUIREMENT`` / ``required=``). A created
ruleset's fd can be enforced from a forked child alone: ``landlock.restrict_self(fd)``.

Only the calling thread is restricted (TSYNC, ABI 8, extends it to all threads).
"""
from __future__ import annotations

from ._sys import restrict_self
from .compat import CompatLevel, Fact, FactKind, RulesetStatus, abi_version, errata
from .errors import (IncompatibleError, LandlockError, PathError, PortError, RulesetError,
                     SyscallError, UnsupportedError)
from .rights import (ACCESS_FS_READ, ACCESS_FS_READ_EXECUTE, ACCESS_FS_READ_WRITE,
                     ACCESS_FS_WRITE, DIR_ONLY_RIGHTS, LATEST_ABI, AccessFs, AccessNet,
                     RestrictFlags, Scope, introduced_in)
from .ruleset import CreatedRuleset, Ruleset

__all__ = [
    "ACCESS_FS_READ", "ACCESS_FS_READ_EXECUTE", "ACCESS_FS_READ_WRITE", "ACCESS_FS_WRITE",
    "DIR_ONLY_RIGHTS", "LATEST_ABI",
    "AccessFs", "AccessNet", "Scope", "RestrictFlags", "introduced_in",
    "CompatLevel", "RulesetStatus", "Fact", "FactKind", "abi_version", "errata",
    "Ruleset", "CreatedRuleset", "restrict_self",
    "LandlockError", "SyscallError", "RulesetError", "PortError", "PathError",
    "IncompatibleError", "UnsupportedError",
]
