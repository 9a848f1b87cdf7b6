"""Where hcp-linux runs: a container runtime, Kubernetes, Ubuntu's AppArmor userns
restriction, gVisor, WSL2 or a plain host, read from the marks each leaves.

Detection only chooses the advice (:mod:`hcp_linux.host.remedies`) and the words of ``probe``; it
never decides what is enforced: that is found by doing it (hcp_linux.probe, the sandbox's
attempts). So a wrong guess costs a wrong hint, never a layer.

File marks are read under a root, ``/`` unless :data:`MARKER_ROOT_ENV` names another one (a
test's fake root with a ``.dockerenv``): only file marks move there. What the kernel says of
this very process (``Seccomp:`` and ``CapEff:`` of /proc/self/status) is always the real one.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping

#: Names a directory whose files stand in for the root's marker files (docs/deploying.md).
MARKER_ROOT_ENV = "HCP_LINUX_MARKER_ROOT"

CAP_SYS_ADMIN = 21

#: The environments, in the order a report names them (the first found is `kind`).
KINDS = ("kubernetes", "podman", "docker", "containerd", "gvisor", "wsl2", "ubuntu-apparmor",
         "seccomp-filtered", "host")
CONTAINERS = frozenset({"kubernetes", "podman", "docker", "containerd"})
#: The evidence key saying the kernel allows no user namespace at all (the sysctl is 0).
NO_USERNS_SYSCTL = "max_user_namespaces=0"


@dataclass(frozen=True)
class Where:
    """What was found: every environment whose marks are present (strongest claim first),
    the evidence for each, and the two kernel facts of this process the advice turns on."""

    kinds: tuple[str, ...]
    evidence: Mapping[str, str] = field(default_factory=dict)
    seccomp_filtered: bool = False
    cap_sys_admin: bool = False
    kernel: str = ""

    @property
    def kind(self) -> str:
        return self.kinds[0]

    @property
    def in_container(self) -> bool:
        return any(k in CONTAINERS for k in self.kinds)

    def as_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "kinds": list(self.kinds), "evidence": dict(self.evidence),
                "seccomp_filtered": self.seccomp_filtered, "cap_sys_admin": self.cap_sys_admin,
                "kernel": self.kernel}


def _read(path: str, limit: int = 65536) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("utf-8", "replace").strip()
    except OSError:
        return None


def _status_fields() -> dict[str, str]:
    out = {}
    for line in (_read("/proc/self/status") or "").splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key] = value.strip()
    return out


def detect(root: str | None = None, environ: Mapping[str, str] | None = None) -> Where:
    """The environments whose marks are under ``root`` (default: $HCP_LINUX_MARKER_ROOT, else
    /) and in ``environ`` (default: os.environ)."""
    env = os.environ if environ is None else environ
    if root is None:
        root = env.get(MARKER_ROOT_ENV) or "/"
    at = lambda path: os.path.join(root, path.lstrip("/"))  # noqa: E731
    found: dict[str, str] = {}
    sa = "/var/run/secrets/kubernetes.io/serviceaccount"
    if os.path.isdir(at(sa)):
        found["kubernetes"] = f"{sa} is mounted"
    elif env.get("KUBERNETES_SERVICE_HOST"):
        found["kubernetes"] = "KUBERNETES_SERVICE_HOST is set"
    if os.path.exists(at("/run/.containerenv")):
        found["podman"] = "/run/.containerenv exists"
    if os.path.exists(at("/.dockerenv")):
        found["docker"] = "/.dockerenv exists"
    cgroup = _read(at("/proc/1/cgroup")) or ""
    mounts = _read(at("/proc/self/mountinfo"), 1 << 20) or ""
    for text, where in ((cgroup, "/proc/1/cgroup"), (mounts, "/proc/self/mountinfo")):
        if "docker" not in found and ("/docker/" in text or "docker-" in text):
            found["docker"] = f"{where} names docker"
        if "containerd" not in found and ("containerd" in text or "kubepods" in text):
            found["containerd"] = f"{where} names containerd/kubepods"
        if "podman" not in found and "libpod" in text:
            found["podman"] = f"{where} names libpod"
    release = _read(at("/proc/sys/kernel/osrelease")) or os.uname().release
    if release == "4.4.0":  # what gVisor's Sentry reports, whatever the host runs
        found["gvisor"] = "kernel release 4.4.0 (gVisor's)"
    low = release.lower()
    if "microsoft" in low or "wsl" in low:
        found["wsl2"] = f"kernel release {release}"
    if _read(at("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")) == "1":
        found["ubuntu-apparmor"] = "kernel.apparmor_restrict_unprivileged_userns = 1"
    if _read(at("/proc/sys/user/max_user_namespaces")) == "0":  # evidence, not a kind
        found[NO_USERNS_SYSCTL] = "user.max_user_namespaces = 0"
    status = _status_fields()
    filtered = status.get("Seccomp") == "2"
    if filtered:
        found["seccomp-filtered"] = "Seccomp: 2 in /proc/self/status (a filter is installed)"
    try:
        cap_admin = bool(int(status.get("CapEff", "0"), 16) >> CAP_SYS_ADMIN & 1)
    except ValueError:
        cap_admin = False
    kinds = tuple(k for k in KINDS if k in found) or ("host",)
    return Where(kinds, found, filtered, cap_admin, release)
