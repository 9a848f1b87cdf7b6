"""The fallback ladder: named rungs, strongest first, each the set of layers it may lose.

A rung is a name for an ``allow_degraded`` set, nothing more: a policy that opts into a rung
(``rung = "no-namespaces"``, ``--rung``) gets its layers added to ``allow_degraded``, and the
sandbox degrades exactly as it does for layers named one by one. The default rung, ``full``,
loses nothing: strict. The receipt and ``probe`` name the rung a run reached (:func:`reached`):
the first rung, strongest first, whose lost set holds every layer the run went without.

A leaf module (policy.py imports it): layer names are written out here and
tests/test_ladder.py holds them to policy.LAYERS.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

_NAMESPACES = ("userns", "mountns", "netns", "ipcns", "pidns")


@dataclass(frozen=True)
class Rung:
    """One rung: its name, the layers it may go without, what stays in force and what is
    lost (the words probe, the receipt and docs/deploying.md use)."""

    name: str
    loses: frozenset[str]
    keeps_text: str
    loses_text: str


RUNGS: tuple[Rung, ...] = (
    Rung("full", frozenset(),
         "user, mount, network, IPC and pid namespaces; Landlock; seccomp; no_new_privs; "
         "every capability dropped",
         "nothing"),
    Rung("no-userns", frozenset({"userns"}),
         "mount view, private network, IPC and pid namespaces (made with the capabilities "
         "the process already holds, e.g. root in a container); Landlock; seccomp; "
         "no_new_privs",
         "the private uid/gid view: the command runs as the caller's uid, and the "
         "capability bounding set stays as it was (nothing can be regained under "
         "no_new_privs)"),
    Rung("no-pidns", frozenset({"pidns"}),
         "user, mount, network and IPC namespaces; Landlock (its signal scope refuses "
         "signals to processes outside the sandbox); seccomp; no_new_privs",
         "the pid namespace: outside processes are visible in /proc (the outer /proc, "
         "fenced), a setsid'd daemon can outlive the run (only the process group is killed), "
         "and limits.nproc does not bind a caller that is the host's root (RLIMIT_NPROC "
         "never applies to it; the pid namespace's pid_max did)"),
    Rung("no-landlock", frozenset({"landlock"}),
         "every namespace (the mount view is the filesystem fence, with /proc's kernel knobs "
         "read-only and a file refused as stdin, stdout or stderr); seccomp; no_new_privs",
         "Landlock: no access control inside the granted mounts beyond file permissions "
         "(uid 0 inside is the host's root there: what root owns in a writable root, it "
         "may change); no signal or abstract-socket scoping (the pid and network "
         "namespaces still isolate both); a host file as stdin, stdout or stderr (it would "
         "re-open through /proc/self/fd: the run is refused, give a pipe)"),
    Rung("no-namespaces", frozenset(_NAMESPACES),
         "Landlock (file access, every TCP bind and connect refused, signal and "
         "abstract-socket scopes); seccomp with network-off (only AF_UNIX sockets); "
         "no_new_privs",
         "the mount view (host paths stay nameable, metadata writes outside the roots are "
         "not prevented, HOME and TMPDIR live in the jail's .hcp-tmp, /etc/shadow and the "
         "other masked secrets are readable by a caller that is root), the private "
         "network (UDP and other families are refused by seccomp instead), private IPC, "
         "the pid namespace (outside processes visible, a setsid'd daemon can outlive the "
         "run, limits.nproc does not bind a caller that is the host's root)"),
)

BY_NAME = {r.name: r for r in RUNGS}
NAMES: tuple[str, ...] = tuple(BY_NAME)
DEFAULT = "full"


def reached(degraded: Iterable[str]) -> Rung | None:
    """The strongest rung that allows going without every layer in ``degraded``; None when
    no rung does (seccomp lost, or Landlock and a namespace both): below the ladder."""
    gone = frozenset(degraded)
    for rung in RUNGS:
        if gone <= rung.loses:
            return rung
    return None


def next_up(rung: Rung | None) -> Rung | None:
    """The nearest rung above ``rung`` that is stronger in every respect (it loses a subset
    of what ``rung`` loses): the one to aim for next. Below the ladder: the weakest rung.
    None at the top."""
    if rung is None:
        return RUNGS[-1]
    above = [r for r in RUNGS[:RUNGS.index(rung)] if r.loses < rung.loses]
    return above[-1] if above else None
