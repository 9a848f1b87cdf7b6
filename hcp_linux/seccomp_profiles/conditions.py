"""Turn a rule's argument conditions into comparisons libseccomp accepts.

libseccomp takes at most one comparison per argument in a rule (2.5.4 answers EINVAL to two),
and compares all 64 bits. Profiles sometimes need more, for instance "personality() with
READ_IMPLIES_EXEC set, unless it is the 0xffffffff query". Rather than ask profile authors to
hand-write the equivalent set of masked_eq rules, this module rewrites a conjunction on one
argument into a disjunction of single masked_eq comparisons, each one a separate libseccomp
rule with the same action:

    (arg & M) == V  and  low_bits(arg) != Q
      ==  OR over each bit b inside the width and outside M:  (arg & (M|b)) == (V | (~Q & b))

i.e. the argument matches the cube and differs from Q in at least one bit. That is exact, not an
approximation. bits=32 conditions look at the low 32 bits only, which is what the kernel does for
an `int`/`unsigned int` argument, so garbage in the upper half can neither hide a match nor
create one.
"""
from __future__ import annotations

from itertools import product
from typing import NamedTuple, Sequence

from .model import U64, ArgCondition

#: A rule may expand to at most this many libseccomp rules (bounds the BPF size).
MAX_EXPANSION = 256


class ConditionError(ValueError):
    """The conditions can never match, contradict each other or cannot be expressed."""


class Comparison(NamedTuple):
    """One libseccomp comparison: op on argument `arg` with datum a (and b for masked_eq)."""

    arg: int
    op: str
    a: int
    b: int = 0


def expand(args: Sequence[ArgCondition], machine: str) -> list[tuple[Comparison, ...]]:
    """Disjunction of conjunctions (each with one comparison per argument) equal to `args`.

    No conditions gives [()]: one unconditional rule.
    """
    groups: dict[int, list[ArgCondition]] = {}
    for cond in args:
        cond = cond.for_machine(machine)
        groups.setdefault(cond.arg, []).append(cond)
    options = [_expand_argument(index, conds) for index, conds in sorted(groups.items())]
    total = 1
    for opts in options:
        total *= len(opts)
    if total > MAX_EXPANSION:
        raise ConditionError(f"conditions expand to {total} rules (limit {MAX_EXPANSION})")
    return [tuple(combo) for combo in product(*options)]


def _width(bits: int) -> int:
    return U64 if bits == 64 else 0xFFFFFFFF


def _expand_argument(index: int, conds: list[ArgCondition]) -> list[Comparison]:
    for c in conds:
        if c.op == "masked_eq" and c.mask is not None and c.value & ~c.mask:
            raise ConditionError(f"arg {index}: value {c.value:#x} has bits outside mask {c.mask:#x}: never matches")
    if len(conds) == 1:
        c = conds[0]
        if c.op == "masked_eq":
            return [Comparison(index, "masked_eq", c.mask or 0, c.value)]
        if c.bits == 32 and c.op == "eq":
            return [Comparison(index, "masked_eq", 0xFFFFFFFF, c.value)]
        if c.bits == 32 and c.op == "ne":
            return _ne_cover(index, 0, 0, c.value, 0xFFFFFFFF)
        return [Comparison(index, c.op, c.value)]
    bad = [c.op for c in conds if c.op not in ("eq", "masked_eq", "ne")]
    if bad:
        raise ConditionError(f"arg {index}: {bad[0]} cannot be combined with another condition on the same argument")
    nes = [c for c in conds if c.op == "ne"]
    if len(nes) > 1:
        raise ConditionError(f"arg {index}: at most one ne per argument")
    mask = value = 0
    for c in conds:
        if c.op == "ne":
            continue
        m = _width(c.bits) if c.op == "eq" else (c.mask or 0)
        if (value ^ c.value) & mask & m:
            raise ConditionError(f"arg {index}: conditions contradict each other: never matches")
        mask |= m
        value |= c.value & m
    if not nes:
        return [Comparison(index, "masked_eq", mask, value)]
    return _ne_cover(index, mask, value, nes[0].value, _width(nes[0].bits))


def _ne_cover(index: int, mask: int, value: int, excluded: int, width: int) -> list[Comparison]:
    """(arg & mask) == value and (arg & width) != excluded, as a union of masked_eq."""
    if (excluded ^ value) & mask & width:
        return [Comparison(index, "masked_eq", mask, value)]  # the exclusion can never apply
    free = [1 << b for b in range(64) if (width >> b) & 1 and not (mask >> b) & 1]
    if not free:
        raise ConditionError(f"arg {index}: the only value left is the excluded one: never matches")
    return [Comparison(index, "masked_eq", mask | bit, value | (~excluded & bit)) for bit in free]
