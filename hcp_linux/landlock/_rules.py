"""Rule plumbing shared by the builder and the created ruleset.

Both :class:`~landlock.ruleset.Ruleset` (before the kernel object exists) and
:class:`~landlock.created.CreatedRuleset` (after) accept path and port rules; the checks, the
ABI masking and the dir-only stripping live here once so the two cannot disagree.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from . import _sys
from .compat import Fact, FactKind
from .errors import PathError, PortError, RulesetError, SyscallError
from .rights import DIR_ONLY_RIGHTS, AccessFs, AccessNet, Scope, _AbiFlag


@dataclass
class Handled:
    """One triple of fs/net/scoped rights (requested, or really handled after masking)."""

    fs: AccessFs
    net: AccessNet
    scoped: Scope

    def masked(self, abi: int) -> Handled:
        return Handled(self.fs & AccessFs.from_abi(abi), self.net & AccessNet.from_abi(abi),
                       self.scoped & Scope.from_abi(abi))

    def items(self) -> list[tuple[str, _AbiFlag]]:
        return [("handled_fs", self.fs), ("handled_net", self.net), ("scoped", self.scoped)]

    def __bool__(self) -> bool:
        return bool(self.fs or self.net or self.scoped)


@dataclass
class PathRule:
    """A path rule waiting for the kernel ruleset; the fd was opened (or given) at add time."""

    fd: int
    owned: bool  # opened by us, so closed by us
    access: AccessFs
    label: str


@dataclass
class PortRule:
    """A TCP port rule waiting for the kernel ruleset."""

    port: int
    access: AccessNet


def missing_message(missing: list[_AbiFlag], abi: int) -> str:
    """Name each missing right and the ABI that would have it, so the fix is obvious."""
    parts = [f"{type(m).__name__}.{m.describe()} (needs ABI {type(m).introduced_in(m)})"
             for m in missing]
    return f"Landlock ABI {abi} lacks required rights: " + ", ".join(parts)


def plan_path_access(access: AccessFs, handled: AccessFs, is_dir: bool, label: str,
                     facts: list[Fact]) -> AccessFs:
    """The access a path rule really carries: masked by what is handled, dir-only rights
    stripped on non-directories (the kernel would answer EINVAL). Records what was removed."""
    effective = access & handled
    if not is_dir and effective & DIR_ONLY_RIGHTS:
        stripped = effective & DIR_ONLY_RIGHTS
        effective &= ~DIR_ONLY_RIGHTS
        facts.append(Fact(FactKind.DIR_RIGHTS_STRIPPED, label, int(stripped),
                          f"{stripped.describe()} only apply to directories"))
    if access and not effective:
        facts.append(Fact(FactKind.RULE_SKIPPED, label, int(access),
                          f"nothing of {access.describe()} is left after ABI masking and "
                          "dir-only stripping"))
    return AccessFs(effective)


def check_access_fs(access: AccessFs | int, requested: AccessFs, label: str
                    ) -> AccessFs:
    """Refuse unknown bits, an empty access, and rights the ruleset does not handle.

    Checked against what was *requested*, not what the ABI kept: a caller's mistake must
    fail the same way on every kernel, not only on new ones.
    """
    access = AccessFs.check(access, f"access for {label}")
    if not access:
        raise RulesetError(f"empty access for {label}")
    extra = access & ~requested
    if extra:
        raise RulesetError(f"{label}: rights not in handled_fs: {extra.describe()}", int(extra))
    return access


def check_port(port: object, access: AccessNet, requested: AccessNet) -> tuple[int, AccessNet]:
    """Refuse a port outside 0..65535 (the kernel takes a u64), then check access like fs."""
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise PortError(f"port {port!r} outside 0..65535", port)
    access = AccessNet.check(access, f"access for port {port}")
    if not access:
        raise RulesetError(f"empty access for port {port}")
    extra = access & ~requested
    if extra:
        raise RulesetError(f"port {port}: rights not in handled_net: {extra.describe()}",
                           int(extra))
    return port, access


def fstat_is_dir(fd: int, label: str, path: object) -> bool:
    """Directory or not decides dir-only stripping; a bad fd is the caller's PathError."""
    try:
        return stat.S_ISDIR(os.fstat(fd).st_mode)
    except OSError as e:
        raise PathError(f"{label}: {e.strerror}", path, e.errno or 0) from e


def add_rule(fd: int, rule: PathRule | PortRule) -> None:
    """Add one rule to a kernel ruleset (``fd == -1``: nothing is enforced, nothing to add)."""
    if fd < 0:
        return
    if isinstance(rule, PortRule):
        _sys.add_net_port(fd, int(rule.access), rule.port)
        return
    try:
        _sys.add_path_beneath(fd, int(rule.access), rule.fd)
    except SyscallError as e:
        raise PathError(f"{rule.label}: {e.strerror}", rule.label, e.errno or 0) from e
