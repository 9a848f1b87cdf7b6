"""Compile a Policy and a command into a Plan: everything that may fail, done in the parent.

The plan records each granted path's identity (device, inode); the child's mount view is
checked against it, and so is every fd a Landlock rule is made from (opened when the ruleset
is made, closed right after), so a path swapped between check and use is caught (no TOCTOU).
Between runs the runtime holds no fd of a granted root: only the idle spares of the native
executor hold its mounts (release_resources lets them go). What depends on the host's paths
alone is made once and shared (:mod:`hcp_linux.plan.confinement`), the kernel rulesets come from
:mod:`hcp_linux.plan.rulesets`; argv and env become bytes here. The child only executes.
"""
from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Mapping, Sequence, TypeVar

import hcp_linux.landlock as landlock
import hcp_linux.seccomp_profiles as seccomp_profiles

from .. import _libc as L
from ..observe import landlock_log
from ..policy import protected
from ..policy.allowlist import install_prefixes, resolve_bin
from .confinement import (PROC_FENCES, Bind, Confinement, clear_cache, covered, search_path,
                          shared_confinement)
from ..policy.environment import build_env
from ..errors import LayerUnavailableError, PolicyError, SandboxError, printable
from ..policy.limits import pid_fence
from ..policy.policy import LAYERS, NATIVE_LOCAL, Policy, _is_within
from ..protocol import PROXY_ADDRESS
from ..host.remedies import REMEDIES, remedy
from .rulesets import seccomp_filter
from ..policy.values import unpinned_link

_T = TypeVar("_T")


@dataclass(frozen=True)
class Plan:
    """What the child executes. Built whole by :func:`compile_plan`, never patched after
    (a variant is ``dataclasses.replace``'s); shares the cached confinement its view and
    rules come from (close() lets go of it). It holds no fd: its Landlock ruleset opens the
    granted paths when it is made (create), and closes them then. Compiling writes nothing:
    what a run needs on disk (:attr:`private_tmp`) is made by :func:`prepare` at its spawn."""

    policy: Policy
    mode: str
    exe: bytes
    argv: list[bytes]
    env: dict[bytes, bytes]
    cwd: bytes
    layers: frozenset[str]
    parent_pid: int
    uid: int
    gid: int
    cap_last_cap: int
    # the view and the rules: the shared confinement's own tuples (Plan.derived relies on it)
    binds: Sequence[Bind] = ()
    symlinks: Sequence[tuple[bytes, bytes]] = ()
    masks: Sequence[tuple[bytes, bool]] = ()  # (path, is_dir)
    # the view's paths the init watches: one that loses its mount ends the run (confinement)
    watch: Sequence[bytes] = ()
    # /proc entries the view fences on every rung (confinement.PROC_FENCES): (path, masked)
    proc_fences: Sequence[tuple[bytes, bool]] = ()
    rlimits: tuple[tuple[int, int], ...] = ()  # (RLIMIT_*, value)
    tmp_options: bytes = b"mode=1777"
    shm_options: bytes = b"mode=1777"
    wait_for_tree: bool = False
    pid_max: int | None = None  # kernel.pid_max of the sandbox's pid namespace
    proxy: bool = False  # network = "allow": listen for the egress proxy inside the netns
    capture_ports: tuple[int, ...] = ()  # and capture these TCP ports (egress-capture step)
    # and make these allow-list networks local on lo: (address, prefix length)
    capture_nets: tuple[tuple[bytes, int], ...] = ()
    holds_setpcap: bool = True  # the child may drop the bounding set and lock securebits
    proc_fresh: bool = False
    pty: bool = False  # a private devpts instance at /dev/pts, /dev/ptmx -> pts/ptmx
    landlock: "landlock.Ruleset | None" = None
    # landlock_restrict_self's flags (landlock_log.restrict_flags), and whether this run's
    # Landlock denials are read from the audit records (landlock_log.available)
    landlock_restrict: int = 0
    landlock_log: bool = False
    late_rules: Sequence[tuple[bytes, int]] = ()
    canary: str | None = None
    seccomp: "seccomp_profiles.PreparedFilter | None" = None
    seccomp_names: tuple[str, ...] = ()
    # the filter hands its policy denials to the runtime's listener (SECCOMP_RET_USER_NOTIF,
    # installed with SECCOMP_FILTER_FLAG_NEW_LISTENER); else why not, for the receipt
    seccomp_listener: bool = False
    seccomp_unrecorded: str = ""
    env_removed: tuple[str, ...] = ()
    env_replaced: tuple[str, ...] = ()
    facts: dict = field(default_factory=dict)
    # the protected names found for this run (hcp_linux.policy.protected): bound, or swept after it
    protect: "protected.Found | None" = None
    # when the run starts, for the after-run search (hcp_linux.policy.protected.sweep_made):
    # what it made below the top level is what changed since
    protect_since: int = 0
    # without a mount view: the private tmp in the first writable root (HOME, TMPDIR), made
    # at the spawn (prepare), not while compiling
    private_tmp: str | None = None
    _shared: "Confinement | None" = None  # the cached confinement (Plan.derived's memo)

    @property
    def confined(self) -> bool:
        return self.mode != NATIVE_LOCAL

    def close(self) -> None:
        # the one write after construction: a cache handle, not what the child executes
        object.__setattr__(self, "_shared", None)

    def derived(self, key: Hashable, make: Callable[[], _T]) -> _T:
        """``make()``, computed once per shared confinement and ``key``: for what the receipt
        and the native executor derive from the view and the rules. ``key`` names whatever
        else of the plan ``make`` reads. Made afresh when the plan's view is not the
        confinement's own (a plan edited after compile_plan, as tests do)."""
        shared = self._shared
        if shared is None or not (
                self.binds is shared.binds and self.symlinks is shared.symlinks
                and self.masks is shared.masks and self.watch is shared.watch
                and self.late_rules is shared.late_rules
                and self.facts.get("absent_system_roots") is shared.absent):
            return make()
        try:
            return shared.memo[key]
        except KeyError:
            value = shared.memo[key] = make()  # two threads may both make it: same value
            return value


def compile_plan(policy: Policy, argv: Sequence[str], *, layers: frozenset[str],
                 caller_env: Mapping[str, str] | None = None,
                 terminals: Sequence[str] = (), env: Mapping[str, str] | None = None,
                 cwd: str | None = None, executable: str | None = None,
                 allowed: Callable[[frozenset[str]], None] | None = None) -> Plan:
    """Resolve the bin, build the env and the confinement for ``argv`` under ``policy``.

    ``caller_env``: the environment the allow-list draws locale and terminal variables from
    (default ``os.environ``). ``env``: variables the caller grants this command, over the
    policy's (already checked, popen.granted_env); given, nothing is drawn from the caller's
    environment, as with Popen's ``env``. ``cwd``: the command's working directory (default:
    the jail; see :func:`working_dir`). ``executable``: the program to run in place of
    ``argv[0]`` (Popen's), the one the allow-list is asked about. ``allowed``: called with
    the plan's layers once the command is allowed and its layers checked, before the
    confinement is compiled (a served client starts hcp-exec's plan-independent steps
    meanwhile: hcp_linux.cli.serve)."""
    if not policy.resolved:  # a plan opens what the host checks found: never paths as written
        raise ValueError("compile_plan: the policy is not resolved "
                         "(hcp_linux.policy.resolve.resolve; Sandbox(policy) does it)")
    _check_argv(argv)
    native = policy.mode == NATIVE_LOCAL
    workdir = working_dir(policy, cwd)
    lookup = env if env is not None else os.environ if caller_env is None else caller_env
    bin_ = argv[0] if executable is None else executable
    exe = resolve_bin(bin_, policy.allow_bins or (bin_,), cwd=workdir, native_local=native,
                      host_path=lookup.get("PATH"), writable=policy.writable_roots)
    if env is not None:
        caller_env = {}  # Popen's env replaces the environment: nothing else is drawn from
    if native:
        layers = frozenset()
    view = "mountns" in layers
    _check_layers(policy, layers, view, native)
    if allowed is not None:
        allowed(layers)
    shared, found = None, None
    candidates = install_prefixes(exe)
    if unpinned_link(os.path.abspath(exe), policy.writable_roots) is not None:
        # reached through a link a command can re-point (the jail's tool -> ~/.local/bin/x):
        # no grant is derived from where it leads; the binary runs only if the view holds it
        candidates = ()
    if native:
        path = search_path([p for p in candidates if not covered(p, policy)])
    else:
        # Everything that depends on the policy's roots and the host's paths, not on argv or
        # the environment: made once, reused while those paths are unchanged.
        # The protected names as they are right now (what exists changes between runs)
        found = protected.find(policy, view)
        shared = shared_confinement(policy, candidates, layers, tuple(terminals), found)
        path = shared.search_path
    fields = _run_fields(policy, argv, exe, workdir, layers, view, native,
                         caller_env, env, path)
    if shared is None:
        return Plan(**fields)
    fields.update(_confined_fields(policy, layers, shared, found))
    return Plan(**fields)


def _check_argv(argv: Sequence[str]) -> None:
    """A command execve can carry: not empty, each argument text without NUL, valid UTF-8."""
    if not argv:
        raise PolicyError("empty command")
    for i, arg in enumerate(argv):
        if not isinstance(arg, str):
            raise PolicyError(f"argv[{i}]: expected a string")
        if "\0" in arg:
            raise PolicyError(f"argv[{i}]: contains a NUL byte")
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            raise PolicyError(f"argv[{i}]: not valid UTF-8") from None


def _check_layers(policy: Policy, layers: frozenset[str], view: bool, native: bool) -> None:
    """What the policy asks for that the layers this run can have cannot give: refused
    here, in the parent, whatever may degrade (fail closed)."""
    if not view and not native and (policy.read_only_paths or policy.hidden_paths):
        # Landlock only adds rights: without a mount view nothing can take a carve-out back
        # from its writable root. Refused even when mountns may degrade: fail closed.
        field_ = "read_only_paths" if policy.read_only_paths else "hidden_paths"
        raise PolicyError(f"{field_}: carve-outs need the mount view, and no mount namespace "
                          f"can be made here ({remedy('mountns')}); drop the carve-outs "
                          f"to run without one")
    if policy.pty and not view and not native:
        raise SandboxError("pty = true mounts a private devpts in the mount view, and this "
                           "run has none (mountns degraded)")
    if policy.network == "allow" and "netns" not in layers and not native:
        raise LayerUnavailableError("netns", "network = \"allow\" fences egress with a "
                                    "network namespace, and none can be made here",
                                    remedy("netns"))


def _run_fields(policy: Policy, argv: Sequence[str], exe: str, workdir: str,
                layers: frozenset[str], view: bool, native: bool,
                caller_env: Mapping[str, str] | None, env: Mapping[str, str] | None,
                path: str) -> dict[str, Any]:
    """The plan's fields of this one command (argv, env, cwd, limits, the process facts),
    for every mode; the confinement's are :func:`_confined_fields`."""
    private_tmp = None
    if view:
        home = tmpdir = "/tmp"
    else:
        home = tmpdir = private_tmp = os.path.join(_tmp_root(policy), PRIVATE_TMP)
    explicit = dict(policy.env)
    explicit.update(env or {})
    if policy.network == "allow":
        explicit.update(proxy_env(explicit.get("NO_PROXY"), explicit.get("no_proxy")))
    child_env, removed, replaced = _child_env(caller_env, explicit, marker=policy.mode,
                                              path=path, home=home, tmpdir=tmpdir)
    fields: dict[str, Any] = dict(
        policy=policy, mode=policy.mode, exe=os.fsencode(exe),
        argv=[a.encode() for a in argv],
        env=child_env,
        cwd=os.fsencode(workdir), layers=layers, parent_pid=os.getpid(),
        uid=os.getuid(), gid=os.getgid(), cap_last_cap=L.cap_last_cap(), env_removed=removed,
        env_replaced=replaced,
        proc_fresh="pidns" in layers, pty=policy.pty and view,
        proc_fences=PROC_FENCES if view else (),
        rlimits=tuple((r, v) for _, r, v in policy.limits.rlimits()),
        tmp_options=b"mode=1777,size=%d" % policy.limits.tmp_size,
        shm_options=b"mode=1777,size=%d" % policy.limits.shm_size,
        wait_for_tree=policy.on_exit == "wait",
        proxy=policy.network == "allow" and not native,
        holds_setpcap="userns" in layers or L.has_capability(L.CAP_SETPCAP),
        pid_max=pid_fence(policy.limits.nproc) if "pidns" in layers else None,
        private_tmp=private_tmp,
    )
    if fields["proxy"]:
        from ..egress.capture import capture_nets, capture_ports  # only under "allow"
        fields["capture_ports"] = capture_ports(policy.egress())
        fields["capture_nets"] = capture_nets(policy.egress())
    return fields


def _confined_fields(policy: Policy, layers: frozenset[str], shared: Any,
                     found: Any) -> dict[str, Any]:
    """The plan's fields of the confinement (not native-local): the view from the shared
    confinement, the protected names, a copy of the Landlock ruleset (no fd), the seccomp
    program and how denials are recorded."""
    fields: dict[str, Any] = dict(
        _shared=shared, protect=found, protect_since=protected.now(),
        binds=shared.binds, symlinks=shared.symlinks, masks=shared.masks, watch=shared.watch,
        late_rules=shared.late_rules, canary=shared.canary,
        landlock=shared.ruleset.copy() if shared.ruleset is not None else None,  # no fd
        facts={"absent_system_roots": shared.absent})
    seccomp = seccomp_filter(policy, layers)
    if seccomp is not None:
        fields["seccomp"], fields["seccomp_names"], fields["seccomp_unrecorded"] = seccomp
        fields["seccomp_listener"] = not fields["seccomp_unrecorded"]
    if fields["landlock"] is not None:
        # Read where the runtime learns the domain's maker: from the listener's message.
        fields["landlock_log"] = fields.get("seccomp_listener", False) \
            and not landlock_log.available()
        fields["landlock_restrict"] = landlock_log.restrict_flags(fields["landlock_log"])
    return fields


def working_dir(policy: Policy, cwd: str | None) -> str:
    """The command's working directory: the jail, or ``cwd`` (a relative one starts at the
    jail, the sandbox's own working directory). It must be an existing directory inside a
    tree the sandbox's view holds at the same path as the host (the jail, a write root, a
    read-only or system root): checked here, on its canonical path, which the plan keeps;
    the child changes to that path inside the view and resolves nothing else."""
    assert policy.jail is not None
    if cwd is None:
        return policy.jail
    real = os.path.realpath(os.path.join(policy.jail, cwd))  # "l/.." is l's target's parent
    shown = printable(cwd) if real == cwd else f"{printable(cwd)} ({printable(real)})"
    if not os.path.isdir(real):
        raise PolicyError(f"cwd: {shown} is not an existing directory")
    roots = policy.writable_roots + policy.read_only_roots + tuple(
        os.path.realpath(p) for p in policy.system_roots if os.path.isdir(p))
    if not any(_is_within(real, r) for r in roots):
        raise PolicyError(f"cwd: {shown} is outside the sandbox's view (the jail, "
                          f"write_roots, read_only_roots, system_roots)")
    return real


def _child_env(caller_env: Mapping[str, str] | None, explicit: Mapping[str, str], **fixed: str
               ) -> tuple[dict[bytes, bytes], tuple[str, ...], tuple[str, ...]]:
    """build_env's result, encoded for the plan. Built from ``os.environ`` (``caller_env``
    None), it is kept and reused while the raw environment and the rest are unchanged: a
    copy and a comparison instead of decoding and filtering every variable on every run. The
    environment is read once, as a snapshot, and the result is built from that snapshot."""
    global _env_memo
    key = None
    if caller_env is None:  # os.environb: the environment's bytes, public (~14 us for 35)
        snapshot = dict(os.environb)
        key = (snapshot, tuple(explicit.items()), tuple(fixed.items()))
        memo = _env_memo
        if memo is not None and memo[0] == key:
            env, removed, replaced = memo[1]
            return env.copy(), removed, replaced
        caller = {os.fsdecode(k): os.fsdecode(v) for k, v in snapshot.items()}
    else:
        caller = dict(caller_env)
    text, removed, replaced = build_env(caller, explicit, **fixed)  # type: ignore[arg-type]
    env = {k.encode(): v.encode() for k, v in text.items()}
    if key is not None:
        _env_memo = (key, (env.copy(), removed, replaced))
    return env, removed, replaced


_env_memo: tuple | None = None


def proxy_env(*granted: str | None) -> dict[str, str]:
    """Every spelling of the proxy variables that tools read. NO_PROXY keeps the sandbox's
    own loopback direct (it is private to the sandbox); ``granted``: NO_PROXY values the
    policy grants, whose entries are kept after those (merged, not overwritten: a direct
    connection has no route out of the sandbox, so an entry widens nothing)."""
    url = "http://%s:%d" % PROXY_ADDRESS
    env = {}
    for key in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env[key] = env[key.lower()] = url
    entries = ["localhost", "127.0.0.1", "::1"]
    for value in granted:
        for entry in (value or "").split(","):
            if entry.strip() and entry.strip() not in entries:
                entries.append(entry.strip())
    env["NO_PROXY"] = env["no_proxy"] = ",".join(entries)
    return env


def _tmp_root(policy: Policy) -> str:
    """Where the private tmp goes without a mount view: the first writable root (the jail,
    or with ``read_only_jail`` the first write root). A read-only jail is never written to:
    with no writable root at all there is no place for HOME and TMPDIR, and the run is
    refused rather than given the host's shared /tmp."""
    roots = policy.writable_roots
    if not roots:
        raise PolicyError("read_only_jail: without a mount view (mountns degraded, or "
                          "native-local) HOME and TMPDIR live in <writable root>/.hcp-tmp, "
                          "and this policy has no writable root (give --write-root DIR)")
    return roots[0]


#: The private tmp's name in the first writable root, without a mount view.
PRIVATE_TMP = ".hcp-tmp"


def prepare(plan: Plan) -> None:
    """What a run needs on disk before its spawn, and compiling did not make: without a
    mount view, the private tmp (:attr:`Plan.private_tmp`, self-ignored by git). SandboxError
    when it cannot be made (a link left there is never followed)."""
    if plan.private_tmp is not None:
        _private_tmp_in_jail(os.path.dirname(plan.private_tmp))


def _private_tmp_in_jail(jail: str) -> str:
    """Without a mount view there is no private /tmp: use a self-ignored dir in the jail
    (the first writable root: :func:`_tmp_root`)."""
    tmp = os.path.join(jail, PRIVATE_TMP)
    # Made and entered by fd with no symlink followed: an earlier command could have left
    # .hcp-tmp (or its .gitignore) as a link, and the runtime must not create files where
    # it points (nor hand it to the command as HOME).
    try:
        jail_fd = os.open(jail, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            try:
                os.mkdir(PRIVATE_TMP, 0o700, dir_fd=jail_fd)
            except FileExistsError:
                pass
            tmp_fd = os.open(PRIVATE_TMP, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                             | os.O_CLOEXEC, dir_fd=jail_fd)
        finally:
            os.close(jail_fd)
        try:
            fd = os.open(".gitignore", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o644, dir_fd=tmp_fd)
        except FileExistsError:
            pass
        else:
            with open(fd, "w") as f:
                f.write("*\n")
        finally:
            os.close(tmp_fd)
    except OSError as e:
        why = "a symlink or not a directory (not followed)" \
            if e.errno in (errno.ELOOP, errno.ENOTDIR) else e.strerror
        raise SandboxError(f"{printable(tmp)}: {why}; remove it to let the run make its "
                           f"private tmp there") from None
    return tmp


__all__ = ["Plan", "Bind", "compile_plan", "prepare", "clear_cache", "REMEDIES", "LAYERS"]
