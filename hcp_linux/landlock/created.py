"""The kernel ruleset made by :meth:`Ruleset.create`: enforce it, or add rules to it later.

It records what the builder dropped (:attr:`CreatedRuleset.facts`) and reports honestly what the
kernel enforces (:attr:`CreatedRuleset.status`).
"""
from __future__ import annotations

import os

from . import _sys
from ._rules import (Handled, PathRule, PortRule, add_rule, check_access_fs, check_port,
                     fstat_is_dir, missing_message, plan_path_access)
from .compat import CompatLevel, Fact, FactKind, RulesetStatus
from .errors import IncompatibleError, LandlockError
from .rights import AccessFs, AccessNet, RestrictFlags


def ruleset_status(enforceable: bool, abi: int, requested: Handled,
                   handled: Handled) -> RulesetStatus:
    """What a ruleset enforces (see :attr:`CreatedRuleset.status`)."""
    if not enforceable or abi == 0:
        return RulesetStatus.NOT_ENFORCED
    refer_free = AccessFs.REFER if handled.fs else AccessFs(0)
    weaker = ((requested.fs & ~handled.fs & ~refer_free) | (requested.net & ~handled.net)
              | (requested.scoped & ~handled.scoped))
    return RulesetStatus.PARTIALLY_ENFORCED if weaker else RulesetStatus.FULLY_ENFORCED


class CreatedRuleset:
    """A kernel ruleset, ready to enforce; holds its fd (O_CLOEXEC) until :meth:`close`.

    The fd alone is enough to enforce it, e.g. in a forked child:
    ``landlock.restrict_self(created.fd)``. Rules may still be added (``add_path_fd``), e.g.
    by a child for a /proc it just mounted; the kernel ruleset is shared by every process
    holding the fd, and frozen into a domain only at restrict_self.
    """

    def __init__(self, fd: int, abi: int, requested: Handled, handled: Handled,
                 compat: CompatLevel, facts: list[Fact]) -> None:
        self.fd = fd
        self.abi = abi
        self.requested_fs = requested.fs
        self.requested_net = requested.net
        self.requested_scoped = requested.scoped
        self.handled_fs = handled.fs
        self.handled_net = handled.net
        self.scoped = handled.scoped
        self.compat = compat
        self._facts = list(facts)
        self._enforceable = fd >= 0

    @property
    def facts(self) -> tuple[Fact, ...]:
        """Everything dropped, skipped or stripped, in order."""
        return tuple(self._facts)

    @property
    def dropped(self) -> dict[str, int]:
        """Requested rights the ABI lacks, by field (``handled_fs``, ``handled_net``,
        ``scoped``, ``restrict_flags``); only non-empty fields appear."""
        return {f.subject: f.bits for f in self._facts if f.kind is FactKind.UNSUPPORTED}

    @property
    def status(self) -> RulesetStatus:
        """FULLY when every requested restriction is in force, PARTIALLY when some right stays
        allowed because the ABI lacks it, NOT when nothing is enforced at all.

        Stripped dir-only rights and skipped optional paths do not lower it: they only ever
        remove *allowances*. Nor does REFER dropped at ABI 1: that kernel denies every
        cross-directory rename/link of a sandboxed process, which is stricter, not looser.
        """
        return ruleset_status(self._enforceable, self.abi,
                              Handled(self.requested_fs, self.requested_net, self.requested_scoped),
                              Handled(self.handled_fs, self.handled_net, self.scoped))

    def _check_open(self) -> None:
        if self._enforceable and self.fd < 0:
            raise LandlockError("ruleset is closed")

    def add_path_fd(self, fd: int, access: AccessFs | int) -> None:
        """Add a rule for an open fd (O_PATH is fine; not closed here), with the same checks,
        ABI masking and dir-only stripping as :meth:`Ruleset.add_path`."""
        self._check_open()
        label = f"fd {fd}"
        access = check_access_fs(access, self.requested_fs, label)
        is_dir = fstat_is_dir(fd, label, fd)
        effective = plan_path_access(access, self.handled_fs, is_dir, label, self._facts)
        if effective:
            add_rule(self.fd, PathRule(fd, False, effective, label))

    def add_port(self, port: int, access: AccessNet) -> None:
        """Add a TCP port rule after creation, with the same checks as :meth:`Ruleset.add_port`."""
        self._check_open()
        port, access = check_port(port, access, self.requested_net)
        effective = access & self.handled_net
        if effective:
            add_rule(self.fd, PortRule(port, AccessNet(effective)))
        else:
            self._facts.append(Fact(FactKind.RULE_SKIPPED, f"port {port}", int(access),
                                    f"no right of {access.describe()} is handled at this ABI"))

    def restrict_self(self, flags: RestrictFlags = RestrictFlags(0)) -> None:
        """Enforce on the calling thread and its future children. Irreversible.

        Flags the ABI lacks are dropped and recorded (BEST_EFFORT) or refused
        (HARD_REQUIREMENT). The caller must set no_new_privs first (this binding never does):
        without it the kernel answers EPERM for non-root, raised as an OSError with that hint.
        A NOT_ENFORCED ruleset (no kernel object) makes this a no-op; check ``status``.
        """
        self._check_open()
        flags = RestrictFlags.check(flags, "restrict_self flags")
        lacking = flags & ~RestrictFlags.from_abi(self.abi)
        if lacking:
            if self.compat is CompatLevel.HARD_REQUIREMENT:
                raise IncompatibleError(missing_message([lacking], self.abi), [lacking],
                                        self.abi)
            self._facts.append(Fact(FactKind.UNSUPPORTED, "restrict_flags", int(lacking),
                                    f"{lacking.describe()} unknown at ABI {self.abi}"))
        if self._enforceable:
            _sys.restrict_self(self.fd, int(flags & ~lacking))

    def fileno(self) -> int:
        return self.fd

    def close(self) -> None:
        """Close the ruleset fd (idempotent). Domains already enforced are unaffected."""
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def __enter__(self) -> CreatedRuleset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"CreatedRuleset(fd={self.fd}, abi={self.abi}, status={self.status.name}, "
                f"handled_fs={self.handled_fs.describe()}, handled_net="
                f"{self.handled_net.describe()}, scoped={self.scoped.describe()})")
