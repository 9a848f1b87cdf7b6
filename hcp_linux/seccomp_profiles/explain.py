"""Which rule of which profile refused a syscall: the `why` a denial record carries.

A notification carries the syscall's number and arguments, not the rule that matched; this
module finds it by evaluating the profiles' rules on them, as the compiled program did
(libseccomp's comparisons: unsigned 64-bit; masked_eq as (arg & mask) == value). The profiles
are loaded on the first lookup (libseccomp for the syscall numbers): a run with no denial
never pays for it.
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

from .conditions import Comparison, expand
from .machines import native_machine
from .registry import ProfileRef, load_profile
from .syscalls import native_number


class Match(NamedTuple):
    """The first rule (in the order the profiles were given) that matches a syscall."""

    profile: str
    syscall: str
    action: str  # "errno:EPERM", ...
    why: str


def _holds(c: Comparison, args: Sequence[int]) -> bool:
    v = args[c.arg] & 0xFFFFFFFFFFFFFFFF
    if c.op == "masked_eq":
        return v & c.a == c.b
    return {"eq": v == c.a, "ne": v != c.a, "lt": v < c.a, "le": v <= c.a,
            "gt": v > c.a, "ge": v >= c.a}[c.op]


_Index = dict[int, list[tuple[tuple[tuple[Comparison, ...], ...], Match]]]


class Explainer:
    """Rules of ``names`` indexed by syscall number on this machine, built on first use."""

    def __init__(self, names: Sequence[ProfileRef]) -> None:
        self._names = tuple(names)
        self._by_nr: Optional[_Index] = None

    def _index(self) -> _Index:
        machine = native_machine()
        by_nr: _Index = {}
        if machine is None:
            return by_nr
        for ref in self._names:
            profile = load_profile(ref)
            for rule in profile.rules:
                conj = tuple(expand(rule.args, machine.name))
                for name in rule.syscalls:
                    nr = native_number(name, rule.nr, machine)
                    if nr is not None:
                        by_nr.setdefault(nr, []).append(
                            (conj, Match(profile.name, name, rule.action, rule.why)))
        return by_nr

    def match(self, nr: int, args: Sequence[int]) -> Optional[Match]:
        """The rule that refused syscall ``nr`` with ``args``, or None (no rule matches)."""
        if self._by_nr is None:
            self._by_nr = self._index()
        for conjunctions, found in self._by_nr.get(nr, ()):
            if any(all(_holds(c, args) for c in conj) for conj in conjunctions):
                return found
        return None
