"""Profiles as data: the parsed shape of a profile file, and its structural validation.

A profile is a TOML file (see profiles/baseline.toml) with a [profile] header and [[rule]]
entries. This module turns bytes into immutable Profile/Rule/ArgCondition values and refuses
anything malformed with a ProfileFormatError that names the file, the rule index and the field,
so a broken profile is caught at load time, before any filter exists. Syscall *names* are checked
against libseccomp separately (registry.py), because that needs the library.

NamedTuple rather than dataclasses: `import dataclasses` costs ~10 ms (it imports inspect), and
this package is imported on every CLI start; it should stay cheap on its own.
"""
from __future__ import annotations

import errno as _errno
from typing import Any, NamedTuple, Optional

from .errors import ProfileFormatError
from .machines import MACHINES

#: Comparison operators a rule may use on an argument (libseccomp's, by name).
OPS = ("eq", "ne", "lt", "le", "gt", "ge", "masked_eq")
#: Actions without data; "errno:NAME" is the one with data.
SIMPLE_ACTIONS = ("allow", "log", "trap", "kill_process", "kill_thread")
#: A rule's action (never a default): hand the call to the listener (SECCOMP_RET_USER_NOTIF),
#: which lets the kernel run it as usual (SECCOMP_USER_NOTIF_FLAG_CONTINUE) after looking at
#: it, to record; a program compiled without notifications allows it. For observing, never
#: for deciding: the call's memory may change between the look and the kernel's own read.
OBSERVE = "notify"
MAX_ARGS = 6
U64 = (1 << 64) - 1


class ArgCondition(NamedTuple):
    """One comparison on a syscall argument; the conditions of a rule are AND-ed.

    bits=32 says the kernel reads the argument as a 32-bit int (personality's `unsigned int`,
    a family `int`): only the low 32 bits decide what the call does, so only they are compared.
    `on` holds per-machine overrides of index/value/mask, e.g. clone's flags are argument 1 on
    s390x: (("s390x", (("index", 1),)),).
    """

    arg: int  # argument index 0..5; "index" in the file (as a field it would shadow tuple.index)
    op: str
    value: int
    mask: Optional[int] = None
    bits: int = 64
    on: tuple[tuple[str, tuple[tuple[str, int], ...]], ...] = ()

    def for_machine(self, machine: str) -> "ArgCondition":
        """This condition with the overrides for `machine` applied (and none left)."""
        for name, overrides in self.on:
            if name == machine:
                o = dict(overrides)
                return self._replace(
                    arg=o.get("index", self.arg), value=o.get("value", self.value), mask=o.get("mask", self.mask), on=()
                )
        return self._replace(on=())


class Rule(NamedTuple):
    """syscalls that, when args all hold, get action; why says what attack surface it closes.

    nr maps machine -> number for a call newer than the installed libseccomp (which then has no
    name for it); when libseccomp knows the name, its number wins and must agree.
    """

    syscalls: tuple[str, ...]
    action: str
    args: tuple[ArgCondition, ...]
    why: str
    nr: tuple[tuple[str, int], ...] = ()


class Profile(NamedTuple):
    """A parsed, validated profile. unavailable: syscalls absent on this machine (skipped)."""

    name: str
    description: str
    default_action: str
    rules: tuple[Rule, ...]
    path: str = ""
    unavailable: tuple[str, ...] = ()

    def syscalls(self) -> tuple[str, ...]:
        """Every syscall name the profile mentions, in file order, without repeats."""
        seen: dict[str, None] = {}
        for rule in self.rules:
            for name in rule.syscalls:
                seen.setdefault(name, None)
        return tuple(seen)


def is_profile_name(name: str) -> bool:
    """Registered profile names: lower-case letters, digits, '-' and '_' (no re: import cost)."""
    return bool(name) and name[0].isalnum() and all(
        c.isdigit() or ("a" <= c <= "z") or c in "-_" for c in name
    )


def parse_action(text: Any, path: str, rule_index: Optional[int], field: str) -> str:
    """Validate and normalise an action string: 'allow', 'kill_process', 'errno:EPERM', ..."""
    if not isinstance(text, str):
        raise ProfileFormatError(path, "must be a string such as \"errno:EPERM\"", rule_index, field)
    low = text.strip().lower()
    if low in SIMPLE_ACTIONS:
        return low
    if low == OBSERVE and rule_index is not None:
        return low
    if low.startswith("errno:"):
        name = text.strip()[6:].strip().upper()
        if name.startswith("E") and isinstance(getattr(_errno, name, None), int):
            return "errno:" + name
        raise ProfileFormatError(path, f"unknown errno name {name!r}", rule_index, field)
    expected = ", ".join(SIMPLE_ACTIONS + ("errno:NAME",) + ((OBSERVE,) if rule_index is not None else ()))
    raise ProfileFormatError(path, f"unknown action {text!r} (expected one of {expected})", rule_index, field)


def parse_profile(data: bytes, path: str, expected_name: Optional[str] = None) -> Profile:
    """Parse and structurally validate one profile file's bytes. `path` is used in errors."""
    try:
        import tomllib  # Python >= 3.11
    except ModuleNotFoundError:  # pragma: no cover - Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ProfileFormatError(path, f"not valid TOML: {exc}") from None
    _no_unknown_keys(doc, ("profile", "rule"), path, None, "")
    header = doc.get("profile")
    if not isinstance(header, dict):
        raise ProfileFormatError(path, "missing [profile] table", None, "profile")
    _no_unknown_keys(header, ("name", "description", "default_action"), path, None, "profile.")
    name = header.get("name")
    if not isinstance(name, str) or not is_profile_name(name):
        raise ProfileFormatError(path, "must be a lower-case name ([a-z0-9_-])", None, "profile.name")
    if expected_name is not None and name != expected_name:
        raise ProfileFormatError(path, f"is {name!r} but the file is {expected_name!r}", None, "profile.name")
    description = header.get("description", "")
    if not isinstance(description, str):
        raise ProfileFormatError(path, "must be a string", None, "profile.description")
    if "default_action" not in header:
        raise ProfileFormatError(path, "missing", None, "profile.default_action")
    default = parse_action(header["default_action"], path, None, "profile.default_action")
    raw_rules = doc.get("rule", [])
    if not isinstance(raw_rules, list) or not all(isinstance(r, dict) for r in raw_rules):
        raise ProfileFormatError(path, "must be an array of tables ([[rule]])", None, "rule")
    rules = tuple(_parse_rule(raw, path, i, default) for i, raw in enumerate(raw_rules))
    return Profile(name, description, default, rules, path)


def _parse_rule(raw: dict[str, Any], path: str, i: int, default_action: str) -> Rule:
    _no_unknown_keys(raw, ("syscall", "action", "args", "why", "nr"), path, i, "")
    syscalls = raw.get("syscall")
    if isinstance(syscalls, str):
        syscalls = [syscalls]
    if (
        not isinstance(syscalls, list)
        or not syscalls
        or not all(isinstance(s, str) and s.strip() == s and s for s in syscalls)
    ):
        raise ProfileFormatError(path, "must be a syscall name or a non-empty list of names", i, "syscall")
    if len(set(syscalls)) != len(syscalls):
        raise ProfileFormatError(path, "lists a syscall twice", i, "syscall")
    if "action" not in raw:
        raise ProfileFormatError(path, "missing", i, "action")
    action = parse_action(raw["action"], path, i, "action")
    if action == default_action:
        raise ProfileFormatError(path, f"{action!r} is the profile's default action already", i, "action")
    why = raw.get("why")
    if not isinstance(why, str) or not why.strip() or "\n" in why.strip():
        raise ProfileFormatError(path, "missing: every rule says in one line why it exists", i, "why")
    raw_args = raw.get("args", [])
    if not isinstance(raw_args, list):
        raise ProfileFormatError(path, "must be an array of tables", i, "args")
    args = tuple(_parse_arg(a, path, i, j) for j, a in enumerate(raw_args))
    nr = _parse_nr(raw.get("nr"), path, i, syscalls)
    return Rule(tuple(syscalls), action, args, why.strip(), nr)


def _parse_arg(raw: Any, path: str, i: int, j: int) -> ArgCondition:
    where = f"args[{j}]"
    if not isinstance(raw, dict):
        raise ProfileFormatError(path, "must be a table {index, op, value[, mask]}", i, where)
    _no_unknown_keys(raw, ("index", "op", "value", "mask", "bits", "on"), path, i, where + ".")
    op = raw.get("op")
    if op not in OPS:
        raise ProfileFormatError(path, f"unknown op {op!r} (expected one of {', '.join(OPS)})", i, where + ".op")
    index = _int(raw.get("index"), path, i, where + ".index", 0, MAX_ARGS - 1)
    bits = raw.get("bits", 64)
    if bits not in (32, 64) or isinstance(bits, bool):
        raise ProfileFormatError(path, "must be 32 or 64", i, where + ".bits")
    lo, limit = (-(1 << 63), U64) if bits == 64 else (-(1 << 31), 0xFFFFFFFF)
    value = _int(raw.get("value"), path, i, where + ".value", lo, limit) & limit
    mask: Optional[int] = None
    if op == "masked_eq":
        if "mask" not in raw:
            raise ProfileFormatError(path, "masked_eq needs a mask", i, where + ".mask")
        mask = _int(raw["mask"], path, i, where + ".mask", lo, limit) & limit
    elif "mask" in raw:
        raise ProfileFormatError(path, f"only masked_eq takes a mask, not {op}", i, where + ".mask")
    if bits == 32 and op in ("lt", "le", "gt", "ge"):
        raise ProfileFormatError(path, f"{op} compares all 64 bits; bits=32 is for eq/ne/masked_eq", i, where + ".bits")
    on = _parse_on(raw.get("on"), path, i, where, lo, limit)
    return ArgCondition(index, op, value, mask, bits, on)


def _parse_on(
    raw: Any, path: str, i: int, where: str, lo: int, limit: int
) -> tuple[tuple[str, tuple[tuple[str, int], ...]], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise ProfileFormatError(path, "must be a table machine -> {index|value|mask}", i, where + ".on")
    out = []
    for machine, overrides in raw.items():
        field = f"{where}.on.{machine}"
        if machine not in MACHINES:
            raise ProfileFormatError(path, f"unknown machine (expected one of {', '.join(MACHINES)})", i, field)
        if not isinstance(overrides, dict) or not overrides:
            raise ProfileFormatError(path, "must be a table of index/value/mask", i, field)
        _no_unknown_keys(overrides, ("index", "value", "mask"), path, i, field + ".")
        pairs = []
        for key, val in overrides.items():
            if key == "index":
                pairs.append((key, _int(val, path, i, f"{field}.{key}", 0, MAX_ARGS - 1)))
            else:
                pairs.append((key, _int(val, path, i, f"{field}.{key}", lo, limit) & limit))
        out.append((machine, tuple(pairs)))
    return tuple(out)


def _parse_nr(raw: Any, path: str, i: int, syscalls: list[str]) -> tuple[tuple[str, int], ...]:
    if raw is None:
        return ()
    if len(syscalls) != 1:
        raise ProfileFormatError(path, "a number table needs a rule with exactly one syscall", i, "nr")
    if not isinstance(raw, dict) or not raw:
        raise ProfileFormatError(path, "must be a table machine -> syscall number", i, "nr")
    for machine in raw:
        if machine not in MACHINES:
            raise ProfileFormatError(path, f"unknown machine (expected one of {', '.join(MACHINES)})", i, f"nr.{machine}")
    return tuple((m, _int(n, path, i, f"nr.{m}", 0, 4095)) for m, n in raw.items())


def _int(value: Any, path: str, i: Optional[int], field: str, lo: int, hi: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ProfileFormatError(path, "missing or not an integer", i, field)
    if not lo <= value <= hi:
        raise ProfileFormatError(path, f"{value} is out of range [{lo}, {hi}]", i, field)
    return value


def _no_unknown_keys(table: dict[str, Any], allowed: tuple[str, ...], path: str, i: Optional[int], prefix: str) -> None:
    for key in table:
        if key not in allowed:
            raise ProfileFormatError(path, f"unknown key (allowed: {', '.join(allowed)})", i, prefix + key)
