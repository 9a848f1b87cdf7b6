"""ABI detection and the vocabulary of compatibility: levels, status, recorded facts.

A sandbox built on an older kernel silently protects less. This module gives the caller the
words to decide and to know: :class:`CompatLevel` says whether a shortfall is tolerated,
:class:`RulesetStatus` says honestly what was enforced, and :class:`Fact` records each thing
that was dropped, skipped or stripped on the way, so nothing is lost without a trace.
"""
from __future__ import annotations

import enum
import errno
import functools
from dataclasses import dataclass

from . import _sys
from .errors import SyscallError


@functools.lru_cache(maxsize=None)
def abi_version() -> int:
    """The running kernel's Landlock ABI; 0 when Landlock is absent or disabled.

    ENOSYS (not built in, or an unknown architecture) and EOPNOTSUPP (built in but not enabled
    at boot) mean "no Landlock". Any other errno (a seccomp filter returning EPERM, say) is
    unexpected and raised as :class:`~landlock.errors.SyscallError` rather than guessed at.
    Cached: the ABI cannot change while the kernel runs.
    """
    try:
        return _sys.abi_version()
    except SyscallError as e:
        if e.errno in (errno.ENOSYS, errno.EOPNOTSUPP):
            return 0
        raise


def errata() -> int:
    """Bitmask of Landlock fixes the kernel reports (``LANDLOCK_CREATE_RULESET_ERRATA``).

    0 on kernels that predate the query (they answer EINVAL) or without Landlock.
    """
    try:
        return _sys.errata()
    except SyscallError as e:
        if e.errno in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            return 0
        raise


class CompatLevel(enum.Enum):
    """What to do when the kernel lacks a requested right."""

    #: Drop what the kernel lacks, record a :class:`Fact`, report it in the status.
    BEST_EFFORT = "best_effort"
    #: Raise :class:`~landlock.errors.IncompatibleError` instead of dropping anything.
    HARD_REQUIREMENT = "hard_requirement"


class RulesetStatus(enum.Enum):
    """How much of the requested restriction the kernel really enforces."""

    #: Everything requested is handled.
    FULLY_ENFORCED = "fully_enforced"
    #: Some requested rights are unknown to the kernel and so remain allowed everywhere.
    PARTIALLY_ENFORCED = "partially_enforced"
    #: Nothing is enforced: no Landlock (ABI 0), or every requested right was dropped.
    NOT_ENFORCED = "not_enforced"


class FactKind(enum.Enum):
    """Kinds of things the builder dropped on the way from request to kernel."""

    #: Handled rights, scopes or restrict flags the ABI does not know (``bits``).
    UNSUPPORTED = "unsupported"
    #: An ``optional=True`` path that does not exist; its rule was not added.
    PATH_SKIPPED = "path_skipped"
    #: Directory-only rights removed from a rule on a non-directory (``bits``).
    DIR_RIGHTS_STRIPPED = "dir_rights_stripped"
    #: A rule whose every right was masked away by the ABI; not added (``bits`` it asked for).
    RULE_SKIPPED = "rule_skipped"


@dataclass(frozen=True)
class Fact:
    """One recorded compatibility fact: what kind, about what, which bits, in words."""

    kind: FactKind
    subject: str
    bits: int
    detail: str
