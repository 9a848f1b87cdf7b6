"""Compile a Policy and a command into a Plan: everything that may fail, done in the parent.

The plan records each granted path's identity (device, inode); the child's mount view is
checked against it, and so is every fd a Landlock rule is made from (opened when the ruleset
is made, closed right after), so a path swapped between check and use is caught (no TOCTOU).
Between runs the runtime holds no fd of a granted root: only the idle spares of the native
executor hold its mounts (release_resources lets them go). The seccomp program is compiled
here (cached per profile set); argv and env become bytes. The child only executes.
"""
from __future__ import annotations

import errno
import glob
import os
import stat
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Hashable, Mapping, Sequence, TypeVar

from hcp_linux import landlock
from hcp_linux import seccomp_profiles

from . import _libc as L
from .allowlist import SANDBOX_PATH, install_prefixes, resolve_bin
from .protocol import CANARY, PROXY_ADDRESS
from .environment import build_env
from .errors import ChildSetupError, LayerUnavailableError, PolicyError, printable
from .limits import pid_fence
from .policy import LAYERS, NATIVE_LOCAL, Policy, _is_within

#: Device files every tool expects; each is bound read-write from the host.
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")

#: Secrets that live inside the read-only system roots. Root-owned with owner-read bits, they
#: stay readable to a sandbox launched as root (uid 0 keeps its ownership even with no
#: capability), so the view covers each with an unreadable empty file or directory.
MASKED_PATHS = (
    "/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers",
    "/etc/sudoers.d", "/etc/security/opasswd", "/etc/krb5.keytab", "/etc/ipsec.secrets",
    "/etc/ppp/chap-secrets", "/etc/ppp/pap-secrets", "/etc/ssl/private", "/etc/wireguard",
    "/etc/NetworkManager/system-connections", "/etc/letsencrypt", "/etc/ssh/ssh_host_*_key",
)


def _ancestors(path: str) -> list[str]:
    """``/a/b/c`` -> ``/a``, ``/a/b``, ``/a/b/c``."""
    parts = path.strip("/").split("/")
    return ["/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1)]


#: The directories whose listings decide which MASKED_PATHS exist (each pattern's parent and
#: that parent's ancestors): a cached confinement is remade when one of them changes.
_MASK_DIRS = tuple(dict.fromkeys(d for p in MASKED_PATHS for d in _ancestors(os.path.dirname(p))))

_FS = landlock.AccessFs
_RO_ACCESS = _FS.EXECUTE | _FS.READ_FILE | _FS.READ_DIR
_DEV_ACCESS = _FS.READ_FILE | _FS.WRITE_FILE | _FS.TRUNCATE
_PROC_ACCESS = _FS.READ_FILE | _FS.READ_DIR

#: The Landlock ABI whose rights, network rights and scopes the policy handles. Pinned rather
#: than the binding's LATEST_ABI (the moving target rust-landlock warns against): when the
#: binding learns a newer ABI, what a command may do changes only when this is bumped, with
#: tests/test_landlock_policy_abi.py, which lists the handled rights by name, updated with it.
POLICY_ABI = 8

#: Landlock rights the default policy cannot do without: truncate (ABI 3) would otherwise be
#: unmediated. Scopes (ABI 6) are required only where no namespace covers for them.
_REQUIRED_FS = landlock.AccessFs.from_abi(3)

_T = TypeVar("_T")

REMEDIES = {
    "userns": "enable unprivileged user namespaces (sysctl user.max_user_namespaces>0, "
              "kernel.unprivileged_userns_clone=1; on Ubuntu 23.10+ "
              "kernel.apparmor_restrict_unprivileged_userns=0 or an AppArmor profile with 'userns')",
    "mountns": "allow mount namespaces (they need a user namespace, or root)",
    "netns": "allow network namespaces (they need a user namespace, or root)",
    "ipcns": "allow IPC namespaces (they need a user namespace, or root)",
    "pidns": "allow pid namespaces (they need a user namespace, or root)",
    "landlock": "boot a kernel >= 6.2 with Landlock enabled (CONFIG_SECURITY_LANDLOCK=y and "
                "'landlock' in the lsm= boot parameter)",
    "seccomp": "use a kernel with CONFIG_SECCOMP_FILTER=y that lets this process add filters",
}


@dataclass(frozen=True)
class Bind:
    """One granted tree of the mount view (the same path inside as outside)."""

    source: bytes
    target: bytes
    is_dir: bool
    dev: int
    ino: int
    attrs: int  # MOUNT_ATTR_* set recursively on the clone
    writable: bool
    access: int = 0  # the Landlock rule on it (effective rights; 0: none, or no Landlock)


@dataclass
class Plan:
    """What the child executes. Built by :func:`compile_plan`; shares the cached confinement
    its view and rules come from (close() lets go of it). It holds no fd: its Landlock ruleset
    opens the granted paths when it is made (create), and closes them then."""

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
    rlimits: list[tuple[int, int]] = field(default_factory=list)  # (RLIMIT_*, value)
    tmp_options: bytes = b"mode=1777"
    shm_options: bytes = b"mode=1777"
    wait_for_tree: bool = False
    pid_max: int | None = None  # kernel.pid_max of the sandbox's pid namespace
    proxy: bool = False  # network = "allow": listen for the egress proxy inside the netns
    holds_setpcap: bool = True  # the child may drop the bounding set and lock securebits
    proc_fresh: bool = False
    landlock: "landlock.Ruleset | None" = None
    late_rules: Sequence[tuple[bytes, int]] = ()
    canary: str | None = None
    seccomp: "seccomp_profiles.PreparedFilter | None" = None
    seccomp_names: tuple[str, ...] = ()
    env_removed: tuple[str, ...] = ()
    env_replaced: tuple[str, ...] = ()
    facts: dict = field(default_factory=dict)
    _shared: "_Confinement | None" = None  # the cached confinement (Plan.derived's memo)

    @property
    def confined(self) -> bool:
        return self.mode != NATIVE_LOCAL

    def close(self) -> None:
        self._shared = None

    def derived(self, key: Hashable, make: Callable[[], _T]) -> _T:
        """``make()``, computed once per shared confinement and ``key``: for what the receipt
        and the native executor derive from the view and the rules. ``key`` names whatever
        else of the plan ``make`` reads. Made afresh when the plan's view is not the
        confinement's own (a plan edited after compile_plan, as tests do)."""
        shared = self._shared
        if shared is None or not (
                self.binds is shared.binds and self.symlinks is shared.symlinks
                and self.masks is shared.masks and self.late_rules is shared.late_rules
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
                 cwd: str | None = None, executable: str | None = None) -> Plan:
    """Resolve the bin, build the env and the confinement for ``argv`` under ``policy``.

    ``caller_env``: the environment the allow-list draws locale and terminal variables from
    (default ``os.environ``). ``env``: variables the caller grants this command, over the
    policy's (already checked, popen.granted_env); given, nothing is drawn from the caller's
    environment, as with Popen's ``env``. ``cwd``: the command's working directory (default:
    the jail; see :func:`working_dir`). ``executable``: the program to run in place of
    ``argv[0]`` (Popen's), the one the allow-list is asked about."""
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
    native = policy.mode == NATIVE_LOCAL
    bin_ = argv[0] if executable is None else executable
    allow = policy.allow_bins or (bin_,)
    workdir = working_dir(policy, cwd)
    lookup = env if env is not None else os.environ if caller_env is None else caller_env
    exe = resolve_bin(bin_, allow, cwd=workdir, native_local=native,
                      host_path=lookup.get("PATH"), writable=policy.writable_roots)
    if env is not None:
        caller_env = {}  # Popen's env replaces the environment: nothing else is drawn from
    if native:
        layers = frozenset()
    view = "mountns" in layers
    shared = None
    if native:
        prefixes = [p for p in install_prefixes(exe) if not _covered(p, policy)]
        search_path = _search_path(prefixes)
    else:
        # Everything that depends on the policy's roots and the host's paths, not on argv or
        # the environment: made once, reused while those paths are unchanged.
        shared = _confinement(policy, install_prefixes(exe), layers, tuple(terminals))
        search_path = shared.search_path
    if view:
        home = tmpdir = "/tmp"
    else:
        home = tmpdir = _private_tmp_in_jail(_tmp_root(policy))
    explicit = dict(policy.env)
    explicit.update(env or {})
    if policy.network == "allow":
        if "netns" not in layers and not native:
            raise LayerUnavailableError("netns", "network = \"allow\" fences egress with a "
                                        "network namespace, and none can be made here",
                                        REMEDIES["netns"])
        explicit.update(proxy_env())
    child_env, removed, replaced = _child_env(caller_env, explicit, marker=policy.mode,
                                              path=search_path, home=home, tmpdir=tmpdir)
    plan = Plan(
        policy=policy, mode=policy.mode, exe=os.fsencode(exe),
        argv=[a.encode() for a in argv],
        env=child_env,
        cwd=os.fsencode(workdir), layers=layers, parent_pid=os.getpid(),
        uid=os.getuid(), gid=os.getgid(), cap_last_cap=L.cap_last_cap(), env_removed=removed,
        env_replaced=replaced,
        proc_fresh="pidns" in layers, rlimits=[(r, v) for _, r, v in policy.limits.rlimits()],
        tmp_options=b"mode=1777,size=%d" % policy.limits.tmp_size,
        shm_options=b"mode=1777,size=%d" % policy.limits.shm_size,
        wait_for_tree=policy.on_exit == "wait",
        proxy=policy.network == "allow" and not native,
        holds_setpcap="userns" in layers or L.has_capability(L.CAP_SETPCAP),
        pid_max=pid_fence(policy.limits.nproc) if "pidns" in layers else None,
    )
    if shared is None:
        return plan
    plan._shared = shared
    plan.binds, plan.symlinks, plan.masks = shared.binds, shared.symlinks, shared.masks
    plan.late_rules, plan.canary = shared.late_rules, shared.canary
    plan.landlock = shared.ruleset.copy() if shared.ruleset is not None else None  # no fd
    plan.facts["absent_system_roots"] = shared.absent
    try:
        _plan_seccomp(plan, policy, layers)
    except BaseException:
        plan.close()
        raise
    return plan


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
    None), it is kept and reused while the raw environment and the rest are unchanged: one
    C-level comparison instead of decoding and filtering every variable on every run. The
    environment is read once, as a snapshot, and the result is built from that snapshot."""
    global _env_memo
    raw = getattr(os.environ, "_data", None) if caller_env is None else None
    key = None
    if isinstance(raw, dict):  # CPython: os.environ's own bytes -> bytes dict
        snapshot = raw.copy()
        key = (snapshot, tuple(explicit.items()), tuple(fixed.items()))
        memo = _env_memo
        if memo is not None and memo[0] == key:
            env, removed, replaced = memo[1]
            return env.copy(), removed, replaced
        caller = {os.fsdecode(k): os.fsdecode(v) for k, v in snapshot.items()}
    else:
        caller = dict(os.environ if caller_env is None else caller_env)
    text, removed, replaced = build_env(caller, explicit, **fixed)  # type: ignore[arg-type]
    env = {k.encode(): v.encode() for k, v in text.items()}
    if key is not None:
        _env_memo = (key, (env.copy(), removed, replaced))
    return env, removed, replaced


_env_memo: tuple | None = None


def _search_path(prefixes: Sequence[str]) -> str:
    path_dirs = [os.path.join(p, "bin") for p in prefixes if os.path.isdir(os.path.join(p, "bin"))]
    return ":".join(path_dirs + list(SANDBOX_PATH))


def proxy_env() -> dict[str, str]:
    """Every spelling of the proxy variables that tools read. NO_PROXY keeps the sandbox's
    own loopback direct (it is private to the sandbox)."""
    url = "http://%s:%d" % PROXY_ADDRESS
    env = {}
    for key in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env[key] = env[key.lower()] = url
    env["NO_PROXY"] = env["no_proxy"] = "localhost,127.0.0.1,::1"
    return env


def _covered(prefix: str, policy: Policy) -> bool:
    roots = policy.writable_roots + policy.readable_roots + tuple(
        os.path.realpath(p) for p in policy.system_roots if os.path.exists(p))
    return any(_is_within(prefix, r) for r in roots)


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


def _private_tmp_in_jail(jail: str) -> str:
    """Without a mount view there is no private /tmp: use a self-ignored dir in the jail
    (the first writable root: :func:`_tmp_root`)."""
    tmp = os.path.join(jail, ".hcp-tmp")
    os.makedirs(tmp, mode=0o700, exist_ok=True)
    ignore = os.path.join(tmp, ".gitignore")
    if not os.path.exists(ignore):
        with open(ignore, "w") as f:
            f.write("*\n")
    return tmp


class _Confinement:
    """The part of a plan that depends on the policy's roots and the host's paths: the mount
    view (binds with their inodes, symlinks, masks), the Landlock rules (each granted path with
    its inode: the grants) and the sandbox PATH. Building it costs ~0.5 ms of stats, realpaths
    and globs, so it is made once per key and reused while a cheap re-stat of every path it was
    made from (the *stamp*) is unchanged; any change (a root swapped, a secret file added under
    /etc) makes a new one. Plans share it. It holds no fd and no mount: identities only, so the
    cache never keeps a granted root's file system busy."""

    def __init__(self) -> None:
        # tuples: plans share these very objects (Plan.derived checks that by identity)
        self.binds: tuple[Bind, ...] = ()
        self.symlinks: tuple[tuple[bytes, bytes], ...] = ()
        self.masks: tuple[tuple[bytes, bool], ...] = ()
        self.late_rules: tuple[tuple[bytes, int], ...] = ()
        self.canary: str | None = None
        self.ruleset: _GrantedRuleset | None = None  # a template, never created: copied
        self.absent: tuple[str, ...] = ()
        self.search_path = ""
        self.watched: tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]] = ((), (), ())
        self.stamp: tuple | None = None  # None: made while its paths changed; not reused
        self.memo: dict = {}  # Plan.derived

    def current(self) -> bool:
        """True while every path it was made from is as it was."""
        return _stamp(self.watched) == self.stamp


#: A path a Landlock rule is granted on: (path, st_dev, st_ino, requested access).
_Grant = tuple[str, int, int, int]


class _GrantedRuleset(landlock.Ruleset):
    """A plan's Landlock ruleset: the confinement's handled rights, and a rule on each of its
    grants, added only when the kernel ruleset is made (:meth:`create`, by the ctypes executor,
    or by hcp-exec's parent when there is no mount view). Each path is then opened
    (``O_PATH``), checked to be the very inode the plan (and the mount view) recorded, given
    its rule, and closed once the ruleset is made: nothing stays open between runs. A path
    that changed since it was checked refuses the run (step ``landlock-rules``, ESTALE)."""

    _grants: tuple[_Grant, ...] = ()

    @staticmethod
    def of(template: landlock.Ruleset, grants: tuple[_Grant, ...]) -> "_GrantedRuleset":
        """A copy of ``template`` (no path rules of its own) that adds ``grants`` at create()."""
        twin = landlock.Ruleset.copy(template)  # a plain Ruleset, whatever template is
        twin.__class__ = _GrantedRuleset  # the same state: only create() and copy() differ
        twin._grants = grants  # type: ignore[attr-defined]
        return twin  # type: ignore[return-value]

    def copy(self) -> "_GrantedRuleset":
        """An uncreated twin with the same rights and grants (a plan's own, from the cache's)."""
        return _GrantedRuleset.of(self, self._grants)

    def create(self) -> "landlock.CreatedRuleset":
        fds: list[int] = []
        try:
            for path, dev, ino, access in self._grants:
                try:
                    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                except OSError as e:
                    raise ChildSetupError("landlock-rules", e.errno or errno.EIO, path) from None
                fds.append(fd)
                st = os.fstat(fd)
                if (st.st_dev, st.st_ino) != (dev, ino):
                    raise ChildSetupError("landlock-rules", errno.ESTALE,
                                          path + " changed since it was checked")
                self.add_path(fd, landlock.AccessFs(access))
            return super().create()
        except BaseException:
            self.close()  # created once or never: no half-made rules left for a retry
            raise
        finally:
            for fd in fds:
                os.close(fd)


_CONFINEMENTS_MAX = 16
_confinements: dict[tuple, _Confinement] = {}  # insertion order: least recently made first
_confinements_lock = threading.Lock()
#: How old a watched directory's mtime must be before a confinement made from it is kept: a
#: change within the same tick of the file system's coarse clock could keep the same mtime.
_RACY_NS = 50_000_000
#: Where this process's confinements came from (tests, bench): reused, made, made but not kept.
cache_stats = {"reused": 0, "made": 0, "not_kept": 0}


def _confinement(policy: Policy, candidates: tuple[str, ...], layers: frozenset[str],
                 terminals: tuple[str, ...]) -> _Confinement:
    """The confinement for this policy, layers, terminals and install prefixes, reused while
    current."""
    # the jail is in one of the two root lists (readable_roots when read-only): the key
    # tells a read-only jail from a writable one
    key = (policy.system_roots, policy.readable_roots, policy.writable_roots, policy.network,
           layers, terminals, candidates)
    with _confinements_lock:
        conf = _confinements.get(key)
    if conf is not None:
        if conf.current():
            cache_stats["reused"] += 1
            return conf
        with _confinements_lock:
            if _confinements.get(key) is conf:  # stale: forget it
                del _confinements[key]
    conf = _make_confinement(policy, candidates, layers, terminals)
    with _confinements_lock:
        if conf.stamp is None:  # its paths changed while it was made: this plan's alone
            cache_stats["not_kept"] += 1
            return conf
        cache_stats["made"] += 1
        _confinements.pop(key, None)  # another thread's, made meanwhile: this one is newer
        _confinements[key] = conf
        while len(_confinements) > _CONFINEMENTS_MAX:
            del _confinements[next(iter(_confinements))]
    return conf


def clear_cache() -> None:
    """Forget every cached confinement: the next plan of each policy is made afresh."""
    with _confinements_lock:
        _confinements.clear()


def _stamp(watched: tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]) -> tuple:
    """Identity of what a confinement was made from: (dev, ino, mode) of each path, followed
    (what open() reaches) or not (a symlink itself), and (dev, ino, mtime) of each directory
    whose listing was read; None for a path that is absent."""
    followed, unfollowed, listed = watched
    out: list = []
    for paths, fn in ((followed, os.stat), (unfollowed, os.lstat)):
        for path in paths:
            try:
                st = fn(path)
                out.append((st.st_dev, st.st_ino, st.st_mode))
            except OSError:
                out.append(None)
    for path in listed:
        try:
            st = os.stat(path)
            out.append((st.st_dev, st.st_ino, st.st_mtime_ns))
        except OSError:
            out.append(None)
    return tuple(out)


def _make_confinement(policy: Policy, candidates: tuple[str, ...], layers: frozenset[str],
                      terminals: Sequence[str]) -> _Confinement:
    conf = _Confinement()
    prefixes = [p for p in candidates if not _covered(p, policy)]
    view = "mountns" in layers
    bins = [os.path.join(p, "bin") for p in prefixes]
    grant_paths = (*policy.readable_roots, *prefixes, *policy.writable_roots, *DEVICES,
                   *terminals, "/proc")
    conf.watched = (tuple(dict.fromkeys((*grant_paths, *bins))), tuple(policy.system_roots),
                    _MASK_DIRS if view else ())
    before = _stamp(conf.watched)  # before looking: a change while we look shows as a miss
    conf.search_path = _search_path(prefixes)
    _plan_view_and_rules(conf, policy, prefixes, layers, terminals)
    after = _stamp(conf.watched)
    listings = after[len(after) - len(conf.watched[2]):]
    racy = time.time_ns() - _RACY_NS
    if after == before and not any(st is not None and st[2] > racy for st in listings):
        conf.stamp = after
    return conf


def _plan_view_and_rules(conf: _Confinement, policy: Policy, prefixes: list[str],
                         layers: frozenset[str], terminals: Sequence[str]) -> None:
    view = "mountns" in layers
    proc_fresh = "pidns" in layers
    ro_attrs = L.MOUNT_ATTR_RDONLY | L.MOUNT_ATTR_NOSUID | L.MOUNT_ATTR_NODEV
    rw_attrs = L.MOUNT_ATTR_NOSUID | L.MOUNT_ATTR_NODEV
    grants: list[tuple[str, int, int, bool]] = []  # (path, landlock access, mount attrs, writable)
    absent: list[str] = []
    symlinks: list[tuple[bytes, bytes]] = []
    for root in policy.system_roots:
        if os.path.islink(root):
            # usr-merged systems: /bin -> usr/bin. Recreate the link when its target is granted.
            real = os.path.realpath(root)
            if any(_is_within(real, r) for r in policy.system_roots
                   if os.path.isdir(r) and not os.path.islink(r)):
                symlinks.append((os.fsencode(root), os.fsencode(os.readlink(root))))
            else:
                absent.append(root)
            continue
        if not os.path.isdir(root):
            absent.append(root)
            continue
        grants.append((root, _RO_ACCESS, ro_attrs, False))
    for root in policy.readable_roots + tuple(prefixes):  # a read-only jail among them
        grants.append((root, _RO_ACCESS, ro_attrs, False))
    # Ask for every right this binding knows; the ruleset masks what the kernel lacks.
    full = int(landlock.AccessFs.from_abi(POLICY_ABI))
    for root in policy.writable_roots:
        grants.append((root, full, rw_attrs, True))
    for dev in DEVICES:
        if os.path.exists(dev):
            grants.append((dev, _DEV_ACCESS, L.MOUNT_ATTR_NOSUID, True))
    for tty in dict.fromkeys(terminals):
        # Only the terminal the command was given, so ttyname() works; never all of
        # /dev/pts, which holds the user's other terminals.
        grants.append((tty, _DEV_ACCESS | _FS.IOCTL_DEV, L.MOUNT_ATTR_NOSUID, True))
    if view and not proc_fresh:
        grants.append(("/proc", _PROC_ACCESS,
                       L.MOUNT_ATTR_NOSUID | L.MOUNT_ATTR_NODEV | L.MOUNT_ATTR_NOEXEC, False))

    template = _landlock_ruleset(policy, layers) if "landlock" in layers else None
    # Each path is opened once, for its identity and (in a scratch copy of the ruleset, which
    # masks and strips as create() will) its effective rule, then closed: the confinement
    # keeps identities only. A plan's ruleset opens them again when it is made, and checks.
    opened = []
    fds: list[int] = []
    try:
        scratch = template.copy() if template is not None else None
        for path, access, attrs, writable in grants:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            fds.append(fd)
            st = os.fstat(fd)
            opened.append((path, access, fd, st, attrs, writable))
            if scratch is not None:
                scratch.add_path(fd, landlock.AccessFs(access))
        rules = dict(scratch.path_rules()) if scratch is not None else {}
    finally:
        for fd in fds:
            os.close(fd)
    # Each bind carries its Landlock rule: the native executor adds it on the very mount it
    # cloned (and checked), so that a spare can be Landlocked before the plan comes.
    binds = [Bind(os.fsencode(path), os.fsencode(path), stat.S_ISDIR(st.st_mode), st.st_dev,
                  st.st_ino, attrs, writable, int(rules.get(fd, 0)))
             for path, _, fd, st, attrs, writable in opened] if view else []
    binds.sort(key=lambda b: (b.target.count(b"/"), b.target))
    conf.binds, conf.symlinks, conf.absent = tuple(binds), tuple(symlinks), tuple(absent)
    if view:
        conf.masks = tuple(_masks(policy, [p for p, _, _, _, _, w in opened if not w]))
    if template is not None:
        if view:
            conf.late_rules = ((b"/", int(_FS.READ_DIR)), (b"/proc", int(_PROC_ACCESS)),
                               (b"/tmp", full), (b"/dev/shm", full))
            conf.canary = CANARY
        else:
            conf.late_rules = ((b"/proc", int(_PROC_ACCESS)),)
            conf.canary = "/"  # no rule grants the host root itself
        conf.ruleset = _GrantedRuleset.of(template, tuple(
            (path, st.st_dev, st.st_ino, int(access)) for path, access, _, st, _, _ in opened))


def _masks(policy: Policy, granted: Sequence[str]) -> list[tuple[bytes, bool]]:
    """The secrets to cover in the view: those under a read-only root it holds (a root the
    policy left out, /etc say, is absent already; one under a writable root is the user's)."""
    out = []
    for pattern in MASKED_PATHS:
        for path in sorted(glob.glob(pattern)):
            if os.path.islink(path) or any(_is_within(path, w) for w in policy.writable_roots):
                continue
            if not any(_is_within(path, r) for r in granted):
                continue
            out.append((os.fsencode(path), os.path.isdir(path)))
    return out


def _landlock_ruleset(policy: Policy, layers: frozenset[str]) -> "landlock.Ruleset":
    pinned = POLICY_ABI
    try:
        abi = landlock.abi_version()
    except landlock.SyscallError as e:  # e.g. a seccomp filter on this process refuses it
        raise LayerUnavailableError("landlock", f"landlock_create_ruleset: {e.strerror}",
                                    REMEDIES["landlock"]) from None
    if abi == 0:
        raise LayerUnavailableError("landlock", "the kernel has no Landlock (ABI 0)",
                                    REMEDIES["landlock"])
    handled_net = landlock.AccessNet(0)
    if "netns" not in layers and policy.network == "none":
        # No private network namespace: refuse every TCP bind and connect instead.
        handled_net = landlock.AccessNet.from_abi(pinned)
    required: list = [_REQUIRED_FS]
    if not {"netns", "pidns"} <= layers:
        # Scopes stand in for the namespaces that would otherwise isolate abstract unix
        # sockets (netns) and hide outside processes from kill() (pidns).
        required.append(landlock.Scope.from_abi(pinned))
    if handled_net:
        required.append(handled_net)
    try:
        return landlock.Ruleset(handled_fs=landlock.AccessFs.from_abi(pinned),
                                handled_net=handled_net, scoped=landlock.Scope.from_abi(pinned),
                                required=tuple(required))
    except (landlock.UnsupportedError, landlock.IncompatibleError) as e:
        raise LayerUnavailableError("landlock", str(e), REMEDIES["landlock"]) from None


def _plan_seccomp(plan: Plan, policy: Policy, layers: frozenset[str]) -> None:
    if "seccomp" not in layers:
        return
    names = tuple(policy.seccomp_profiles)
    if "netns" not in layers and policy.network == "none" and "network-off" not in names:
        names += ("network-off",)
    try:
        bpf = seccomp_profiles.compile_profiles(names)
    except seccomp_profiles.SeccompCompileError as e:
        # libseccomp asks the kernel what it supports while compiling: a host (or a filter on
        # this process) without seccomp fails here, before any child could try to install it.
        raise LayerUnavailableError("seccomp", f"compiling the filter failed: {e}",
                                    REMEDIES["seccomp"]) from None
    except seccomp_profiles.SeccompProfileError as e:
        raise PolicyError(f"seccomp: {e}") from None
    prepared = _prepared_filters.get(bpf)
    if prepared is None:  # read-only once made: plans (and threads) share it
        prepared = _prepared_filters[bpf] = seccomp_profiles.PreparedFilter(bpf)
    plan.seccomp = prepared
    plan.seccomp_names = names


_prepared_filters: dict[bytes, "seccomp_profiles.PreparedFilter"] = {}


__all__ = ["Plan", "Bind", "compile_plan", "REMEDIES", "LAYERS"]
