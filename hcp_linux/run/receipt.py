"""The enforcement receipt: per layer, what was put in force and the facts behind it.

A receipt is made from the plan the child executes (while the child sets up: it needs nothing
else), never from wishes: a layer reads "enforced" only when the child was given that step,
"degraded" when the host lacked it and the policy allowed running without it, "off" when the
policy itself turned it off.
"""
from __future__ import annotations

import json
import os
import stat
from typing import IO, Any, Iterable, Mapping

from ..policy import ladder, values
from ..errors import PolicyError, printable
from ..policy.limits import cgroup_v2_status
from ..policy.policy import LAYERS, NAMESPACE_LAYERS
from ..policy.values import dir_problem

RECEIPT_VERSION = 1


#: What a run loses with each layer gone (the receipt says it next to "degraded").
LOST = {
    "userns": "no private uid/gid view; without root the other namespaces go too",
    "mountns": "no mount view: metadata writes (chmod, chown, utime, xattr) outside the "
               "writable roots are not prevented, host paths stay nameable (pathname unix "
               "sockets reachable), HOME and TMPDIR live in <first writable root>/.hcp-tmp (the "
               "jail, unless it is read-only); the masked secrets (/etc/shadow...) are not "
               "masked: a caller that is root reads them",
    "netns": "no private network: seccomp refuses non-AF_UNIX sockets and Landlock every TCP "
             "bind and connect instead",
    "ipcns": "System V IPC and POSIX message queues shared with the host",
    "pidns": "outside processes visible; a setsid'd daemon can outlive the run (only the "
             "process group is killed); limits.nproc does not bind a caller that is the "
             "host's root (RLIMIT_NPROC never applies to it; pid_max did); no init watches "
             "the hidden and read-only paths: one whose file the host replaces during the "
             "run is the command's to read or write until it ends",
    "landlock": "no filesystem access control beyond the mount view and permissions; no "
                "signal/abstract-socket scoping",
    "seccomp": "no syscall blocklist: namespaces, mount API, ptrace, bpf, io_uring, TIOCSTI, "
               "foreign-arch calls all reach the kernel",
}


def _status(layer: str, plan, wanted: frozenset[str], degraded: Mapping[str, str]) -> dict:
    if layer in plan.layers:
        return {"status": "enforced"}
    if layer in degraded:
        return {"status": "degraded", "reason": degraded[layer], "lost": LOST[layer]}
    if not plan.confined:
        return {"status": "off", "reason": "native-local mode"}
    reason = "network=host" if layer == "netns" else "not requested"
    return {"status": "off", "reason": reason}


def build_receipt(plan, wanted: frozenset[str], degraded: Mapping[str, str]) -> dict[str, Any]:
    layers: dict[str, dict[str, Any]] = {
        name: _status(name, plan, wanted, degraded) for name in LAYERS}
    if "userns" in plan.layers:
        layers["userns"].update(uid_map=f"{plan.uid} {plan.uid} 1",
                                gid_map=f"{plan.gid} {plan.gid} 1", setgroups="deny")
    if "mountns" in plan.layers:
        view = plan.derived(("receipt-view", plan.proc_fresh), lambda: _mount_view(plan))
        layers["mountns"].update({k: v.copy() if isinstance(v, (list, dict)) else v
                                  for k, v in view.items()})
    if "netns" in plan.layers:
        layers["netns"].update(interfaces=["lo"])
    if plan.landlock is not None:  # what its create() makes, wherever that is made
        layers["landlock"].update(_landlock_facts(plan.landlock))
    confined = plan.confined
    layers["nnp"] = {"status": "enforced" if confined else "off"}
    bounding = (0 if plan.holds_setpcap else
                "kept: no CAP_SETPCAP to drop it (no user namespace); nothing can be regained "
                "under no_new_privs")
    layers["capabilities"] = ({"status": "enforced", "effective": 0, "permitted": 0,
                               "inheritable": 0, "bounding": bounding, "ambient": 0,
                               "securebits": "all locked" if plan.holds_setpcap else "unchanged"}
                              if confined else {"status": "off"})
    if plan.seccomp is not None:
        import hcp_linux.seccomp_profiles as seccomp_profiles
        layers["seccomp"].update(profiles=list(plan.seccomp_names),
                                 digest=seccomp_profiles.profile_digest(plan.seccomp_names),
                                 arch_check="foreign arch and x32 -> kill_process")
    limits = plan.policy.limits
    applied = {key: value for key, _, value in limits.rlimits()}
    return {
        "limits": {"rlimits": applied, "pid_max": plan.pid_max or (
                       "not set: " + ("no pid namespace" if "pidns" not in plan.layers else
                                      "kernel < 6.14 has no per-namespace pid_max; RLIMIT_NPROC "
                                      "alone does not bind a sandbox launched as root")),
                   "tmp_size": limits.tmp_size,
                   "shm_size": limits.shm_size, "output_cap": limits.output,
                   "cgroup": cgroup_v2_status(), "on_exit": plan.policy.on_exit},
        "version": RECEIPT_VERSION,
        "mode": plan.mode,
        "policy": plan.policy.digest(),
        "exe": plan.exe.decode(errors="replace"),
        "argv": [a.decode(errors="replace") for a in plan.argv],
        "cwd": plan.cwd.decode(errors="replace"),
        "jail": _jail(plan),
        "namespaces": [n for n in NAMESPACE_LAYERS if n in plan.layers],
        "network": {"mode": plan.policy.network},
        "layers": layers,
        "rung": _rung(plan, degraded),
        "env": {"set": sorted(k.decode() for k in plan.env), "removed": list(plan.env_removed),
                "replaced": list(plan.env_replaced)},
        "fds": {"kept": [0, 1, 2], "closed": "every fd above 2 (close_range CLOEXEC)"}
        if confined else {"kept": [0, 1, 2]},
        "verified": _verified(plan),
        **_carve_outs(plan),
        **_protected(plan),
        **_unix_sockets(plan),
        "pty": plan.pty,
        **({"pty_by": "a private devpts instance on /dev/pts (newinstance, ptmxmode=0666, "
                      "mode=0620) and /dev/ptmx -> pts/ptmx: only its own ptys are visible"}
           if plan.pty else {}),
    }


def _rung(plan, degraded: Mapping[str, str]) -> dict[str, Any]:
    """The rung of the fallback ladder this run stands on (the strongest whose lost set
    holds every degraded layer), the weakest the policy allowed, and what the run keeps and
    loses by it. A layer the policy turned off (network=host) is not a rung matter."""
    if not plan.confined:
        return {"name": "off", "allowed": plan.policy.rung, "reason": "native-local mode"}
    rung = ladder.reached(degraded)
    if rung is None:  # only reachable by layers named in allow_degraded beyond every rung
        return {"name": "below-ladder", "allowed": plan.policy.rung,
                "degraded": sorted(degraded), "loses": "; ".join(LOST[k] for k in
                                                                 sorted(degraded))}
    return {"name": rung.name, "allowed": plan.policy.rung, "degraded": sorted(degraded),
            "keeps": rung.keeps_text, "loses": lost_text(rung, degraded)}


def lost_text(rung: "ladder.Rung", degraded: Iterable[str]) -> str:
    """What a run on ``rung`` lost: the rung's words when it lost all the rung allows, else
    the words of each layer it went without (a run missing only pidns is on no-namespaces
    by the ladder, yet keeps its mount view)."""
    gone = frozenset(degraded)
    if gone == rung.loses:
        return rung.loses_text
    return "; ".join(f"{k}: {LOST[k]}" for k in sorted(gone)) or "nothing"


def _has_patterns(policy) -> bool:  # type: ignore[no-untyped-def]
    """A glob that matched nothing is still listed: the receipt says it matched nothing."""
    return any(getattr(getattr(policy, n), "patterns", ())
               for n in ("read_only_paths", "hidden_paths"))


def _carve_outs(plan) -> dict[str, Any]:
    """The policy's carve-outs and what keeps each (present only when it has some): a
    read-only bind of the path over itself, or the read-only tree it lies in already; a
    mask (an empty, read-only, mode-000 node of its kind) for a hidden path; and the
    directories between a carve-out and its root pinned as mount points (not renamable)."""
    policy = plan.policy
    if not (policy.read_only_paths or policy.hidden_paths or _has_patterns(policy)):
        return {}
    from ..plan.confinement import carved_read_only, pinned_ancestors
    bound = set(carved_read_only(policy))
    masked = {m.decode() for m, _ in plan.masks}

    def hidden_by(p: str) -> str | None:
        return next((h for h in policy.hidden_paths if h != p and values.is_within(p, h)), None)

    ro = {p: "read-only bind over itself (mount view)" if p in bound
          else f"inside hidden path {hidden_by(p)}" if hidden_by(p)
          else "inside a read-only tree of the mount view" for p in policy.read_only_paths}
    def masked_by(p: str) -> str | None:
        return next((m for m in masked if m != p and values.is_within(p, m)), None)

    hidden = {p: "mask: an empty read-only mode-000 node (mount view)" if p in masked
              else f"inside hidden path {hidden_by(p)}" if hidden_by(p)
              else f"inside masked path {masked_by(p)}" for p in policy.hidden_paths}
    # what each glob matched when the policy was made (hcp_linux.policy.globs)
    patterns = {name: {pattern: list(matches) for pattern, matches in
                       getattr(getattr(policy, name), "patterns", ())}
                for name in ("read_only_paths", "hidden_paths")}
    return {"carve_outs": {"read_only_paths": ro, "hidden_paths": hidden,
                           "pinned": pinned_ancestors(policy),
                           **({"patterns": {k: v for k, v in patterns.items() if v}}
                              if any(patterns.values()) else {})}}


def _protected(plan) -> dict[str, Any]:
    """The protected names of this run (hcp_linux.policy.protected): each path and how it is kept
    (a read-only bind, removed or restored after the run, or why not); the symlinks'
    targets, which the after-run sweep restores (a served run's client reads them here)."""
    found = plan.protect
    if found is None or not (found.how or found.stopped or found.recovered):
        return {}
    out: dict[str, Any] = {"protected": dict(found.how)}
    if found.recovered:
        out["protected_recovered"] = dict(found.recovered)
    if found.stopped:
        out["protected_search"] = dict(found.stopped)
    links = {path: target for path, target, _ in found.sweep if isinstance(target, str)}
    if links:
        out["protected_links"] = links
    return out


def _unix_sockets(plan) -> dict[str, Any]:
    """The granted unix sockets and what makes each connectable (present only when the policy
    grants some): the bind of its inode, or the granted root it lies in; whether Landlock also
    mediates connect() (ABI 9's RESOLVE_UNIX) or the view alone decides; and for each
    dangerous one the power it gives (hcp_linux.policy.unix_sockets)."""
    from ..policy.unix_sockets import danger
    policy = plan.policy
    if not policy.unix_socket_binds:
        return {}
    import hcp_linux.landlock as landlock
    resolve = plan.landlock is not None \
        and bool(plan.landlock.handled_fs & landlock.AccessFs.RESOLVE_UNIX)
    bound = {b.target.decode(errors="replace") for b in plan.binds if not b.is_dir}
    view = "mountns" in plan.layers
    out = []
    for path in dict.fromkeys(policy.allow_unix_sockets + policy.allow_dangerous_sockets):
        real = next(s for t, s in policy.unix_socket_binds if t == path)
        at = [t for t, s in policy.unix_socket_binds if s == real and t in bound]
        entry: dict[str, Any] = {
            "path": path, "socket": real,
            "by": (f"bind of its inode at {', '.join(at)} (mount view)" if at
                   else "inside a granted root (in the view already)" if view
                   else "no mount view: every socket the uid can reach is reachable"),
            "landlock": "RESOLVE_UNIX rule (connect to other sockets by path is refused)"
            if resolve else "does not mediate connect() (Landlock before ABI 9)"}
        if path in policy.allow_dangerous_sockets:
            entry["dangerous"] = danger(path) or danger(real) \
                or "acknowledged by allow_dangerous_sockets"
        out.append(entry)
    return {"unix_sockets": out}


def _jail(plan) -> dict[str, Any]:
    """The working directory's access as granted and where HOME and TMPDIR were pointed. A
    read-only jail names what keeps it so: the mount view (a read-only bind, listed with
    the read-only roots) and Landlock (read/execute rights only); native-local keeps
    nothing."""
    out = {"path": plan.cwd.decode(errors="replace"), "access": "read-write",
           "tmp": plan.env.get(b"TMPDIR", b"").decode(errors="replace")}
    if plan.policy.read_only_jail:
        by = [layer for layer in ("mountns", "landlock") if layer in plan.layers]
        if by:
            out.update(access="read-only", enforced_by=by)
        elif plan.confined:  # both allowed to degrade, and gone: only permissions remain
            out.update(access="read-write: read-only asked, but neither a mount view nor "
                              "Landlock is in force", enforced_by=[])
        else:
            out["access"] = "read-write: native-local mode confines nothing"
    return out


def _mount_view(plan) -> dict[str, Any]:
    return dict(
        read_only=[b.target.decode() for b in plan.binds if not b.writable],
        read_write=[b.target.decode() for b in plan.binds if b.writable],
        symlinks={k.decode(): v.decode() for k, v in plan.symlinks},
        masked=[m.decode() for m, _ in plan.masks],
        # the init watches these (no init without a pid namespace: none is watched)
        watched=[w.decode() for w in plan.watch] if "pidns" in plan.layers else [],
        private_tmpfs=["/tmp", "/dev/shm"], proc="fresh" if plan.proc_fresh else "host bind",
        absent_system_roots=list(plan.facts.get("absent_system_roots", [])))


def _verified(plan) -> list[str]:
    """What the child checks right before exec (it refuses to exec otherwise)."""
    if not plan.confined:
        return []
    out = ["NoNewPrivs=1", "capabilities empty"]
    if plan.canary is not None:
        out.append(f"landlock canary {plan.canary} denied")
    if plan.seccomp is not None:
        out.append("Seccomp=2")
    return out


def _landlock_facts(ruleset) -> dict[str, Any]:
    """Facts of the ruleset as the kernel takes it (after ABI masking), from a
    landlock.Ruleset, which knows what its create() makes."""
    return dict(abi=ruleset.abi, ruleset=ruleset.status.name.lower(),
                handled_fs=_names(ruleset.handled_fs), handled_net=_names(ruleset.handled_net),
                scoped=_names(ruleset.scoped))


def _names(flags) -> list[str]:
    key = (type(flags), int(flags))
    names = _flag_names.get(key)
    if names is None:  # enum iteration costs more than the rest of the receipt: once per value
        names = _flag_names[key] = tuple(f.name.lower() for f in type(flags)
                                         if f in flags and f.name)
    return list(names)


_flag_names: dict[tuple[type, int], tuple[str, ...]] = {}


def check_output_path(path: str, what: str, *, replace: bool = True,
                      hint: str = "") -> None:
    """Refuse, before anything runs, an output file that could not be written once it has
    (``what`` names the flag: ``--receipt``, ``--proxy-log``). Found after the run, the
    failure would lose the command's exit status; found now it is one line, exit 125, and
    nothing ran. The parent must be a directory we can write in; the target must not be a
    directory, and when it is ``replace``d (a receipt: temp file + rename) it must be a
    regular file if it exists, or the rename would replace a symlink, a device or a FIFO
    (``/dev/stdout``) itself. Appended to (``replace=False``), it may be any writable
    non-directory. ``hint`` is added to the "not a regular file" refusal."""
    if not path:
        raise PolicyError(f"{what}: empty path")
    shown = f"{what} {printable(path)}"
    if "\0" in path:
        raise PolicyError(f"{shown}: contains a NUL byte")
    if os.path.basename(path) in ("", ".", ".."):
        raise PolicyError(f"{shown}: names a directory, not a file")
    try:
        st = os.lstat(path) if replace else os.stat(path)
    except FileNotFoundError:
        st = None  # created by the write; its parent is checked below
    except OSError as e:
        raise PolicyError(f"{shown}: {e.strerror}") from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise PolicyError(f"{shown}: is a directory")
        if replace and not stat.S_ISREG(st.st_mode):
            raise PolicyError(f"{shown}: not a regular file (it would be replaced){hint}")
        if not replace and not os.access(path, os.W_OK, effective_ids=True):
            raise PolicyError(f"{shown}: not writable")
    parent = os.path.dirname(path) or "."
    why = dir_problem(parent)
    if why is not None:
        raise PolicyError(f"{shown}: directory {printable(parent)}: {why}")


def write_receipt(receipt: Mapping[str, Any], dest: str | IO[str],
                  dir_fd: int | None = None) -> None:
    """Write as JSON; to a path atomically (temp file + rename), or to an open stream.

    The temp file has a name of bounded length beside ``dest`` that says whose it is
    (hcp_linux.jails.reclaim: ``hcp-linux gc`` removes one a killed CLI left) and is removed when
    the write fails; OSError then, for the caller to report in one line. ``dir_fd``: the
    directory of ``dest`` opened before the run (hcp_linux.cli.run_end.open_receipt_dir),
    written in whatever the command did to the path since."""
    text = json.dumps(receipt, indent=2, sort_keys=True) + "\n"
    if not isinstance(dest, str):
        dest.write(text)
        dest.flush()
        return
    from ..jails.reclaim import temp_name
    if dir_fd is None:
        where, name = os.path.dirname(dest), os.path.basename(dest)
        tmp, final = os.path.join(where, temp_name(name)), dest
    else:
        tmp, final = temp_name(os.path.basename(dest)), os.path.basename(dest)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o666, dir_fd=dir_fd)
    try:
        with open(fd, "w", closefd=True) as f:
            f.write(text)
        os.replace(tmp, final, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise
