"""Unix sockets granted by path (``allow_unix_sockets``), and the ones that need a second yes.

The mount view holds only granted trees, so a host daemon's socket (an ssh-agent, a language
server, a build cache) is absent unless granted. A granted socket's *inode* is bound into the
view at its real path (and at the path as written, when that went through a symlink, as
/var/run -> /run): exactly that socket becomes connectable, nothing else of its directory.
Where Landlock has ABI 9 the ruleset also handles RESOLVE_UNIX, so only granted sockets (and
those in writable roots, or made inside the sandbox) can be connected to by path at all.

Some sockets hand whoever connects the power to leave any sandbox: a container engine's API
(run a privileged container with the host's / mounted), the system D-Bus and systemd's
private socket (start a unit as root), the user's own D-Bus session or systemd manager (run
any command outside the sandbox, as the user). Those are refused unless the policy names
them again in ``allow_dangerous_sockets``; the receipt names them with the reason. The list
below is of well-known names, not a proof of safety: granting any socket gives the command
whatever its server grants.
"""
from __future__ import annotations

import fnmatch
import os
import stat

from ..errors import PolicyError, printable
from .values import is_within, resolved

__all__ = ["DANGEROUS", "danger", "validate"]

#: (glob on the whole path, what the socket is, what connecting to it gives).
DANGEROUS: tuple[tuple[str, str, str], ...] = (
    ("*/docker.sock", "the Docker Engine API", "root on the host (a container with / mounted)"),
    ("*/cri-dockerd.sock", "the Docker CRI shim", "root on the host (it runs containers)"),
    ("*/containerd.sock*", "containerd's API", "root on the host (it runs containers)"),
    ("*/podman.sock", "the Podman API", "its owner's power outside the sandbox (it runs "
     "containers)"),
    ("*/crio.sock", "the CRI-O API", "root on the host (it runs containers)"),
    ("*/buildkitd.sock", "the BuildKit daemon", "root on the host (privileged builds)"),
    ("*/lxd/unix.socket", "the LXD API", "root on the host (privileged containers)"),
    ("*/incus/unix.socket", "the Incus API", "root on the host (privileged containers)"),
    ("*/libvirt-sock", "libvirt's API", "root on the host (it starts VMs with host devices)"),
    ("*/virtqemud-sock", "libvirt's QEMU daemon", "root on the host"),
    ("*/snapd.socket", "snapd's API", "root on the host (it installs software)"),
    ("*/system_bus_socket", "the system D-Bus", "root-owned services that act on request "
     "(systemd starts units, polkit may allow more)"),
    ("/run/systemd/private", "systemd's private socket", "root on the host"),
    ("/run/user/*/bus", "the user's D-Bus session", "any command run outside the sandbox "
     "(systemd --user starts units on request)"),
    ("/run/user/*/systemd/private", "the user's systemd manager", "any command run outside "
     "the sandbox"),
)


def danger(path: str) -> str | None:
    """Why connecting to ``path`` (as written or as resolved) escapes the sandbox, or None
    when it is not one of the well-known dangerous sockets."""
    for pattern, what, power in DANGEROUS:
        if fnmatch.fnmatchcase(path, pattern):
            return f"{what}: connecting to it gives {power}"
    return None


def validate(granted: tuple[str, ...], acknowledged: tuple[str, ...], hidden: tuple[str, ...]
             ) -> tuple[tuple[str, ...], tuple[str, ...], tuple[tuple[str, str], ...]]:
    """Check ``allow_unix_sockets`` and ``allow_dangerous_sockets``: absolute paths of existing
    unix sockets, none inside a hidden path, each dangerous one acknowledged by being in the
    second list (which grants too). Both lists come absolute and normalised (Policy's path
    grammar); returned each path once, and the (path in the view, canonical socket) pairs to
    bind, the canonical path first: resolved here, once, so the plan binds exactly the inode
    that was checked."""
    lists = {"allow_unix_sockets": tuple(dict.fromkeys(granted)),
             "allow_dangerous_sockets": tuple(dict.fromkeys(acknowledged))}
    # acknowledged as written or as resolved (/var/run/docker.sock names /run/docker.sock)
    ok_dangerous = {q for p in lists["allow_dangerous_sockets"] for q in (p, os.path.realpath(p))}
    pairs: list[tuple[str, str]] = []
    for name, paths in lists.items():
        for given in paths:
            real, shown, st = resolved(given, name, "a socket is granted once its server "
                                       "listens (start it first)")
            if not stat.S_ISSOCK(st.st_mode):
                raise PolicyError(f"{name}: {shown} is not a unix socket")
            why = danger(given) or danger(real)
            if why and name == "allow_unix_sockets" and not {given, real} & ok_dangerous:
                raise PolicyError(
                    f"allow_unix_sockets: {shown} is {why}; to grant it anyway, name it with "
                    f"--allow-dangerous-socket (allow_dangerous_sockets)")
            for h in hidden:
                if is_within(real, h) or is_within(given, h):
                    raise PolicyError(f"{name}: {shown} is inside hidden path {printable(h)}")
            for target in dict.fromkeys((real, given)):
                if (target, real) not in pairs:
                    pairs.append((target, real))
    return lists["allow_unix_sockets"], lists["allow_dangerous_sockets"], tuple(pairs)
