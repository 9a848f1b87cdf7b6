"""Run a command the way it would run in a container, on Ubuntu, under gVisor...: under a real
seccomp filter installed first (tests/test_ladder.py).

    python ladder_launcher.py ENV -- ARGV...

ENV is one of:

docker      the container runtime default profile: the shipped OCI profile
            (hcp_linux/share/seccomp/hcp-linux.json) WITHOUT its "hcp-linux:" rules, which
            leaves Docker's default profile (moby profiles/seccomp/default.json), compiled for
            Docker's default capability set (no CAP_SYS_ADMIN): unshare, mount, umount2,
            pivot_root, setns, the new mount API refused with EPERM, clone with a namespace
            flag EPERM, clone3 ENOSYS. As root, CAP_SYS_ADMIN is dropped too, as in a container.
docker-hcp  the same container, started with the shipped profile (the hcp-linux rules kept).
userns-denied  AppArmor's userns restriction: unshare/clone with CLONE_NEWUSER -> EACCES.
no-landlock    a kernel without Landlock (gVisor, WSL2): landlock_* -> ENOSYS.
no-pidns       no pid namespace: unshare/clone with CLONE_NEWPID -> EPERM.

no_new_privs is set first (an unprivileged process may only add a filter under it).
"""
from __future__ import annotations

import ctypes
import json
import os
import platform
import sys

import pyseccomp

SHIPPED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       "hcp_linux", "share", "seccomp", "hcp-linux.json")
try:  # the installed package's own copy when tests run against site-packages
    import hcp_linux.host.remedies
    SHIPPED = hcp_linux.host.remedies.SECCOMP_PROFILE
except ImportError:
    pass

#: Docker's default capability set (moby oci/caps/defaults.go): no CAP_SYS_ADMIN.
DOCKER_CAPS = frozenset({"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER",
                         "CAP_MKNOD", "CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP",
                         "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL",
                         "CAP_AUDIT_WRITE"})
ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
OPS = {"SCMP_CMP_EQ": pyseccomp.EQ, "SCMP_CMP_NE": pyseccomp.NE,
       "SCMP_CMP_MASKED_EQ": pyseccomp.MASKED_EQ, "SCMP_CMP_GE": pyseccomp.GE,
       "SCMP_CMP_GT": pyseccomp.GT, "SCMP_CMP_LE": pyseccomp.LE, "SCMP_CMP_LT": pyseccomp.LT}
CLONE_NEWUSER, CLONE_NEWPID = 0x10000000, 0x20000000
CAP_SYS_ADMIN = 21


def _applies(rule: dict, caps: frozenset[str]) -> bool:
    """A rule's includes/excludes, as runc reads them (minKernel: this kernel is newer)."""
    inc, exc = rule.get("includes") or {}, rule.get("excludes") or {}
    if inc.get("caps") and not set(inc["caps"]) <= caps:
        return False
    if inc.get("arches") and ARCH not in inc["arches"]:
        return False
    if exc.get("caps") and set(exc["caps"]) & caps:
        return False
    if exc.get("arches") and ARCH in exc["arches"]:
        return False
    return True


def oci_filter(profile: dict, caps: frozenset[str], keep_hcp: bool) -> pyseccomp.SyscallFilter:
    """An OCI seccomp profile compiled for this arch and ``caps``."""
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO"
    default_errno = profile.get("defaultErrnoRet", 1)
    f = pyseccomp.SyscallFilter(pyseccomp.ERRNO(default_errno))
    for rule in profile["syscalls"]:
        if not keep_hcp and rule.get("comment", "").startswith("hcp-linux:"):
            continue
        if not _applies(rule, caps):
            continue
        if rule["action"] == "SCMP_ACT_ALLOW":
            action = pyseccomp.ALLOW
        else:
            assert rule["action"] == "SCMP_ACT_ERRNO", rule
            action = pyseccomp.ERRNO(rule.get("errnoRet", default_errno))
        args = [pyseccomp.Arg(a["index"], OPS[a["op"]], a["value"], a.get("valueTwo", 0))
                for a in rule.get("args") or ()]
        for name in rule["names"]:
            try:
                pyseccomp.resolve_syscall(pyseccomp.system_arch(), name)
            except (ValueError, RuntimeError):
                continue  # another arch's call
            try:
                f.add_rule(action, name, *args)
            except OSError as e:  # the syscall has no number here (a 32-bit-only name)
                if e.errno not in (22, 34):  # EINVAL, EDOM-like from libseccomp
                    raise
    return f


def flag_filter(rules: list[tuple[str, int, int]]) -> pyseccomp.SyscallFilter:
    """Default allow; each (syscall, flag, errno): the call with ``flag`` set in its flags
    argument (0 for every call) fails with errno."""
    f = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    for name, flag, err in rules:
        if flag:
            f.add_rule(pyseccomp.ERRNO(err), name, pyseccomp.Arg(0, pyseccomp.MASKED_EQ, flag, flag))
        else:
            f.add_rule(pyseccomp.ERRNO(err), name)
    return f


def _drop_sys_admin(libc: ctypes.CDLL) -> None:
    """As root: lose CAP_SYS_ADMIN (bounding, effective, permitted, inheritable), as a
    container's root does by default."""
    if libc.prctl(24, ctypes.c_ulong(CAP_SYS_ADMIN), 0, 0, 0) != 0:  # PR_CAPBSET_DROP
        raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    hdr, data = Header(0x20080522, 0), (Data * 2)()
    if libc.capget(ctypes.byref(hdr), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    for field in ("effective", "permitted", "inheritable"):
        setattr(data[0], field, getattr(data[0], field) & ~(1 << CAP_SYS_ADMIN))
    if libc.capset(ctypes.byref(hdr), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def main() -> None:
    env, sep, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
    assert sep == "--" and argv, "usage: ladder_launcher.py ENV -- ARGV..."
    libc = ctypes.CDLL(None, use_errno=True)
    if env in ("docker", "docker-hcp"):
        with open(SHIPPED) as fh:
            profile = json.load(fh)
        f = oci_filter(profile, DOCKER_CAPS, keep_hcp=env == "docker-hcp")
        if os.geteuid() == 0:
            _drop_sys_admin(libc)
    elif env == "userns-denied":
        f = flag_filter([("unshare", CLONE_NEWUSER, 13), ("clone", CLONE_NEWUSER, 13),
                         ("clone3", 0, 38)])
    elif env == "no-landlock":
        f = flag_filter([(n, 0, 38) for n in ("landlock_create_ruleset", "landlock_add_rule",
                                              "landlock_restrict_self")])
    elif env == "no-pidns":
        f = flag_filter([("unshare", CLONE_NEWPID, 1), ("clone", CLONE_NEWPID, 1),
                         ("clone3", 0, 38)])
    else:
        raise SystemExit(f"ladder_launcher: unknown environment {env!r}")
    if libc.prctl(38, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0),
                  ctypes.c_ulong(0)) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    f.load()
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main()
