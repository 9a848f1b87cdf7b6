"""Compile validated profiles into a raw seccomp BPF program with libseccomp (via pyseccomp).

Runs in the parent only. pyseccomp is imported here, lazily, so that a process which finds the
program in the disk cache never pays for it. The program:
  - checks the architecture first; a foreign one (i386 `int 0x80`, which reaches another syscall
    table) gets KILL_PROCESS, not libseccomp's default KILL_THREAD, which would leave the rest of
    the process running;
  - on x86_64 kills x32 numbers (nr | 0x40000000): libseccomp 2.5 emits that check with the
    bad-arch action when x32 is not in the filter, and verify() proves it did;
  - does not set no_new_privs (the exported bytes carry no attributes; CTL_NNP=0 says so anyway;
    the caller sets it, in the child, before installing).
"""
from __future__ import annotations

import errno
import os
from typing import Any, Sequence

from . import bpf as _bpf
from .conditions import Comparison, expand
from .errors import SeccompCompileError, SeccompLibraryError
from .machines import X32_SYSCALL_BIT, Machine
from .model import OBSERVE, Profile
from .syscalls import native_number

BPF_MAXINSNS = 4096
_SIMPLE = {
    "allow": _bpf.RET_ALLOW,
    "log": _bpf.RET_LOG,
    "trap": _bpf.RET_TRAP,
    "kill_process": _bpf.RET_KILL_PROCESS,
    "kill_thread": _bpf.RET_KILL_THREAD,
}
_FOREIGN_ARCH = 0x40000003  # AUDIT_ARCH_I386: what `int 0x80` reports on x86_64


def action_value(action: str, notify: bool = False) -> int:
    """SECCOMP_RET_* for a normalised action string (libseccomp uses the same values).

    ``notify``: an errno answer that is a policy denial becomes SECCOMP_RET_USER_NOTIF, so
    that a listener records it and answers the same errno (:func:`notified`)."""
    if notify and notified(action):
        return _bpf.RET_USER_NOTIF
    if action == OBSERVE:  # looked at by a listener; without one, nothing to look
        return _bpf.RET_USER_NOTIF if notify else _bpf.RET_ALLOW
    if action.startswith("errno:"):
        return _bpf.RET_ERRNO | int(getattr(errno, action[6:]))
    return _SIMPLE[action]


def notified(action: str) -> bool:
    """Whether a notifying program hands ``action`` to its listener: every errno answer but
    ENOSYS. ENOSYS is the profiles' "fall back" answer (clone3, socketcall), which libc asks
    on every thread or process creation and handles silently: a round trip to the listener
    there would cost each clone a context switch, and it refuses nothing the caller needs.
    KILL and the other actions stay as they are."""
    return action.startswith("errno:") and action != "errno:ENOSYS"


def compile_bpf(profiles: Sequence[Profile], machine: Machine, notify: bool = False) -> bytes:
    """One program for all `profiles` (their rules are merged) on the native `machine`;
    ``notify``: with the policy denials as SECCOMP_RET_USER_NOTIF (see :func:`notified`)."""
    try:
        import pyseccomp  # lazy: ~20 ms, and only a cache miss needs it
    except RuntimeError as e:  # its find_library runs ldconfig: a process limit stops that
        raise SeccompLibraryError(f"cannot load libseccomp through pyseccomp ({e}; it looks "
                                  f"for the library by running ldconfig, which a process "
                                  f"limit such as RLIMIT_NPROC can stop)") from None

    defaults = {p.default_action for p in profiles}
    if len(defaults) != 1:
        raise SeccompCompileError(f"profiles disagree on the default action: {sorted(defaults)}")
    native = pyseccomp.system_arch()
    if native != machine.audit_arch:
        raise SeccompCompileError(f"libseccomp's native arch {native:#x} is not {machine.name}'s")
    default = action_value(defaults.pop())
    flt = pyseccomp.SyscallFilter(default)
    try:
        flt.set_attr(pyseccomp.Attr.ACT_BADARCH, pyseccomp.KILL_PROCESS)
        flt.set_attr(pyseccomp.Attr.CTL_NNP, 0)
    except OSError as exc:
        raise SeccompCompileError(f"libseccomp refused a filter attribute: {exc.strerror}") from None
    try:
        # A binary tree of syscall numbers instead of a linear chain: fewer instructions run
        # per syscall, and the kernel's action cache, which runs the program once per syscall
        # number when it is loaded, is built faster (load 0.17 -> 0.11 ms measured). Speed
        # only: a libseccomp without it (< 2.5) makes the same decisions.
        flt.set_attr(pyseccomp.Attr.CTL_OPTIMIZE, 2)
    except OSError:
        pass
    added: dict[tuple[int, tuple[Comparison, ...]], tuple[int, str]] = {}
    for profile in profiles:
        for i, rule in enumerate(profile.rules):
            where = f"{profile.path}: rule[{i}]"
            act = action_value(rule.action, notify)
            plain = action_value(rule.action)  # conflicts are judged on the real answers
            conjunctions = expand(rule.args, machine.name)
            for name in rule.syscalls:
                nr = native_number(name, rule.nr, machine)
                if nr is None:
                    continue  # absent on this machine: recorded in Profile.unavailable
                for conj in conjunctions:
                    key = (nr, conj)
                    if key in added:
                        if added[key][0] != plain:
                            raise SeccompCompileError(f"{where}: {name}: conflicts with {added[key][1]}")
                        continue
                    if rule.action == OBSERVE and act == default:
                        continue  # no listener to look: libseccomp refuses a default's action
                    _add_rule(pyseccomp, flt, act, nr, conj, f"{where}: {name}")
                    added[key] = (plain, where)
    program = _export(flt)
    verify(program, machine, profiles, notify)
    return program


def _add_rule(pyseccomp: Any, flt: Any, act: int, nr: int, conj: tuple[Comparison, ...], where: str) -> None:
    ops = {
        "ne": pyseccomp.NE, "lt": pyseccomp.LT, "le": pyseccomp.LE, "eq": pyseccomp.EQ,
        "ge": pyseccomp.GE, "gt": pyseccomp.GT, "masked_eq": pyseccomp.MASKED_EQ,
    }
    args = [pyseccomp.Arg(c.arg, ops[c.op], c.a, c.b) for c in conj]
    try:
        flt.add_rule(act, nr, *args)
    except OSError as exc:
        raise SeccompCompileError(f"{where}: libseccomp refused the rule: {exc.strerror}") from None


def _export(flt: Any) -> bytes:
    """export_bpf into an anonymous memory file and read the bytes back."""
    try:
        fd = os.memfd_create("hcp-seccomp-bpf", os.MFD_CLOEXEC)
        fh = os.fdopen(fd, "w+b", buffering=0)
    except (AttributeError, OSError):  # no memfd (old kernel / seccomp'd parent): a temp file
        import tempfile

        fh = tempfile.TemporaryFile(buffering=0)
    with fh:
        try:
            flt.export_bpf(fh)
        except OSError as exc:
            raise SeccompCompileError(f"libseccomp could not export the program: {exc.strerror}") from None
        fh.seek(0)
        return fh.read()


def verify(program: bytes, machine: Machine, profiles: Sequence[Profile] = (),
           notify: bool = False) -> None:
    """Refuse a program that does not do what this package promises.

    Checks, by running it: a foreign architecture is killed; on x86_64 an x32 number is killed;
    every unconditional rule of `profiles` yields its action.
    """
    if not program or len(program) % 8 or len(program) // 8 > BPF_MAXINSNS:
        raise SeccompCompileError(f"libseccomp produced a program of {len(program)} bytes")
    insns = _bpf.decode(program)

    def expect(nr: int, arch: int, want: int, what: str) -> None:
        got = _bpf.run(insns, nr, arch)
        if got != want:
            raise SeccompCompileError(
                f"generated program returns {_bpf.describe(got)} for {what}, expected {_bpf.describe(want)}"
            )

    expect(0, _FOREIGN_ARCH, _bpf.RET_KILL_PROCESS, "a foreign architecture (i386)")
    if machine.name == "x86_64":
        expect(39 | X32_SYSCALL_BIT, machine.audit_arch, _bpf.RET_KILL_PROCESS, "an x32 syscall")
    for profile in profiles:
        for rule in profile.rules:
            if rule.args:
                continue
            for name in rule.syscalls:
                nr = native_number(name, rule.nr, machine)
                if nr is not None:
                    expect(nr, machine.audit_arch, action_value(rule.action, notify),
                           f"{name} ({profile.path})")
