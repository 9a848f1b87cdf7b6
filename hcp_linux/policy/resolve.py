"""A policy checked against this host: the facts a Policy's values depend on, gathered once.

A :class:`~.policy.Policy` is a pure value: its paths as written. Before a plan is compiled
from it, :func:`resolve` asks the host what they mean, in one pass and in a fixed order (so
that the plainer error is the one reported): the jail (the current directory when none is
given) and every root exist and are made canonical; no read-only root lies inside a writable
one; no path of the policy passes through a symlink inside a writable root (a command could
re-point it between runs); no root is or holds a kernel file system (the mount table, read
once); carve-outs exist inside a granted root, patterns expanded (:mod:`.globs`); granted
sockets are sockets (:mod:`.unix_sockets`); cgroup limits are refused; the proxy log's
directory exists. The result is a new Policy with ``resolved`` true; the given one is left as
it was. ``Sandbox(policy)`` resolves once, so a Sandbox keeps the meaning its paths had then.
"""
from __future__ import annotations

import os
import stat
from typing import Any, Callable

from . import globs, unix_sockets, values
from ..errors import PolicyError, printable
from .limits import cgroup_v2_status
from .policy import CarveOuts, Policy, _is_within, _items

__all__ = ["resolve"]

_Set = Callable[[str, Any], None]


def resolve(policy: Policy) -> Policy:
    """``policy`` checked against this host, its paths canonical: a new Policy (or ``policy``
    itself when it is resolved already). Raises PolicyError naming the field and path, and
    the file the policy came from (``policy.source``) when there is one."""
    if policy.resolved:
        return policy
    out = object.__new__(Policy)
    for name in Policy.__dataclass_fields__:
        out.__dict__[name] = policy.__dict__[name]
    if policy.source is not None:
        out.__dict__["_source"] = policy.source
    try:
        _Resolution(out).run()
    except PolicyError as e:
        if policy.source is None:
            raise
        raise PolicyError(f"{policy.source}: {e}") from None
    out.__dict__["_resolved"] = True
    return out


class _Resolution:
    """The host checks of one policy, writing its canonical values into it (a new instance
    no one else holds yet)."""

    def __init__(self, policy: Policy) -> None:
        self.p = policy

    def set(self, name: str, value: Any) -> None:
        object.__setattr__(self.p, name, value)

    def run(self) -> None:
        p = self.p
        given_roots = self.roots()
        if p.limits.cgroup_requested():
            status = cgroup_v2_status()
            if not status.startswith("available") or "not yet applied" in status:
                keys = ", ".join(sorted(p.limits.cgroup_requested()))
                # refused on every host (docs/policy.md): the reason is this version, not
                # the host; what the host could do is in the receipt's limits.cgroup
                raise PolicyError(f"limits {keys}: not supported in this version (cgroup v2 "
                                  f"limits are parsed, not applied); remove them, and bound "
                                  f"the command with as, nproc, fsize, cpu or tmp_size")
        system = tuple(os.path.realpath(r) for r in p.system_roots)  # resolved once
        self.overlaps(system)
        for name, paths in given_roots.items():  # after the plainer overlap error
            for given in paths:
                self.pinned(name, given)
        mounts = values.mount_table()  # read once for every root and carve-out
        self.grantable(system, mounts)
        self.carve_outs(mounts)
        self.sockets()
        if p.proxy_log is not None:
            self.set("proxy_log", values.output_file(p.proxy_log, "proxy_log"))
            # the runtime appends to it while the command runs: never through a link the
            # command can re-point (at a host file the runtime's user owns)
            self.pinned("proxy_log", p.proxy_log)

    def roots(self) -> dict[str, tuple[str, ...]]:
        """Jail, write and read-only roots: existing directories, made canonical. System
        roots stay as written (a missing one is simply absent from the view, as documented).
        Returns each field's paths as written, for :meth:`pinned` once every writable root
        is known."""
        p = self.p
        if p.jail is None:
            try:
                jail = os.getcwd()
            except OSError as e:
                raise PolicyError(f"jail: not given, and the current directory cannot be "
                                  f"used ({e.strerror})") from None
        else:
            jail = p.jail
        real = values.existing_dir(jail, "jail")
        # the command's working directory: one the sandbox cannot enter fails its chdir step
        # after the setup (exit 125 naming no jail); say so now, naming it
        if not os.access(real, os.X_OK, effective_ids=True):
            raise PolicyError(f"jail: {printable(real)}: not searchable by uid {os.geteuid()}")
        self.set("jail", real)
        given: dict[str, tuple[str, ...]] = {"jail": (values.text_path(jail, "jail"),)}
        for name in ("write_roots", "read_only_roots"):
            given[name] = getattr(p, name)
            self.set(name, tuple(values.existing_dir(r, name) for r in given[name]))
        given["system_roots"] = p.system_roots
        return given

    def pinned(self, name: str, given: str) -> None:
        """Refuse ``given`` (a path of field ``name`` as written) when resolving it passes
        through a symlink inside one of this policy's writable roots. A command may replace
        such a link (or rename a directory on the path and leave a link in its place), and
        the next run, resolving the path again, would grant, mask or bind whatever the link
        names then: a host directory read-write, a decoy masked instead of the secret, another
        daemon's socket. Refused, not followed: what a path of the policy means must not be
        the sandboxed command's to choose (docs/policy.md, "Paths a command can change")."""
        found = values.unpinned_link(given, self.p.writable_roots)
        if found is not None:
            link, root = found
            what = "is a symlink" if link == given else \
                f"passes through the symlink {printable(link)}"
            raise PolicyError(f"{name}: {printable(given)} {what} inside writable root "
                              f"{printable(root)}, which a command can "
                              f"re-point between runs; name the file or directory itself, "
                              f"by a path with no symlink inside a writable root")

    def overlaps(self, system: tuple[str, ...]) -> None:
        # Landlock rules only add rights: a read-only root inside a writable one would be
        # writable after all. Refuse the combination instead of silently granting it. A
        # writable root inside a read-only one (or inside a read-only jail) is a carve-in:
        # allowed, it is what was asked (the deeper bind lies over the read-only one).
        p = self.p
        writable = p.writable_roots
        assert p.jail is not None
        jail = ((("read-only jail", p.jail),) if p.read_only_jail else ())
        for what, ro in jail + tuple(("read-only root", r)
                                     for r in p.read_only_roots + system):
            for rw in writable:
                if _is_within(ro, rw):
                    raise PolicyError(f"overlapping roots: {what} {printable(ro)} "
                                      f"is inside writable root {printable(rw)}")

    def grantable(self, system: tuple[str, ...], mounts: list[tuple[str, str]]) -> None:
        """No root is, holds or lies on a kernel pseudo file system (/proc, /sys, /dev, a
        sysfs or cgroupfs mounted anywhere...): granting one hands the command a kernel
        interface, writable as root. Checked last, so that a plainer error (a read-only root
        inside the jail, as with ``jail = "/"``) is the one reported."""
        p = self.p
        assert p.jail is not None  # roots() set it (the cwd when not given)
        roots = [("jail", p.jail)] + [("write_roots", r) for r in p.write_roots] \
            + [("read_only_roots", r) for r in p.read_only_roots]
        for real in system:
            if os.path.isdir(real):  # a missing one is absent from the view: nothing to grant
                roots.append(("system_roots", real))
        for what, real in roots:
            values.check_grantable(real, what, mounts)

    def carve_outs(self, mounts: list[tuple[str, str]]) -> None:
        """``read_only_paths`` and ``hidden_paths``: existing files or directories strictly
        inside a granted root (the jail, a write or read-only root; for ``hidden_paths`` a
        system root too), made canonical, or glob patterns expanded to such paths now
        (hcp_linux.policy.globs). A path that does not exist yet is refused: the view binds
        or masks an existing inode, and creating one would write into the user's tree
        (docs/policy.md, "Carve-outs"). A relative entry is relative to the jail."""
        p = self.p
        assert p.jail is not None
        roots = (p.jail,) + p.write_roots + p.read_only_roots
        # a secret inside a system root (/etc/docker/key.json) is masked like /etc/shadow
        system = tuple(r for r in dict.fromkeys(os.path.realpath(r) for r in p.system_roots)
                       if os.path.isdir(r))
        seen: dict[str, str] = {}
        for name in ("read_only_paths", "hidden_paths"):
            inside = roots + system if name == "hidden_paths" else roots
            written: CarveOuts = getattr(p, name)
            out: list[str] = []
            patterns: list[tuple[str, tuple[str, ...]]] = []
            for item in _items(written.given, name, "a list of paths or patterns"):
                given = self.carve_entry(item, name)
                if not globs.is_glob(given):
                    self.carve_out(name, given, inside, mounts, seen, out, None)
                    continue
                prefix, rest = globs.split(given)
                self.pinned(name, prefix)
                found = globs.expand(name, given, os.path.realpath(prefix), rest)
                matched: list[str] = []
                for path in found.matches:
                    real = self.carve_out(name, path, inside, mounts, seen, out, given)
                    matched.append(real)
                patterns.append((given, tuple(dict.fromkeys(matched))))
            self.set(name, CarveOuts.resolved(out, written.given, tuple(patterns)))
        if seen and p.native_local:
            raise PolicyError("read_only_paths/hidden_paths: carve-outs are enforced by the "
                              "sandbox's mount view; native-local has none")

    def carve_entry(self, item: Any, name: str) -> str:
        """One entry of a carve-out list as an absolute, normalised path or pattern: a
        relative one is taken from the jail."""
        assert self.p.jail is not None
        text = values.file_name(item, name)
        if text and not text.startswith("/"):
            text = os.path.join(self.p.jail, text)
        return values.text_path(text, name)

    def carve_out(self, name: str, given: str, roots: tuple[str, ...],
                  mounts: list[tuple[str, str]], seen: dict[str, str], out: list[str],
                  pattern: str | None) -> str:
        """Check one carve-out path (written, or matched by ``pattern``) and add its canonical
        path to ``out``; returns that path. A match is judged exactly as the same path
        written out would be (a symlink inside a writable root is refused)."""
        try:
            self.pinned(name, given)
            real, shown, st = values.resolved(
                given, name, "a carve-out must exist when the policy is made (create it "
                "first: it is never created for you)")
            if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
                raise PolicyError(f"{name}: {shown} is neither a file nor a directory")
            if real in roots:
                raise PolicyError(f"{name}: {shown} is a granted root itself; a carve-out "
                                  f"lies inside one (for a read-only jail: "
                                  f"--read-only-jail; else drop the root)")
            if not any(_is_within(real, r) for r in roots):
                where = "the jail, write_roots, read_only_roots" + (
                    ", system_roots" if name == "hidden_paths" else "")
                raise PolicyError(f"{name}: {shown} is not inside a granted root ({where})")
            values.check_grantable(real, name, mounts, given)
            if real in seen and seen[real] != name:
                raise PolicyError(f"{name}: {shown} is in {seen[real]} too; give it once")
        except PolicyError as e:
            if pattern is None:
                raise
            raise PolicyError(f"{e} (matched by pattern {printable(pattern)})") from None
        if real not in seen:  # the same path twice in one list: once
            seen[real] = name
            out.append(real)
        return real

    def sockets(self) -> None:
        """``allow_unix_sockets`` and ``allow_dangerous_sockets`` (hcp_linux.policy.unix_sockets):
        kept as written; the canonical socket of each, resolved once here, is what the plan
        binds (:attr:`Policy.unix_socket_binds`)."""
        p = self.p
        for name in ("allow_unix_sockets", "allow_dangerous_sockets"):
            for given in getattr(p, name):
                # a grant inside a writable root is the socket file at that path or nothing:
                # a link there could be re-pointed at another daemon's socket between runs
                self.pinned(name, given)
        granted, acknowledged, pairs = unix_sockets.validate(
            p.allow_unix_sockets, p.allow_dangerous_sockets, p.hidden_paths)
        self.set("allow_unix_sockets", granted)
        self.set("allow_dangerous_sockets", acknowledged)
        if pairs and p.native_local:
            raise PolicyError("allow_unix_sockets: sockets are granted through the sandbox's "
                              "mount view; native-local has none (every socket is reachable)")
        p.__dict__["_socket_binds"] = pairs
