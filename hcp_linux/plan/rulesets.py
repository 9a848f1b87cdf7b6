"""The kernel rulesets a plan carries: its Landlock ruleset and its seccomp filter.

Which Landlock rights the policy handles is pinned to :data:`POLICY_ABI`; what a host must
offer for a layer to count as enforced is required here, and a host without it is refused with
the layer's remedy for the environment it runs in (:func:`hcp_linux.host.remedies.remedy`). The seccomp filter is compiled once per profile set.
"""
from __future__ import annotations

import errno
import os

import hcp_linux.landlock as landlock
import hcp_linux.seccomp_profiles as seccomp_profiles

from ..observe.denials import OBSERVED_PROFILE
from ..errors import ChildSetupError, LayerUnavailableError, PolicyError, SandboxError
from ..policy.policy import Policy
from ..host.remedies import REMEDIES, remedy

__all__ = ["POLICY_ABI", "REMEDIES", "Grant", "GrantedRuleset", "answered_by_filter",
           "denials_unavailable",
           "landlock_ruleset", "seccomp_filter", "set_denial_records"]

#: The Landlock ABI whose rights, network rights and scopes the policy handles. Pinned rather
#: than the binding's LATEST_ABI (the moving target rust-landlock warns against): when the
#: binding learns a newer ABI, what a command may do changes only when this is bumped, with
#: tests/test_landlock_policy_abi.py, which lists the handled rights by name, updated with it.
POLICY_ABI = 9

#: Landlock rights the default policy cannot do without: truncate (ABI 3) would otherwise be
#: unmediated. Scopes (ABI 6) are required only where no namespace covers for them.
_REQUIRED_FS = landlock.AccessFs.from_abi(3)




#: A path a Landlock rule is granted on: (path, st_dev, st_ino, requested access).
Grant = tuple[str, int, int, int]


class GrantedRuleset(landlock.Ruleset):
    """A plan's Landlock ruleset: the confinement's handled rights, and a rule on each of its
    grants, added only when the kernel ruleset is made (:meth:`create`, by the ctypes executor,
    or by hcp-exec's parent when there is no mount view). Each path is then opened
    (``O_PATH``), checked to be the very inode the plan (and the mount view) recorded, given
    its rule, and closed once the ruleset is made: nothing stays open between runs. A path
    that changed since it was checked refuses the run (step ``landlock-rules``, ESTALE)."""

    _grants: tuple[Grant, ...] = ()  # none in the template (landlock_ruleset)

    def granting(self, grants: tuple[Grant, ...]) -> "GrantedRuleset":
        """An uncreated copy of this template (no path rules of its own) that adds ``grants``
        at create()."""
        twin = self.copy()
        twin._grants = grants
        return twin

    def copy(self) -> "GrantedRuleset":
        """An uncreated twin with the same rights and grants (a plan's own, from the cache's)."""
        twin = super().copy()
        twin._grants = self._grants
        return twin

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


def landlock_ruleset(policy: Policy, layers: frozenset[str]) -> GrantedRuleset:
    """The rights ``policy`` handles (pinned to POLICY_ABI), with no path rule and no grant
    yet (a template: :meth:`GrantedRuleset.granting`); refuses a host whose Landlock lacks
    what these layers need it for."""
    pinned = POLICY_ABI
    try:
        abi = landlock.abi_version()
    except landlock.SyscallError as e:  # e.g. a seccomp filter on this process refuses it
        raise LayerUnavailableError("landlock", f"landlock_create_ruleset: {e.strerror}",
                                    remedy("landlock")) from None
    if abi == 0:
        raise LayerUnavailableError("landlock", "the kernel has no Landlock (ABI 0)",
                                    remedy("landlock"))
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
        return GrantedRuleset(handled_fs=landlock.AccessFs.from_abi(pinned),
                              handled_net=handled_net, scoped=landlock.Scope.from_abi(pinned),
                              required=tuple(required))
    except (landlock.UnsupportedError, landlock.IncompatibleError) as e:
        raise LayerUnavailableError("landlock", str(e), remedy("landlock")) from None


def seccomp_filter(policy: Policy, layers: frozenset[str]
                   ) -> tuple[seccomp_profiles.PreparedFilter, tuple[str, ...], str] | None:
    """The prepared filter of ``policy``'s profiles (plus network-off where no network
    namespace fences the network, network-observe where :func:`observes_connect`), the
    profiles' names, and "" when the filter hands its
    policy denials to a listener that records them (SECCOMP_RET_USER_NOTIF), else why not
    ("unavailable: ..."; the filter then answers them itself, as before). None without the
    seccomp layer."""
    if "seccomp" not in layers:
        return None
    names = tuple(policy.seccomp_profiles)
    if "netns" not in layers and policy.network == "none" and "network-off" not in names:
        names += ("network-off",)
    unrecorded = denials_unavailable()
    # the runtime's to add, where the listener knows the routes (named in a policy file
    # for a host network, it would record connects the host does route)
    names = tuple(n for n in names if n != OBSERVED_PROFILE)
    if observes_connect(policy, layers, unrecorded):
        names += (OBSERVED_PROFILE,)
    try:
        bpf = seccomp_profiles.compile_profiles(names, notify=not unrecorded)
    except seccomp_profiles.SeccompLibraryError as e:  # not the kernel's: fails closed
        raise SandboxError(f"seccomp: {e}") from None
    except seccomp_profiles.SeccompCompileError as e:
        # libseccomp asks the kernel what it supports while compiling: a host (or a filter on
        # this process) without seccomp fails here, before any child could try to install it.
        raise LayerUnavailableError("seccomp", f"compiling the filter failed: {e}",
                                    remedy("seccomp")) from None
    except seccomp_profiles.SeccompProfileError as e:
        raise PolicyError(f"seccomp: {e}") from None
    prepared = _prepared_filters.get(bpf)
    if prepared is None:  # read-only once made: plans (and threads) share it
        prepared = _prepared_filters[bpf] = seccomp_profiles.PreparedFilter(bpf)
    return prepared, names, unrecorded


def observes_connect(policy: Policy, layers: frozenset[str], unrecorded: str) -> bool:
    """Whether this run's filter hands connect() to the listener: only under network =
    "allow" in the sandbox's own network namespace (whose routes the listener knows: lo and
    the synthetic range) and with a listener. Every other policy's program is unchanged, so
    its connect() pays nothing."""
    return policy.network == "allow" and "netns" in layers and not unrecorded


def answered_by_filter(names: tuple[str, ...]) -> "seccomp_profiles.PreparedFilter":
    """The filter of ``names`` that answers its denials itself (RET_ERRNO), for a run no
    listener of ours can serve (a served plan: the client starts hcp-exec). Compiled
    already: seccomp_filter checked the same names."""
    bpf = seccomp_profiles.compile_profiles(names)
    prepared = _prepared_filters.get(bpf)
    if prepared is None:
        prepared = _prepared_filters[bpf] = seccomp_profiles.PreparedFilter(bpf)
    return prepared


_recording: bool | None = None
_unavailable = ""


def set_denial_records(on: bool) -> None:
    """Record seccomp denials (the default where the kernel can) or not: off, the filter
    answers them itself (RET_ERRNO) and the receipt says so. For hosts and tests that want
    today's filter byte for byte."""
    global _recording
    _recording = on


def denials_unavailable() -> str:
    """"" when this kernel lets a listener answer the filter's denials; else why not. The
    kernel lists the actions it has in /proc/sys/kernel/seccomp/actions_avail (4.14+);
    "user_notif" came with 5.0, SECCOMP_IOCTL_NOTIF_ID_VALID's fixed number with 5.17."""
    global _unavailable
    if _recording is False:
        return "unavailable: turned off (set_denial_records(False))"
    if not _unavailable:
        try:
            with open("/proc/sys/kernel/seccomp/actions_avail", "rb") as f:
                actions = f.read().split()
        except OSError as e:
            _unavailable = f"unavailable: /proc/sys/kernel/seccomp/actions_avail: {e.strerror}"
        else:
            _unavailable = "-" if b"user_notif" in actions else \
                "unavailable: the kernel has no SECCOMP_RET_USER_NOTIF (Linux < 5.0)"
    return "" if _unavailable == "-" else _unavailable


_prepared_filters: dict[bytes, "seccomp_profiles.PreparedFilter"] = {}
