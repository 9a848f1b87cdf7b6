"""Where profiles live, and loading one by name or by path.

Registered profiles are the *.toml files shipped in profiles/ (package data). Anything that looks
like a path (contains '/', ends in .toml, or is an os.PathLike) is read as a file instead, so
tests and operators can try a profile without installing it.
"""
from __future__ import annotations

import os
from typing import Optional, Union

from .errors import ProfileFormatError, ProfileNotFoundError, SeccompProfileError, UnknownSyscallError
from .conditions import ConditionError, expand
from .machines import MACHINES, native_machine
from .model import Profile, is_profile_name, parse_profile

PROFILE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "profiles")

ProfileRef = Union[str, "os.PathLike[str]"]


def available_profiles() -> list[str]:
    """Names of the shipped profiles, sorted."""
    try:
        files = os.listdir(PROFILE_DIR)
    except OSError:
        return []
    return sorted(f[:-5] for f in files if f.endswith(".toml") and is_profile_name(f[:-5]))


def locate(ref: ProfileRef) -> tuple[str, Optional[str]]:
    """(file path, expected profile name or None for a path reference)."""
    if not isinstance(ref, str):
        return os.fspath(ref), None
    if "/" in ref or ref.endswith(".toml"):
        return ref, None
    if not is_profile_name(ref):
        raise ProfileNotFoundError(ref, tuple(available_profiles()))
    return os.path.join(PROFILE_DIR, ref + ".toml"), ref


def read_source(ref: ProfileRef) -> tuple[str, Optional[str], bytes]:
    """(path, expected name, file bytes) of a profile reference."""
    path, expected = locate(ref)
    try:
        with open(path, "rb") as f:
            return path, expected, f.read()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        raise ProfileNotFoundError(os.fspath(ref), tuple(available_profiles())) from None
    except OSError as exc:
        raise SeccompProfileError(f"{path}: cannot read profile: {exc.strerror}") from None


def load_profile(ref: ProfileRef) -> Profile:
    """Parse and validate a profile: structure, actions, conditions, and every syscall name."""
    path, expected, data = read_source(ref)
    return build_profile(data, path, expected)


def build_profile(data: bytes, path: str, expected: Optional[str] = None) -> Profile:
    """parse_profile + the checks that need more than the file's structure: each rule's
    argument conditions on every architecture, and every syscall name; records the names
    absent on this machine."""
    from .syscalls import numbers

    profile = parse_profile(data, path, expected)
    machine = native_machine()
    unavailable: dict[str, None] = {}
    for i, rule in enumerate(profile.rules):
        for arch in MACHINES:  # each rule's conditions must compile on every architecture
            try:
                expand(rule.args, arch)
            except ConditionError as exc:
                raise ProfileFormatError(path, f"{exc} (on {arch})", i, "args") from None
        for name in rule.syscalls:
            try:
                table = numbers(name, rule.nr)
            except ValueError as exc:
                raise ProfileFormatError(path, str(exc), i, "nr") from None
            if not table:
                raise UnknownSyscallError(name, path, i)
            if machine is not None and table.get(machine.name) is None:
                unavailable.setdefault(name, None)
    return profile._replace(unavailable=tuple(unavailable))
