"""The change that brings a missing layer back, for the environment hcp-linux runs in.

A bare host is told its kernel switch; a container is told what its runtime refused, as
observed (the failing step, this process's seccomp filter and capabilities): the seccomp
profile shipped with the package (hcp_linux/share/seccomp), how to copy it out of the image
and how its runtime takes it; unmasking /proc, as a non-root user, where the masked /proc
refused the pid namespace's procfs; ``--user 1000`` or CAP_SETFCAP where container root could
not map uid 0; the host's sysctl only where user.max_user_namespaces is 0 (a container cannot
set it; the host's operator can). Ubuntu is told the exact command installing the shipped AppArmor profile
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


#: How to get the shipped seccomp profile out of an image onto the host that starts it.
PROFILE_OUT = "`{runtime} run --rm IMAGE hcp-linux profile seccomp > hcp-linux.json`"

#: What each runtime is told to unmask /proc with (the masked entries make the kernel refuse
#: a fresh procfs in a new user namespace: mount_too_revealing).
UNMASK = {"docker": "--security-opt systempaths=unconfined",
          "podman": "--security-opt unmask=/proc/*",
          "nerdctl": "--security-opt systempaths=unconfined"}

#: Why the advice says non-root whenever it unmasks /proc.
NON_ROOT_WHY = ("as a non-root user: with /proc unmasked, container root may write host kernel "
                "settings such as /proc/sys/kernel/core_pattern")

CAP_SETFCAP = 31


def _cap_setfcap() -> bool:
    """Whether this process holds CAP_SETFCAP (read from /proc/self/status)."""
    for line in (hostenv._read("/proc/self/status") or "").splitlines():
        if line.startswith("CapEff:"):
            try:
                return bool(int(line.split()[1], 16) >> CAP_SETFCAP & 1)
            except (IndexError, ValueError):
                return False
    return False


def _runtime(where: hostenv.Where) -> str:
    return "podman" if "podman" in where.kinds else \
        "docker" if "docker" in where.kinds else "nerdctl"


def _masked_proc(where: hostenv.Where) -> str:
    """The container's masked /proc refused the pid namespace's fresh procfs."""
    why = ("the container's masked /proc (/proc/kcore, /proc/keys... covered, /proc/sys "
           "read-only) makes the kernel refuse the fresh /proc of a pid namespace")
    if "kubernetes" in where.kinds:
        fix = ("give the container securityContext {procMount: Unmasked, runAsNonRoot: true, "
               "runAsUser: 1000} and the pod hostUsers: false (Unmasked needs a user "
               "namespace; docs/deploying.md)")
    else:
        runtime = _runtime(where)
        fix = f"start it with `{runtime} run {UNMASK[runtime]} --user 1000 ...`"
    return (f"{why}: {fix}, {NON_ROOT_WHY}; or opt into --rung no-pidns (the outer /proc, "
            f"fenced, and no pid namespace)")


def _container(where: hostenv.Where, reason: str | None) -> str:
    profile = SECCOMP_PROFILE
    step = (reason or "").partition(":")[0]
    if step == "proc":
        return _masked_proc(where)
    runtime = _runtime(where)
    if step == "uid-map" and os.geteuid() == 0 and not _cap_setfcap():
        return ("container root without CAP_SETFCAP may not map uid 0 into a user namespace "
                "(Linux >= 5.12): run the container as a non-root user (`--user 1000`; "
                "Kubernetes: runAsUser), or add the capability (`--cap-add SETFCAP`)")
    if hostenv._read("/proc/sys/user/max_user_namespaces") == "0":
        return ("user.max_user_namespaces is 0: set it on the host (`sysctl -w "
                "user.max_user_namespaces=15000`; a container cannot), or opt into "
                "--rung no-namespaces")
    if not where.seccomp_filtered:
        return (f"refused with no seccomp filter on this process ({reason or 'the kernel'}): "
                f"not the runtime's seccomp profile; the host's AppArmor or SELinux policy "
                f"for the container, or the capabilities it was given, refuse it "
                f"(docs/deploying.md, a recipe per runtime)")
    if "kubernetes" in where.kinds:
        return (f"the pod's seccomp profile refuses {NEEDED_CALLS}: copy {profile} "
                f"({PROFILE_OUT.format(runtime='docker')}) to each node as "
                f"/var/lib/kubelet/seccomp/profiles/hcp-linux.json and give the container "
                f"securityContext.seccompProfile {{type: Localhost, localhostProfile: "
                f"profiles/hcp-linux.json}}, procMount: Unmasked and runAsNonRoot, the pod "
                f"hostUsers: false (no privileged pod, no added capability; "
                f"docs/deploying.md)")
    unmask = UNMASK[runtime]
    return (f"the container's seccomp profile refuses {NEEDED_CALLS}: copy the profile "
            f"shipped in the image ({profile}) out with {PROFILE_OUT.format(runtime=runtime)}, "
            f"then start it with `{runtime} run --security-opt seccomp=hcp-linux.json {unmask} "
            f"--user 1000 ...` ({NON_ROOT_WHY}; on an AppArmor host also a profile allowing "
            f"mount: docs/deploying.md); no --privileged")


def _landlock_in_kernel() -> int | None:
    """The Landlock ABI this kernel reports, None when it has none (or it cannot be asked)."""
    try:
        import hcp_linux.landlock as landlock
        return landlock.abi_version()
    except Exception:  # noqa: BLE001 - refused (a seccomp filter), or no Landlock: unknown
        return None


def remedy(layer: str, where: hostenv.Where | None = None, exec_dir: str | None = None,
           reason: str | None = None, userns_reason: str | None = None) -> str:
    """The change that would put ``layer`` in force here (``where``: detected when None;
    ``exec_dir``: the native executor's build directory, for the AppArmor command;
    ``reason``: how the layer was refused, "step: strerror", when known). Computed from what
    is observed here, so that it never names a cause this host does not have: the failing
    step, this process's seccomp filter and capabilities, the kernel's Landlock ABI.
    ``userns_reason``: how the user namespace was refused, when it was: in a container
    without CAP_SYS_ADMIN the other namespaces follow from it, and so does their remedy."""
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
        if where.in_container and layer != "userns" and userns_reason \
                and not where.cap_sys_admin:
            return (f"it needs the user namespace (refused: {userns_reason}; this process "
                    f"lacks CAP_SYS_ADMIN): "
                    + remedy("userns", where, exec_dir, reason=userns_reason))
        if where.in_container:
            text = _container(where, reason)
            if where.cap_sys_admin and layer == "userns":
                text += "; or opt into --rung no-userns (this process holds CAP_SYS_ADMIN)"
            return text
        if (reason or "").startswith("proc:"):
            return ("a mount over an entry of /proc (as a container's masked /proc/keys...) "
                    "makes the kernel refuse the fresh /proc of a pid namespace: unmount it "
                    "where hcp-linux runs, or opt into --rung no-pidns (the outer /proc, "
                    "fenced, and no pid namespace)")
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
        abi = _landlock_in_kernel()
        if abi is not None and abi >= 1:  # the kernel has it: not a kernel to boot
            return (f"this kernel has Landlock (ABI {abi}); the refusal here "
                    f"({reason or 'unknown'}) is not the kernel's lack of it: a seccomp "
                    f"filter on this process must allow landlock_* (as {SECCOMP_PROFILE} "
                    f"does)" if where.seccomp_filtered else
                    f"this kernel has Landlock (ABI {abi}); the refusal here "
                    f"({reason or 'unknown'}) is not the kernel's lack of it")
        if where.seccomp_filtered:
            return ("a seccomp filter on this process (Seccomp: 2) may refuse landlock_*: "
                    f"allow them (as {SECCOMP_PROFILE} does); else " + REMEDIES[layer])
    if layer == "seccomp" and "Seccomp:" in (hostenv._read("/proc/self/status") or ""):
        return (f"this kernel has seccomp filters; this process may not add one here "
                f"({reason or 'unknown'}): whoever starts hcp-linux must let it call "
                f"seccomp(2) and prctl(PR_SET_NO_NEW_PRIVS)")
    return REMEDIES[layer]
