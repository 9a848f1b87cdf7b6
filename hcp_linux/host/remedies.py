"""The change that brings a missing layer back, for the environment hcp-linux runs in.

A bare host is told its kernel switch; a container is never told a host sysctl it cannot set:
it is told the seccomp profile shipped with the package (hcp_linux/share/seccomp) and how its
runtime takes it; Ubuntu is told the exact command installing the shipped AppArmor profile
(hcp_linux/share/apparmor) instead of the global sysctl; gVisor and WSL2 are told what their
kernel lacks. Every refusal of a layer (sandbox, plan, rulesets) and ``probe`` ask here.
"""
from __future__ import annotations

import os

from . import hostenv

SHARE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "share")
#: Docker's default seccomp profile plus exactly the calls hcp-linux's executors need.
SECCOMP_PROFILE = os.path.join(SHARE, "seccomp", "hcp-linux.json")
#: The AppArmor profile giving hcp-exec the `userns` rule (Ubuntu 23.10+).
APPARMOR_PROFILE = os.path.join(SHARE, "apparmor", "hcp-exec")

#: What each layer needs on a bare host with nothing in the way.
REMEDIES = {
    "userns": "enable unprivileged user namespaces (sysctl user.max_user_namespaces>0, "
              "kernel.unprivileged_userns_clone=1)",
    "mountns": "allow mount namespaces (they need a user namespace, or root)",
    "netns": "allow network namespaces (they need a user namespace, or root)",
    "ipcns": "allow IPC namespaces (they need a user namespace, or root)",
    "pidns": "allow pid namespaces (they need a user namespace, or root)",
    "landlock": "boot a kernel >= 6.2 with Landlock enabled (CONFIG_SECURITY_LANDLOCK=y and "
                "'landlock' in the lsm= boot parameter)",
    "seccomp": "use a kernel with CONFIG_SECCOMP_FILTER=y that lets this process add filters",
}

NAMESPACE_LAYERS = frozenset({"userns", "mountns", "netns", "ipcns", "pidns"})

#: The calls hcp-linux makes that a container runtime's default profile refuses.
NEEDED_CALLS = "the user namespace and the mount view hcp-linux makes (unshare with the " \
               "five namespace flags, mount, umount2, pivot_root, open_tree, move_mount, " \
               "mount_setattr)"


def apparmor_install_command(exec_dir: str | None) -> str:
    """The exact command installing the shipped AppArmor profile for the native executor's
    builds in ``exec_dir`` (hcp_linux.native.BUILD_DIR; the caller, above the executors,
    knows it). Without it: where to get the command."""
    if exec_dir is None:
        return "`hcp-linux probe` prints the exact command installing it"
    return (f"sed 's#HCP_EXEC_DIR#{exec_dir}#' {APPARMOR_PROFILE} | sudo install -m644 "
            f"/dev/stdin /etc/apparmor.d/hcp-exec && sudo apparmor_parser -r "
            f"/etc/apparmor.d/hcp-exec")


def _container(where: hostenv.Where) -> str:
    profile = SECCOMP_PROFILE
    if "kubernetes" in where.kinds:
        return (f"the pod's seccomp profile refuses {NEEDED_CALLS}: copy {profile} to each "
                f"node as /var/lib/kubelet/seccomp/profiles/hcp-linux.json and give the "
                f"container securityContext.seccompProfile {{type: Localhost, "
                f"localhostProfile: profiles/hcp-linux.json}} (no privileged pod, no added "
                f"capability; docs/deploying.md)")
    runtime = "podman" if "podman" in where.kinds else \
        "docker" if "docker" in where.kinds else "nerdctl"
    return (f"the container's seccomp profile refuses {NEEDED_CALLS}: start it with "
            f"`{runtime} run --security-opt seccomp={profile} ...` (on an AppArmor host also "
            f"a profile allowing mount: docs/deploying.md); no --privileged")


def remedy(layer: str, where: hostenv.Where | None = None, exec_dir: str | None = None) -> str:
    """The change that would put ``layer`` in force here (``where``: detected when None;
    ``exec_dir``: the native executor's build directory, for the AppArmor command)."""
    if where is None:
        where = hostenv.detect()
    if layer in NAMESPACE_LAYERS:
        if hostenv.NO_USERNS_SYSCTL in where.evidence:
            # the kernel's own switch, whatever else is in the way: say it first
            text = ("user.max_user_namespaces is 0: this kernel makes no user namespace for "
                    "anyone; on the host, `sysctl -w user.max_user_namespaces=15000` (and a "
                    "file in /etc/sysctl.d/ to keep it)")
            if where.in_container:
                text += " (a container shares the host's kernel: whoever runs the host sets it)"
            if where.cap_sys_admin and layer == "userns":
                text += "; or opt into --rung no-userns (this process holds CAP_SYS_ADMIN)"
            return text if layer == "userns" else f"it needs a user namespace (or root); {text}"
        if where.in_container:
            text = _container(where)
            if where.cap_sys_admin and layer == "userns":
                text += "; or opt into --rung no-userns (this process holds CAP_SYS_ADMIN)"
            return text
        if "ubuntu-apparmor" in where.kinds:
            text = ("Ubuntu's AppArmor restricts unprivileged user namespaces: install the "
                    "profile shipped for hcp-exec (native executor only): "
                    + apparmor_install_command(exec_dir))
            return text if layer == "userns" else \
                f"it needs a user namespace (or root); {text}"
        if where.seccomp_filtered:
            return (f"a seccomp filter on this process (Seccomp: 2) refuses it: whoever "
                    f"starts hcp-linux (systemd SystemCallFilter=, a CI runner, a container "
                    f"runtime) must allow {NEEDED_CALLS}, as {SECCOMP_PROFILE} does")
        if "gvisor" in where.kinds:
            return "gVisor refuses it: " + REMEDIES[layer]
        return REMEDIES[layer]
    if layer == "landlock":
        if "gvisor" in where.kinds:
            return ("gVisor implements no Landlock: opt into --rung no-landlock (the "
                    "namespaces and gVisor's own kernel remain), or run the container with "
                    "runc instead of runsc, with " + SECCOMP_PROFILE)
        if "wsl2" in where.kinds:
            return (f"WSL2 kernel {where.kernel}: `wsl --update` to a kernel >= 6.2, and add "
                    f"landlock to its LSMs in %UserProfile%\\.wslconfig ([wsl2] "
                    f"kernelCommandLine = lsm=landlock,lockdown,yama,integrity,apparmor), "
                    f"then `wsl --shutdown`")
        if where.seccomp_filtered:
            return ("a seccomp filter on this process (Seccomp: 2) may refuse landlock_*: "
                    f"allow them (as {SECCOMP_PROFILE} does); else " + REMEDIES[layer])
    return REMEDIES[layer]
