"""The confinement: the part of a plan made from the policy's roots and the host's paths.

The mount view (binds with their identities, symlinks, masked secrets), the Landlock rules
(each granted path with its inode) and the sandbox PATH, made once and cached while a re-stat of
every path they were made from (the *stamp*) is unchanged.
"""
from __future__ import annotations

import errno
import glob
import os
import stat
import threading
import time
from dataclasses import dataclass
from typing import Sequence

import hcp_linux.landlock as landlock

from .. import _libc as L
from ..policy.allowlist import SANDBOX_PATH
from ..errors import PolicyError, printable
from ..policy.policy import Policy, _is_within
from ..policy.protected import Found
from ..protocol import CANARY
from .rulesets import POLICY_ABI, GrantedRuleset, landlock_ruleset

__all__ = ["Bind", "Confinement", "DEVICES", "MASKED_PATHS", "PROC_FENCES", "cache_stats", "clear_cache",
           "carved_read_only", "covered", "merged_masks", "pinned_ancestors", "search_path", "shared_confinement"]

#: Device files every tool expects; each is bound read-write from the host.
#: The view's /etc/resolv.conf under network = "allow": names protocol.RESOLVER_ADDRESS (a
#: file shipped with the package, so its identity is stable; tests check it agrees).
RESOLV_CONF = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "egress",
                           "resolv.conf")
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


#: The view's /proc entries that reach past the sandbox, fenced on every rung with a mount
#: view (Docker's read-only and masked paths): (path, masked). Read-only (False): a bind of
#: the entry over itself, made read-only recursively. Masked (True): covered by an empty,
#: mode-000, read-only node. Why on every rung: a sysctl's write permission is a check of
#: the euid against the host's root (proc_sys_permission: no capability is asked), so with a
#: uid map 0 -> 0, or no user namespace, the command may write /proc/sys/kernel/core_pattern
#: (one crash then runs a program as host root), /proc/sysrq-trigger, /proc/irq/*/
#: smp_affinity... Landlock's read-only rule on /proc stops that; a rung without Landlock
#: had nothing else. An entry this kernel lacks is skipped by the child (nothing to fence);
#: any other failure is the "proc-fence" step's.
PROC_FENCES: tuple[tuple[bytes, bool], ...] = (
    *((p, False) for p in (b"/proc/sys", b"/proc/sysrq-trigger", b"/proc/irq", b"/proc/bus",
                           b"/proc/fs")),
    *((p, True) for p in (b"/proc/acpi", b"/proc/asound", b"/proc/interrupts", b"/proc/kcore",
                          b"/proc/keys", b"/proc/latency_stats", b"/proc/timer_list",
                          b"/proc/timer_stats", b"/proc/sched_debug", b"/proc/scsi")),
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


def search_path(prefixes: Sequence[str]) -> str:
    """The sandbox's PATH: each granted install prefix's bin, then the system roots' bin dirs."""
    path_dirs = [os.path.join(p, "bin") for p in prefixes if os.path.isdir(os.path.join(p, "bin"))]
    return ":".join(path_dirs + list(SANDBOX_PATH))


def covered(prefix: str, policy: Policy) -> bool:
    """True when one of the policy's roots holds ``prefix`` already (no grant of its own)."""
    roots = policy.writable_roots + policy.readable_roots + tuple(
        os.path.realpath(p) for p in policy.system_roots if os.path.exists(p))
    return any(_is_within(prefix, r) for r in roots)


class Confinement:
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
        # the view's paths whose mount the host can take away by replacing the file (their
        # mount point is the host's own name): the init ends the run when one loses it
        self.watch: tuple[bytes, ...] = ()
        self.late_rules: tuple[tuple[bytes, int], ...] = ()
        self.canary: str | None = None
        self.ruleset: GrantedRuleset | None = None  # a template, never created: copied
        self.absent: tuple[str, ...] = ()
        self.search_path = ""
        self.watched: tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]] = ((), (), ())
        self.stamp: tuple | None = None  # None: made while its paths changed; not reused
        self.memo: dict = {}  # Plan.derived

    def current(self) -> bool:
        """True while every path it was made from is as it was."""
        return _stamp(self.watched) == self.stamp


_CONFINEMENTS_MAX = 16
_confinements: dict[tuple, Confinement] = {}  # insertion order: least recently made first
_confinements_lock = threading.Lock()
#: How old a watched directory's mtime must be before a confinement made from it is kept: a
#: change within the same tick of the file system's coarse clock could keep the same mtime.
_RACY_NS = 50_000_000
#: Where this process's confinements came from (tests, bench): reused, made, made but not kept.
cache_stats = {"reused": 0, "made": 0, "not_kept": 0}


def shared_confinement(policy: Policy, candidates: tuple[str, ...], layers: frozenset[str],
                       terminals: tuple[str, ...], found: Found = Found()) -> Confinement:
    """The confinement for this policy, layers, terminals and install prefixes, and the
    protected paths found for this run (hcp_linux.policy.protected: what exists changes between
    runs), reused while current."""
    # the jail is in one of the two root lists (readable_roots when read-only): the key
    # tells a read-only jail from a writable one
    key = (policy.system_roots, policy.readable_roots, policy.writable_roots, policy.network,
           layers, terminals, candidates, policy.read_only_paths, policy.hidden_paths,
           policy.unix_socket_binds, policy.pty, found.read_only, found.pins)
    with _confinements_lock:
        conf = _confinements.get(key)
    if conf is not None:
        if conf.current():
            cache_stats["reused"] += 1
            return conf
        with _confinements_lock:
            if _confinements.get(key) is conf:  # stale: forget it
                del _confinements[key]
    conf = _make_confinement(policy, candidates, layers, terminals, found)
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
                      terminals: Sequence[str], found: Found) -> Confinement:
    conf = Confinement()
    prefixes = [p for p in candidates if not covered(p, policy)]
    view = "mountns" in layers
    bins = [os.path.join(p, "bin") for p in prefixes]
    grant_paths = (*policy.readable_roots, *prefixes, *policy.writable_roots, *DEVICES,
                   *terminals, "/proc", *policy.read_only_paths, *policy.hidden_paths,
                   *pinned_ancestors(policy), *found.read_only, *found.pins,
                   *(p for pair in policy.unix_socket_binds for p in pair))
    conf.watched = (tuple(dict.fromkeys((*grant_paths, *bins))), tuple(policy.system_roots),
                    _MASK_DIRS if view else ())
    before = _stamp(conf.watched)  # before looking: a change while we look shows as a miss
    conf.search_path = search_path(prefixes)
    _plan_view_and_rules(conf, policy, prefixes, layers, terminals, found)
    after = _stamp(conf.watched)
    listings = after[len(after) - len(conf.watched[2]):]
    racy = time.time_ns() - _RACY_NS
    if after == before and not any(st is not None and st[2] > racy for st in listings):
        conf.stamp = after
    return conf


def _plan_view_and_rules(conf: Confinement, policy: Policy, prefixes: list[str],
                         layers: frozenset[str], terminals: Sequence[str],
                         found: Found) -> None:
    """Fill ``conf``: the view's binds, symlinks and masks, and the Landlock ruleset that
    grants the same paths, each path's identity checked once (:func:`_open_grants`)."""
    view = "mountns" in layers
    full = int(landlock.AccessFs.from_abi(POLICY_ABI))
    grants, absent, symlinks, targets = _grants(policy, prefixes, layers, terminals, found,
                                                full)
    template = landlock_ruleset(policy, layers) if "landlock" in layers else None
    # Granted unix sockets: those outside every root get a bind of their inode (and a rule);
    # those inside a root are in the view already and need only the rule, by path in the
    # view. A rule only where Landlock handles RESOLVE_UNIX (ABI 9): before it, connect() is
    # not mediated and the view alone decides which sockets exist.
    resolve = int(_FS.RESOLVE_UNIX & template.handled_fs) if template is not None else 0
    socket_binds = [(t, s) for t, s in policy.unix_socket_binds if not covered(t, policy)]
    socket_rules = [t for t, _ in policy.unix_socket_binds if covered(t, policy)] \
        if resolve else []
    if resolve:
        for _, source in socket_binds if not view else ():
            grants.append((source, resolve, 0, False))  # no view: a rule on the host path
    opened, rules = _open_grants(policy, grants, template)
    # Each bind carries its Landlock rule: the native executor adds it on the very mount it
    # cloned (and checked), so that a spare can be Landlocked before the plan comes.
    binds = [Bind(os.fsencode(path), os.fsencode(targets.get(path, path)),
                  stat.S_ISDIR(st.st_mode), st.st_dev,
                  st.st_ino, attrs, writable, int(rules.get(fd, 0)))
             for path, _, fd, st, attrs, writable in opened] if view else []
    sockets = _socket_grants(socket_binds, resolve) if view else []
    binds += sockets
    binds.sort(key=lambda b: (b.target.count(b"/"), b.target))
    conf.binds, conf.symlinks, conf.absent = tuple(binds), tuple(symlinks), tuple(absent)
    if view:
        conf.masks = merged_masks(_masks(policy, [p for p, _, _, _, _, w in opened if not w])
                                  + _hidden(policy))
        conf.watch = _watch(policy, conf.masks)
    if template is None:
        return
    if view:
        conf.late_rules = ((b"/", int(_FS.READ_DIR)), (b"/proc", int(_PROC_ACCESS)),
                           (b"/tmp", full), (b"/dev/shm", full))
        if policy.pty:  # the private devpts instance (child.py _mount_devpts)
            conf.late_rules += ((b"/dev/pts", int(_DEV_ACCESS | _FS.IOCTL_DEV
                                                  | _FS.READ_DIR)),)
        conf.canary = CANARY
    else:
        conf.late_rules = ((b"/proc", int(_PROC_ACCESS)),)
        conf.canary = "/"  # no rule grants the host root itself
    # sockets inside a granted root: a rule by their path (in the view, or on the host)
    conf.late_rules += tuple((os.fsencode(t), resolve) for t in socket_rules)
    # bound sockets: the ctypes executor rules them by host path (hcp-exec by its clone)
    bound = {b.source: b for b in sockets} if resolve else {}
    conf.ruleset = template.granting(tuple(
        (path, st.st_dev, st.st_ino, int(access)) for path, access, _, st, _, _ in opened)
        + tuple((b.source.decode(), b.dev, b.ino, resolve) for b in bound.values()))


#: One granted path: (path, Landlock access, mount attributes, writable).
_Grant = tuple[str, int, int, bool]


def _grants(policy: Policy, prefixes: list[str], layers: frozenset[str],
            terminals: Sequence[str], found: Found, full: int
            ) -> tuple[list[_Grant], list[str], list[tuple[bytes, bytes]], dict[str, str]]:
    """Every path the run is granted, in mount order by kind: system roots (their symlinks
    recreated, the missing ones listed absent), read-only roots, writable roots, devices,
    the terminal, carve-outs and protected names with the directories that pin them, the
    resolver's resolv.conf; and the binds whose target is not their source."""
    view = "mountns" in layers
    proc_fresh = "pidns" in layers
    ro_attrs = L.MOUNT_ATTR_RDONLY | L.MOUNT_ATTR_NOSUID | L.MOUNT_ATTR_NODEV
    rw_attrs = L.MOUNT_ATTR_NOSUID | L.MOUNT_ATTR_NODEV
    grants, absent, symlinks = _system_roots(policy, ro_attrs)
    for root in policy.readable_roots + tuple(prefixes):  # a read-only jail among them
        grants.append((root, _RO_ACCESS, ro_attrs, False))
    # Ask for every right this binding knows (full); the ruleset masks what the kernel lacks.
    for root in policy.writable_roots:
        grants.append((root, full, rw_attrs, True))
    for dev in DEVICES:
        if os.path.exists(dev):
            grants.append((dev, _DEV_ACCESS, L.MOUNT_ATTR_NOSUID, True))
    for tty in dict.fromkeys(terminals):
        # Only the terminal the command was given, so ttyname() works; never all of
        # /dev/pts, which holds the user's other terminals.
        grants.append((tty, _DEV_ACCESS | _FS.IOCTL_DEV, L.MOUNT_ATTR_NOSUID, True))
    if view:
        # carve-outs: a read-only bind of the path over itself, attached after its root
        # (binds go by depth); none where the path is read-only already
        # and the protected names that exist (hcp_linux.policy.protected), the same way
        carved = list(dict.fromkeys(carved_read_only(policy) + list(found.read_only)))
        for path in carved:
            grants.append((path, _RO_ACCESS, ro_attrs, False))
        # and each writable directory between a carve-out (or a protected name) and its root
        # bound over itself: a mount point cannot be renamed (EBUSY), so no parent moves a
        # carve-out away
        for path in dict.fromkeys(pinned_ancestors(policy) + list(found.pins)):
            # none inside a read-only bind: nothing there can be renamed (EROFS), and a
            # read-write bind attached after it (binds go by depth) would make that subtree
            # writable again (a protected name inside a protected directory)
            if not any(_is_within(path, c) for c in carved):
                grants.append((path, full, rw_attrs, True))
    targets: dict[str, str] = {}  # a bind whose target is not its source
    if view and policy.network == "allow":
        # the view's /etc/resolv.conf names the sandbox's resolver (transparent egress)
        targets[RESOLV_CONF] = "/etc/resolv.conf"
        grants.append((RESOLV_CONF, int(_FS.READ_FILE), ro_attrs, False))
    if view and not proc_fresh:
        grants.append(("/proc", _PROC_ACCESS,
                       L.MOUNT_ATTR_NOSUID | L.MOUNT_ATTR_NODEV | L.MOUNT_ATTR_NOEXEC, False))
    return grants, absent, symlinks, targets


def _system_roots(policy: Policy, ro_attrs: int
                  ) -> tuple[list[_Grant], list[str], list[tuple[bytes, bytes]]]:
    """The system roots' grants (read-only), the ones absent here, and the symlinks among
    them recreated in the view (usr-merged systems: /bin -> usr/bin)."""
    grants: list[_Grant] = []
    absent: list[str] = []
    symlinks: list[tuple[bytes, bytes]] = []
    for root in policy.system_roots:
        if os.path.islink(root):
            # Recreate the link when its target is granted.
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
    return grants, absent, symlinks


def _open_grants(policy: Policy, grants: list[_Grant], template: GrantedRuleset | None
                 ) -> tuple[list[tuple[str, int, int, os.stat_result, int, bool]],
                            dict[int, landlock.AccessFs]]:
    """Each path opened once, for its identity and (in a scratch copy of the ruleset, which
    masks and strips as create() will) its effective rule, then closed: the confinement
    keeps identities only. A plan's ruleset opens them again when it is made, and checks.
    The policy's own paths are canonical: a symlink on one now was put there since the
    policy was resolved (by a command, in a writable root): refused, never followed.
    Returns (path, access, fd number as it was, stat, attrs, writable) per grant, and the
    effective rule by that fd number."""
    pinned = set(policy.readable_roots + policy.writable_roots + policy.read_only_paths
                 + policy.hidden_paths) | set(pinned_ancestors(policy))
    opened = []
    fds: list[int] = []
    try:
        scratch = template.copy() if template is not None else None
        for path, access, attrs, writable in grants:
            fd = _open_grant(path, path in pinned)
            fds.append(fd)
            st = os.fstat(fd)
            opened.append((path, access, fd, st, attrs, writable))
            if scratch is not None:
                scratch.add_path(fd, landlock.AccessFs(access))
        rules = dict(scratch.path_rules()) if scratch is not None else {}
    finally:
        for fd in fds:
            os.close(fd)
    return opened, rules


def _open_grant(path: str, pinned: bool) -> int:
    """An ``O_PATH`` fd of a granted path; for a path of the policy (``pinned``), opened with
    no symlink followed anywhere on it (openat2 RESOLVE_NO_SYMLINKS), so that a link a
    command left where a granted directory was cannot redirect the grant (DESIGN.md §3)."""
    if not pinned:
        return os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        try:
            return L.openat2(L.AT_FDCWD, os.fsencode(path), os.O_PATH | os.O_CLOEXEC,
                             L.RESOLVE_NO_SYMLINKS | L.RESOLVE_NO_MAGICLINKS)
        except OSError as e:
            if e.errno not in (errno.ENOSYS, errno.EPERM):
                raise
            # openat2 filtered (older container seccomp profiles): the same walk by hand,
            # one component at a time, none followed
            return _open_no_symlinks(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise PolicyError(f"{printable(path)}: a symlink stands on this granted path since "
                              f"the policy was made (a command can put one there); it is not "
                              f"followed: restore the directory, or make the policy again") \
                from None
        raise


def _open_no_symlinks(path: str) -> int:
    """``path`` opened ``O_PATH`` component by component from /, each with O_NOFOLLOW; a
    symlink anywhere is ELOOP, as openat2's RESOLVE_NO_SYMLINKS says it."""
    fd = os.open("/", os.O_PATH | os.O_CLOEXEC)
    try:
        for name in [c for c in path.split("/") if c]:
            nfd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nfd
            if stat.S_ISLNK(os.fstat(fd).st_mode):
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _socket_grants(pairs: Sequence[tuple[str, str]], resolve: int) -> list[Bind]:
    """A bind of each granted socket's inode at its path in the view: read-only, no exec;
    connect() needs no write access to the mount (only to the socket's mode)."""
    out = []
    for target, source in pairs:
        try:
            st = os.stat(source)  # resolved and checked by Policy; its server may be gone
        except OSError as e:
            raise PolicyError(f"allow_unix_sockets: {printable(source)}: {e.strerror} (its "
                              f"server stopped since the policy was made?)") from None
        if not stat.S_ISSOCK(st.st_mode):
            raise PolicyError(f"allow_unix_sockets: {printable(source)} is no longer a unix "
                              f"socket")
        out.append(Bind(os.fsencode(source), os.fsencode(target), False, st.st_dev, st.st_ino,
                        L.MOUNT_ATTR_RDONLY | L.MOUNT_ATTR_NOSUID | L.MOUNT_ATTR_NODEV
                        | L.MOUNT_ATTR_NOEXEC, False, resolve))
    return out


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


def merged_masks(masks: Sequence[tuple[bytes, bool]]) -> tuple[tuple[bytes, bool], ...]:
    """Each mask once, and none inside a masked directory: a hidden path may name a secret
    of MASKED_PATHS (/etc/shadow) or lie inside one (/etc/ssl/private/x.key), and an empty
    masked directory has nothing to mount on."""
    dirs = [p for p, is_dir in masks if is_dir]
    out: dict[bytes, bool] = {}
    for path, is_dir in masks:
        if any(d != path and path.startswith(d.rstrip(b"/") + b"/") for d in dirs):
            continue
        out.setdefault(path, is_dir)
    return tuple(out.items())


def _deepest(path: str, trees: Sequence[tuple[str, bool]]) -> bool | None:
    """The flag of the deepest tree strictly holding or equal to ``path`` (None: none)."""
    best: tuple[str, bool] | None = None
    for tree, flag in trees:
        if tree != path and _is_within(path, tree) and (best is None or len(tree) > len(best[0])):
            best = (tree, flag)
    return None if best is None else best[1]


def _watch(policy: Policy, masks: tuple[tuple[bytes, bool], ...]) -> tuple[bytes, ...]:
    """What the init watches (hcp_exec.c, child.py: ``watch``): every mask (a hidden path, a
    secret under a read-only root) and every read-only carve-out. Each is mounted over the
    host's own name, and the kernel takes such a mount away in every other namespace when a
    host process unlinks or renames over that name (an editor's save, `passwd` rewriting
    /etc/shadow): the command would then read, or write, what took its place. Protected
    names are not watched: the sweep moves aside what replaced them, and the user's own `git
    config` during a run must not end it."""
    return tuple(dict.fromkeys([path for path, _ in masks]
                               + [os.fsencode(p) for p in carved_read_only(policy)]))


def carved_read_only(policy: Policy) -> list[str]:
    """The ``read_only_paths`` that need a read-only bind: those whose nearest enclosing
    tree (a root or another read-only path) is writable; none inside a hidden path."""
    trees = [(r, True) for r in policy.writable_roots] \
        + [(r, False) for r in policy.readable_roots] \
        + [(p, False) for p in policy.read_only_paths]
    return [p for p in policy.read_only_paths
            if _deepest(p, trees) and not _deepest(p, [(h, True) for h in policy.hidden_paths])]


def pinned_ancestors(policy: Policy) -> list[str]:
    """The writable directories strictly between each carve-out (bound or masked) and the
    root holding it: pinned in the view as mount points of their own, so that renaming one
    cannot carry a carve-out out of the path the policy names (the next run would protect
    whatever was put there instead)."""
    trees = [(r, True) for r in policy.writable_roots] \
        + [(r, False) for r in policy.readable_roots] \
        + [(p, False) for p in policy.read_only_paths]
    roots = set(policy.writable_roots + policy.readable_roots)
    carved = carved_read_only(policy) + [os.fsdecode(p) for p, _ in _hidden(policy)]
    out: set[str] = set()
    for path in carved:
        parent = os.path.dirname(path)
        while parent not in roots and parent != "/" and parent not in out:
            if not _deepest(parent, trees) or parent in policy.read_only_paths \
                    or parent in policy.hidden_paths:
                break  # read-only already (cannot be renamed), or a carve-out (a mount)
            out.add(parent)
            parent = os.path.dirname(parent)
    return sorted(out)


def _hidden(policy: Policy) -> list[tuple[bytes, bool]]:
    """Each hidden path covered by an empty node of its kind; one inside another hidden
    directory is covered already (and could not be mounted on: the mask is empty)."""
    out = []
    for path in sorted(policy.hidden_paths):
        if not _deepest(path, [(h, True) for h in policy.hidden_paths]):
            out.append((os.fsencode(path), os.path.isdir(path)))
    return out
