"""The ruleset builder, :class:`Ruleset`; what it makes is a :class:`CreatedRuleset`.

The builder validates everything in Python first (unknown bits, rights not handled, missing
paths, ABI shortfalls) so the kernel only ever sees a request it will accept; it opens each
path once, at ``add_path``, and keeps the fd, so a path cannot be swapped between the check and
the rule. ``create()`` makes the kernel ruleset in one go and never enforces it: enforcing is
a separate, explicit, irreversible step (:meth:`CreatedRuleset.restrict_self`, or
:func:`landlock.restrict_self` from the fd alone in a forked child).
"""
from __future__ import annotations

import os
from typing import Iterable, TypeVar, Union

from . import _sys
from ._rules import (Handled, PathRule, PortRule, add_rule, check_access_fs, check_port,
                     fstat_is_dir, missing_message, plan_path_access)
from .compat import CompatLevel, Fact, FactKind, RulesetStatus, abi_version
from .created import CreatedRuleset, ruleset_status
from .errors import IncompatibleError, PathError, RulesetError, UnsupportedError
from .rights import AccessFs, AccessNet, Scope, _AbiFlag

AnyRights = Union[AccessFs, AccessNet, Scope]
Required = Union[AnyRights, Iterable[AnyRights], None]
_R = TypeVar("_R", bound="Ruleset")
PathArg = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]", int]

_MISSING_ERRNOS = (2, 20)  # ENOENT, ENOTDIR: "the path does not exist" for optional=True


def _effective_abi(override: int | None) -> int:
    """The ABI to build for: the kernel's, or a lower one to simulate an older kernel.

    An override above the running ABI is clamped: rights the kernel lacks cannot be simulated.
    """
    running = abi_version()
    if override is None:
        return running
    if not isinstance(override, int) or isinstance(override, bool) or override < 0:
        raise RulesetError(f"abi must be a non-negative int, got {override!r}")
    return min(override, running)


def _split_required(required: Required) -> Handled:
    """Sum ``required`` (one flag or an iterable of flags) into one value per flag type."""
    out = Handled(AccessFs(0), AccessNet(0), Scope(0))
    if required is None:
        return out
    items = [required] if isinstance(required, int) else list(required)
    for item in items:
        if isinstance(item, AccessFs):
            out.fs |= AccessFs.check(item, "required")
        elif isinstance(item, AccessNet):
            out.net |= AccessNet.check(item, "required")
        elif isinstance(item, Scope):
            out.scoped |= Scope.check(item, "required")
        else:
            raise RulesetError(f"required: expected AccessFs, AccessNet or Scope, got {item!r}")
    return out


class Ruleset:
    """Describe a Landlock ruleset: what is handled (denied unless a rule allows it), and rules.

    ``handled_fs``/``handled_net``/``scoped`` are what you want restricted. Rights the ABI lacks
    are dropped and recorded (``BEST_EFFORT``), or refused with :class:`IncompatibleError`
    (``HARD_REQUIREMENT``, or for anything named in ``required``). ``abi`` simulates an older
    kernel: rights above it are masked exactly as that kernel would need.
    """

    def __init__(self, *, handled_fs: AccessFs = AccessFs(0), handled_net: AccessNet = AccessNet(0),
                 scoped: Scope = Scope(0), required: Required = (),
                 compat: CompatLevel = CompatLevel.BEST_EFFORT, abi: int | None = None) -> None:
        if not isinstance(compat, CompatLevel):
            raise RulesetError(f"compat must be a CompatLevel, got {compat!r}")
        self._requested = Handled(AccessFs.check(handled_fs, "handled_fs"),
                                   AccessNet.check(handled_net, "handled_net"),
                                   Scope.check(scoped, "scoped"))
        if not self._requested:
            raise RulesetError("empty ruleset: handled_fs, handled_net and scoped are all 0")
        self._compat = compat
        self._abi = _effective_abi(abi)
        self._handled = self._requested.masked(self._abi)
        self._facts: list[Fact] = []
        self._rules: list[PathRule | PortRule] = []
        self._done = False
        self._check_requirements(_split_required(required))
        for name, requested in self._requested.items():
            lacking = requested & ~type(requested).from_abi(self._abi)
            if lacking:
                self._facts.append(Fact(FactKind.UNSUPPORTED, name, int(lacking),
                                        f"{lacking.describe()} unknown at ABI {self._abi}"))

    def _check_requirements(self, required: Handled) -> None:
        """Refuse required rights that are not handled, then rights the ABI lacks."""
        for (name, want), (_, have) in zip(required.items(), self._requested.items()):
            extra = want & ~have
            if extra:
                raise RulesetError(f"required {extra.describe()} not in {name}", int(extra))
        hard = self._compat is CompatLevel.HARD_REQUIREMENT
        needed = self._requested if hard else required
        missing: list[_AbiFlag] = []
        for (_, want), (_, have) in zip(needed.items(), self._handled.items()):
            if want & ~have:
                missing.append(type(want)(want & ~have))
        if not missing:
            return
        if self._abi == 0:
            raise UnsupportedError("Landlock is not supported or disabled (ABI 0), but "
                                   + ", ".join(f"{type(m).__name__}.{m.describe()}"
                                               for m in missing) + " is required",
                                   missing, 0)
        raise IncompatibleError(missing_message(missing, self._abi), missing, self._abi)

    @property
    def abi(self) -> int:
        """The ABI this ruleset is built for (running, or the lower simulated one)."""
        return self._abi

    @property
    def facts(self) -> tuple[Fact, ...]:
        return tuple(self._facts)

    # What create() will make, known before it (for a caller that has the kernel ruleset made
    # elsewhere from the same description, e.g. by a helper program from path_rules()).

    @property
    def requested_fs(self) -> AccessFs:
        return self._requested.fs

    @property
    def handled_fs(self) -> AccessFs:
        """Handled filesystem rights after ABI masking: what the kernel ruleset will handle."""
        return self._handled.fs

    @property
    def handled_net(self) -> AccessNet:
        return self._handled.net

    @property
    def scoped(self) -> Scope:
        return self._handled.scoped

    @property
    def status(self) -> RulesetStatus:
        """The :attr:`CreatedRuleset.status` that :meth:`create` will give."""
        return ruleset_status(self._abi > 0 and bool(self._handled), self._abi, self._requested,
                              self._handled)

    def path_rules(self) -> list[tuple[int, AccessFs]]:
        """(fd, effective access) of each path rule, in order: after ABI masking and dir-only
        stripping, as create() will add them."""
        return [(r.fd, r.access) for r in self._rules if isinstance(r, PathRule)]

    def _check_open(self) -> None:
        if self._done:
            raise RulesetError("this Ruleset was already created or closed")

    def add_path(self, path: PathArg, access: AccessFs, *, optional: bool = False) -> Ruleset:
        """Allow ``access`` beneath ``path`` (a directory hierarchy, or one file).

        ``path`` is opened now, once, ``O_PATH|O_CLOEXEC`` following symlinks, and the fd kept
        until ``create()``; an ``int`` is taken as an already-open fd and never closed here.
        A missing path raises :class:`PathError` unless ``optional`` (then it is skipped and
        recorded). Directory-only rights are stripped for a non-directory and recorded.
        """
        self._check_open()
        label = f"fd {path}" if isinstance(path, int) else os.fsdecode(os.fspath(path))
        access = check_access_fs(access, self._requested.fs, label)
        if isinstance(path, int):
            fd, owned = path, False
        else:
            try:
                fd, owned = os.open(path, os.O_PATH | os.O_CLOEXEC), True
            except OSError as e:
                if optional and e.errno in _MISSING_ERRNOS:
                    self._facts.append(Fact(FactKind.PATH_SKIPPED, label, int(access),
                                            f"optional path missing: {e.strerror}"))
                    return self
                raise PathError(f"{label}: {e.strerror}", path, e.errno or 0) from e
        try:
            is_dir = fstat_is_dir(fd, label, path)
        except PathError:
            if owned:
                os.close(fd)
            raise
        effective = plan_path_access(access, self._handled.fs, is_dir, label, self._facts)
        if effective:
            self._rules.append(PathRule(fd, owned, effective, label))
        elif owned:
            os.close(fd)
        return self

    def copy(self: _R) -> _R:
        """A new, uncreated Ruleset of the same class with the same handled rights, facts and
        rules, for making the same kernel ruleset again (a subclass with state of its own
        extends it). Path fds are borrowed, never owned, by the copy: only a ruleset whose
        paths were given as fds (which the caller keeps open) can be copied."""
        self._check_open()
        if any(isinstance(r, PathRule) and r.owned for r in self._rules):
            raise RulesetError("copy: a rule holds an fd this Ruleset opened; add paths as fds")
        twin = object.__new__(type(self))
        twin._requested, twin._handled = self._requested, self._handled
        twin._compat, twin._abi = self._compat, self._abi
        twin._facts, twin._rules = list(self._facts), list(self._rules)
        twin._done = False
        return twin

    def add_port(self, port: int, access: AccessNet) -> Ruleset:
        """Allow ``access`` (BIND_TCP / CONNECT_TCP) on TCP ``port``, any address."""
        self._check_open()
        port, access = check_port(port, access, self._requested.net)
        effective = access & self._handled.net
        if effective:
            self._rules.append(PortRule(port, AccessNet(effective)))
        else:
            self._facts.append(Fact(FactKind.RULE_SKIPPED, f"port {port}", int(access),
                                    f"no right of {access.describe()} is handled at this ABI"))
        return self

    def create(self) -> CreatedRuleset:
        """Make the kernel ruleset and add every rule; enforce nothing.

        On any error the ruleset fd is closed and the error raised: nothing half-made escapes.
        The path fds opened by ``add_path`` are closed either way; a Ruleset creates only once.
        When nothing can be enforced (ABI 0, or every handled right dropped) no kernel object
        is made and the result has ``fd == -1`` and status NOT_ENFORCED.
        """
        self._check_open()
        self._done = True
        try:
            fd = -1
            if self._abi > 0 and self._handled:
                fd = _sys.create_ruleset(int(self._handled.fs), int(self._handled.net),
                                         int(self._handled.scoped))
            try:
                for rule in self._rules:
                    add_rule(fd, rule)
            except BaseException:
                if fd >= 0:
                    os.close(fd)
                raise
            return CreatedRuleset(fd, self._abi, self._requested, self._handled, self._compat,
                                  self._facts)
        finally:
            self._close_rule_fds()

    def _close_rule_fds(self) -> None:
        for rule in self._rules:
            if isinstance(rule, PathRule) and rule.owned and rule.fd >= 0:
                os.close(rule.fd)
                rule.fd = -1

    def close(self) -> None:
        """Close the path fds without creating anything (idempotent)."""
        self._done = True
        self._close_rule_fds()

    def __enter__(self) -> Ruleset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["Ruleset", "CreatedRuleset"]
