"""The plan as hcp-exec reads it: little-endian u64 fields and length-prefixed strings,
under the header and flags of :mod:`hcp_linux.protocol`, in the order of its ``PLAN_LAYOUT``
and ``VIEW_LAYOUT`` (from which hcp_exec.c's parsers are generated): this module gathers the
values by field name and :func:`encode` writes them in that order.

A plan has a prepared section (``view_bytes``: what the mount view and the confinement read,
the same for every run of one confinement) inside the whole (``plan_bytes``: the run's fds,
signals, umask, argv and environment). A spare compares the prepared section with the one
it was made for.
"""
from __future__ import annotations

import errno
import os
import struct
from typing import TYPE_CHECKING, Any, Mapping

from ..proc.peer import process_status
from ..protocol import (DEFAULT_SIGNALS, FLAGS, LL_FLAGS_SHIFT, PLAN_LAYOUT, PLAN_MAGIC,
                        PLAN_VERSION, PROXY_ADDRESS, VIEW_LAYOUT, RunFds, namespace_flags)

if TYPE_CHECKING:
    from hcp_linux.landlock import CreatedRuleset

    from ..plan.plan import Plan

u64 = struct.Struct("<Q").pack
_MASK = (1 << 64) - 1


_U64 = frozenset(("u64", "i64", "u32", "u16", "int"))


def _compile(layout: tuple) -> list[tuple]:
    """``layout`` as steps for :func:`encode`: a run of u64 fields becomes one struct, and a
    list of records a loop over tuples, so that writing a plan from its description costs
    what writing it out by hand did (plan_bytes: the same per spawn)."""
    ops: list[tuple] = []
    scalars: list[str] = []
    for name, kind in layout:
        if kind in _U64 or kind == "magic":
            scalars.append(name)
            continue
        if scalars:
            ops.append(("u64", tuple(scalars), struct.Struct(f"<{len(scalars)}Q").pack))
            scalars = []
        if isinstance(kind, str):
            ops.append((kind, name))
        elif kind[0] == "list":
            ops.append(("records", name, _record(kind[1])))
        else:  # ("if", flags field, flag, fields)
            ops.append(("if", name, kind[1], FLAGS[kind[2]], _compile(kind[3]), len(kind[3])))
    if scalars:
        ops.append(("u64", tuple(scalars), struct.Struct(f"<{len(scalars)}Q").pack))
    return ops


def _record(fields: tuple) -> tuple[int, Any]:
    """A record of strings then u64s (every record of the plan is) as (how many strings,
    the struct packing the u64s or None)."""
    kinds = [kind for _, kind in fields]
    strings = kinds.count("str")
    if kinds[:strings] != ["str"] * strings or not set(kinds[strings:]) <= _U64:
        raise ValueError(f"plan layout: a record is strings, then u64s: {fields}")
    rest = len(kinds) - strings
    return strings, struct.Struct(f"<{rest}Q").pack if rest else None


_MAGIC = PLAN_VERSION << 32 | PLAN_MAGIC
#: Signals the command gets at their default action: never in the plan's ignored set.
_DEFAULT_SIGNALS = sum(1 << (int(s) - 1) for s in DEFAULT_SIGNALS)
#: PROXY_ADDRESS's host, as the u32 hcp-exec binds (host byte order).
_PROXY_ADDR = int.from_bytes(bytes(int(x) for x in PROXY_ADDRESS[0].split(".")), "big")
_COMPILED: dict[int, tuple[tuple, list[tuple]]] = {}


def encode(layout: tuple, values: Mapping[str, Any], parts: list[bytes]) -> None:
    """Append ``values`` (by field name) to ``parts`` in ``layout``'s order and kinds (see
    protocol.PLAN_LAYOUT): a list of records is a sequence of tuples in the record's field
    order; an "if" group's value is a mapping when its flag is set, else None. A value
    with no field, or a field with no value, is an error: the layout is the whole format."""
    if len(values) != len(layout):
        raise ValueError(f"plan fields: {sorted(values)} for {[n for n, _ in layout]}")
    compiled = _COMPILED.get(id(layout))
    if compiled is None or compiled[0] is not layout:
        compiled = _COMPILED[id(layout)] = (layout, _compile(layout))
    _encode(compiled[1], values, parts)


def _encode(ops: list[tuple], values: Mapping[str, Any], parts: list[bytes]) -> None:
    for op in ops:
        kind = op[0]
        if kind == "u64":
            parts.append(op[2](*[_MAGIC if name == "magic" else values[name] & _MASK
                                 for name in op[1]]))
            continue
        value = values[op[1]]
        if kind == "str":
            parts += (u64(len(value) + 1), value, b"\0")
        elif kind in ("bytes", "view"):
            parts += (u64(len(value)), value)
        elif kind == "strs":
            parts.append(u64(len(value)))
            for s in value:
                parts += (u64(len(s) + 1), s, b"\0")
        elif kind == "ports":
            parts.append(u64(len(value)))
            parts += [u64(port) for port in value]
        elif kind == "records":
            parts.append(u64(len(value)))
            strings, pack = op[2]
            for record in value:
                for s in record[:strings]:
                    parts += (u64(len(s) + 1), s, b"\0")
                if pack is not None:
                    parts.append(pack(*[x & _MASK for x in record[strings:]]))
        else:  # "if"
            _, name, flags, bit, sub, size = op
            if bool(values[flags] & bit) != (value is not None):
                raise ValueError(f"plan field {name!r}: present iff its flag is set")
            if value is not None:
                if len(value) != size:
                    raise ValueError(f"plan field {name!r}: {sorted(value)}")
                _encode(sub, value, parts)


def view_bytes(plan: "Plan") -> bytes:
    """The plan's prepared section: all that building the mount view and the confinement
    that is the same for every run (no_new_privs, capabilities, Landlock, seccomp) read, and
    only that. Two plans with the same section get the same view (inodes included) and the
    same confinement, which is what lets a spare do both ahead of time. Made once per
    confinement and the other fields it reads."""
    F = FLAGS
    vf = (F["MOUNTNS"] * ("mountns" in plan.layers) | F["PROC_FRESH"] * plan.proc_fresh
          | F["PID_MAX"] * (plan.pid_max is not None) | F["HOLDS_SETPCAP"] * plan.holds_setpcap
          | F["SECCOMP"] * (plan.seccomp is not None)
          | F["SECCOMP_LISTENER"] * (plan.seccomp is not None and plan.seccomp_listener)
          | F["LANDLOCK"] * (plan.landlock is not None) | F["PTY"] * plan.pty
          | F["PROXY"] * plan.proxy | _ll_flags(plan))
    bpf = plan.seccomp.bpf if plan.seccomp is not None else b""
    return plan.derived(("view-bytes", vf, plan.pid_max, plan.tmp_options, plan.shm_options,
                         plan.cap_last_cap, bpf, plan.capture_ports, plan.capture_nets,
                         tuple(plan.proc_fences)),
                        lambda: _view_bytes(plan, vf, bpf))


def _ll_flags(plan: "Plan") -> int:
    """landlock_restrict_self's flags, as plan flags."""
    return (plan.landlock_restrict << LL_FLAGS_SHIFT) if plan.landlock is not None else 0


def makes_ruleset(plan: "Plan") -> bool:
    """Whether hcp-exec makes the Landlock ruleset itself (with a mount view: a rule on each
    bind it cloned and checked, then the late rules), so the parent creates none."""
    return plan.landlock is not None and "mountns" in plan.layers


def _landlock_fields(plan: "Plan") -> dict[str, Any]:
    """The Landlock part of the prepared section: handled rights, the dir-only rights (taken
    from a rule on a non-directory) and the late rules (for mounts that exist only inside),
    each masked as CreatedRuleset.add_path_fd would."""
    import hcp_linux.landlock as landlock
    ruleset = plan.landlock
    assert ruleset is not None
    requested, handled = int(ruleset.requested_fs), int(ruleset.handled_fs)
    for path, access in plan.late_rules:
        if not access or access & ~requested:  # what CreatedRuleset.add_path_fd refuses
            from ..errors import ChildSetupError
            raise ChildSetupError("internal", errno.EINVAL,
                                  f"late rule {path!r}: rights not in handled_fs")
    return {"ll_fs": handled, "ll_net": int(ruleset.handled_net), "ll_scoped": int(ruleset.scoped),
            "dir_only": int(landlock.DIR_ONLY_RIGHTS),
            "rules": [(path, access & handled) for path, access in plan.late_rules]}


def _view_bytes(plan: "Plan", vf: int, bpf: bytes) -> bytes:
    parts: list[bytes] = []
    encode(VIEW_LAYOUT, view_fields(plan, vf, bpf), parts)
    return b"".join(parts)


def view_fields(plan: "Plan", vf: int, bpf: bytes) -> dict[str, Any]:
    """The prepared section's values by VIEW_LAYOUT's names (``vf``: its flags)."""
    return {
        "view_flags": vf, "pid_max": plan.pid_max or 0, "tmp_options": plan.tmp_options,
        "shm_options": plan.shm_options,
        "binds": [(bd.source, bd.target, int(bd.is_dir), bd.dev, bd.ino, bd.attrs, bd.access)
                  for bd in plan.binds],
        "masks": plan.masks,  # (path, is_dir): a bool is the u64 0 or 1
        "watch": plan.watch,
        "symlinks": plan.symlinks,
        "fences": plan.proc_fences,  # (path, masked)
        # egress-capture binds these before a spare drops its capabilities (port 53 and the
        # address on lo need them), so they are part of what a spare is prepared for
        "capture_ports": plan.capture_ports,
        "capture_nets": plan.capture_nets,  # (address, prefix)
        "cap_last_cap": plan.cap_last_cap, "bpf": bpf,
        "landlock": _landlock_fields(plan) if plan.landlock is not None else None,
    }


def plan_bytes(plan: "Plan", fds: RunFds, ruleset: "CreatedRuleset | None",
               set_umask: bool = False, view: bytes | None = None,
               process: tuple[int, int, int] | None = None) -> bytes:
    """The plan as hcp-exec reads it (protocol.PLAN_LAYOUT), with the run's channels ``fds``
    by number (the error pipe aside: it travels on hcp-exec's command line, or with the plan).
    Call it in the spawning thread: it records that thread's signal mask, and this moment's
    ignored signals and (``set_umask``: for a spare started a while ago) umask; or, given
    ``process`` (umask, ignored, blocked), those of the process that will start hcp-exec."""
    parts: list[bytes] = []
    encode(PLAN_LAYOUT, plan_fields(plan, fds, ruleset, set_umask, view, process), parts)
    return b"".join(parts)


def plan_fields(plan: "Plan", fds: RunFds, ruleset: "CreatedRuleset | None",
                set_umask: bool = False, view: bytes | None = None,
                process: tuple[int, int, int] | None = None) -> dict[str, Any]:
    """The plan's values by PLAN_LAYOUT's names (:func:`plan_bytes`)."""
    umask, ignored, blocked = process_status() if process is None else process
    ignored &= ~_DEFAULT_SIGNALS

    F = FLAGS
    flags = namespace_flags(plan.layers)
    flags |= (F["CONFINED"] * plan.confined | F["PROXY"] * plan.proxy
              | F["HOLDS_SETPCAP"] * plan.holds_setpcap | F["PROC_FRESH"] * plan.proc_fresh
              | F["WAIT_FOR_TREE"] * plan.wait_for_tree
              | F["LANDLOCK"] * (plan.landlock is not None)
              | F["CANARY"] * (plan.canary is not None)
              | F["SECCOMP"] * (plan.seccomp is not None)
              | F["SECCOMP_LISTENER"] * (plan.seccomp is not None and plan.seccomp_listener)
              | F["PID_MAX"] * (plan.pid_max is not None) | F["PTY"] * plan.pty
              | _ll_flags(plan))
    if (ruleset is not None) == makes_ruleset(plan) and plan.landlock is not None:
        from ..errors import ChildSetupError
        raise ChildSetupError("internal", errno.EINVAL, "native executor: a Landlock ruleset "
                              "is made by hcp-exec with a mount view, by the parent without")
    env = []
    for key, value in plan.env.items():
        if not key or b"=" in key:  # what os.execve refuses
            from ..errors import ChildSetupError
            raise ChildSetupError("internal", errno.EINVAL,
                                  f"illegal environment variable name {key!r}")
        env.append(key + b"=" + value)
    return {
        "magic": None, "flags": flags, "parent_pid": plan.parent_pid, "uid": plan.uid,
        "gid": plan.gid, "stdin": fds.stdio[0], "stdout": fds.stdio[1], "stderr": fds.stdio[2],
        "ruleset": ruleset.fd if ruleset is not None else -1, "proxy": fds.proxy,
        "done": fds.done, "notify": fds.notify, "proxy_addr": _PROXY_ADDR,
        "proxy_port": PROXY_ADDRESS[1], "umask": umask if set_umask else -1, "sig_ignored": ignored,
        "sig_blocked": blocked, "cwd": plan.cwd, "exe": plan.exe,
        "canary": os.fsencode(plan.canary) if plan.canary is not None else b"/",
        "view": view_bytes(plan) if view is None else view,
        "rlimits": plan.rlimits, "argv": plan.argv, "env": env,
    }



