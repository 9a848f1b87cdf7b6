"""landlock package: ABI detection and masking, builder errors, raw syscalls, fd hand-off.

Filesystem enforcement is in test_landlock_fs.py, TCP and scopes in test_landlock_net.py.
Every denial here is paired with a control: the same action allowed without the ruleset.
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from hcp_linux import landlock
from hcp_linux.landlock import (AccessFs, AccessNet, CompatLevel, FactKind, RestrictFlags,
                                Ruleset, RulesetStatus, Scope, _sys)
from test_landlock_helpers import (ABI, OK, append, child, drop_to_nobody, enforced, err,
                                   make_tree, needs_abi, set_nnp)

pytestmark = needs_abi(1)

ALL_FS = AccessFs.known()
ALL_NET = AccessNet.known()
ALL_SCOPE = Scope.known()
#: The ABI that has every right above (the newest one's)
FULL_AT = max(AccessFs.introduced_in(ALL_FS), AccessNet.introduced_in(ALL_NET),
              Scope.introduced_in(ALL_SCOPE))


# --- constants and ABI table -------------------------------------------------------------

def test_values_match_uapi() -> None:
    """Pin every bit to include/uapi/linux/landlock.h."""
    assert [int(r) for r in AccessFs] == [1 << i for i in range(17)]
    assert AccessFs.IOCTL_DEV == 1 << 15 and AccessFs.REFER == 1 << 13
    assert AccessFs.RESOLVE_UNIX == 1 << 16
    assert (AccessNet.BIND_TCP, AccessNet.CONNECT_TCP) == (1, 2)
    assert (Scope.ABSTRACT_UNIX_SOCKET, Scope.SIGNAL) == (1, 2)
    assert [int(f) for f in RestrictFlags] == [1, 2, 4, 8]
    assert ctypes.sizeof(_sys.PathBeneathAttr) == 12  # packed
    assert ctypes.sizeof(_sys.NetPortAttr) == 16
    assert ctypes.sizeof(_sys.RulesetAttr) == 24


def test_introduced_in_each_right() -> None:
    # A list, not a dict: IntFlags of different types hash alike (BIND_TCP == EXECUTE == 1).
    expected: list[tuple[landlock.rights._AbiFlag, int]] = [
        (AccessFs.REFER, 2), (AccessFs.TRUNCATE, 3), (AccessFs.IOCTL_DEV, 5),
        (AccessFs.RESOLVE_UNIX, 9),
        (AccessNet.BIND_TCP, 4), (AccessNet.CONNECT_TCP, 4), (Scope.SIGNAL, 6),
        (Scope.ABSTRACT_UNIX_SOCKET, 6), (RestrictFlags.LOG_SAME_EXEC_OFF, 7),
        (RestrictFlags.LOG_NEW_EXEC_ON, 7), (RestrictFlags.LOG_SUBDOMAINS_OFF, 7),
        (RestrictFlags.TSYNC, 8)]
    abi1 = [r for r in AccessFs if r <= AccessFs.MAKE_SYM]
    assert len(abi1) == 13
    expected += [(r, 1) for r in abi1]
    for right, abi in expected:
        assert landlock.introduced_in(right) == abi, right
        assert type(right).introduced_in(right) == abi
    assert AccessFs.introduced_in(AccessFs.READ_FILE | AccessFs.TRUNCATE) == 3
    with pytest.raises(landlock.RulesetError):
        AccessFs.introduced_in(1 << 40)


@pytest.mark.parametrize("abi", range(0, landlock.LATEST_ABI + 1))
def test_from_abi_is_exactly_the_rights_known_then(abi: int) -> None:
    for cls in (AccessFs, AccessNet, Scope, RestrictFlags):
        want = [r for r in cls if cls.introduced_in(r) <= abi]
        got = cls.from_abi(abi)
        assert sorted(int(r) for r in want) == [int(r) for r in cls if r & got]


def test_groups() -> None:
    assert landlock.ACCESS_FS_READ == AccessFs.READ_FILE | AccessFs.READ_DIR
    assert landlock.ACCESS_FS_READ_EXECUTE == landlock.ACCESS_FS_READ | AccessFs.EXECUTE
    assert landlock.ACCESS_FS_READ_WRITE == AccessFs.known()
    assert landlock.ACCESS_FS_WRITE | landlock.ACCESS_FS_READ_EXECUTE == AccessFs.known()
    file_rights = (AccessFs.EXECUTE | AccessFs.WRITE_FILE | AccessFs.READ_FILE
                   | AccessFs.TRUNCATE | AccessFs.IOCTL_DEV | AccessFs.RESOLVE_UNIX)
    assert landlock.DIR_ONLY_RIGHTS == AccessFs.known() & ~file_rights


def test_abi_version_matches_kernel_and_cli() -> None:
    assert landlock.abi_version() == _sys.abi_version() >= 1
    code = "from hcp_linux import landlock; print(landlock.abi_version())"
    out = subprocess.run([sys.executable, "-c", code],
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": os.path.dirname(
                             os.path.dirname(landlock.__file__))})
    assert out.stdout.strip() == str(ABI)


# --- ABI masking via Ruleset(abi=N) --------------------------------------------------------

@pytest.mark.parametrize("n", range(1, landlock.LATEST_ABI + 1))
def test_abi_masking_best_effort(n: int) -> None:
    if n > ABI:
        pytest.skip(f"kernel ABI {ABI} cannot build an ABI-{n} ruleset")
    rs = Ruleset(handled_fs=ALL_FS, handled_net=ALL_NET, scoped=ALL_SCOPE, abi=n)
    with rs.create() as created:
        assert created.fd >= 0 and created.abi == n
        assert created.handled_fs == AccessFs.from_abi(n)
        assert created.handled_net == AccessNet.from_abi(n)
        assert created.scoped == Scope.from_abi(n)
        lacking = {"handled_fs": ALL_FS & ~AccessFs.from_abi(n),
                   "handled_net": ALL_NET & ~AccessNet.from_abi(n),
                   "scoped": ALL_SCOPE & ~Scope.from_abi(n)}
        assert created.dropped == {k: int(v) for k, v in lacking.items() if v}
        expected = RulesetStatus.FULLY_ENFORCED if n >= FULL_AT \
            else RulesetStatus.PARTIALLY_ENFORCED
        assert created.status is expected


@pytest.mark.parametrize("n", range(1, landlock.LATEST_ABI + 1))
def test_abi_masking_hard_requirement(n: int) -> None:
    if n > ABI:
        pytest.skip(f"kernel ABI {ABI} cannot build an ABI-{n} ruleset")
    kwargs = dict(handled_fs=ALL_FS, handled_net=ALL_NET, scoped=ALL_SCOPE, abi=n)
    if n >= FULL_AT:
        Ruleset(compat=CompatLevel.HARD_REQUIREMENT, **kwargs).close()  # type: ignore[arg-type]
        return
    with pytest.raises(landlock.IncompatibleError) as info:
        Ruleset(compat=CompatLevel.HARD_REQUIREMENT, **kwargs)  # type: ignore[arg-type]
    assert info.value.abi == n
    missing = {type(m): m for m in info.value.missing}
    assert missing.get(AccessFs, 0) == ALL_FS & ~AccessFs.from_abi(n)
    assert missing.get(Scope, 0) == ALL_SCOPE & ~Scope.from_abi(n)
    assert "ABI" in str(info.value)


@pytest.mark.parametrize("n", range(1, 8))
def test_required_rights_in_best_effort(n: int) -> None:
    if n > ABI:
        pytest.skip(f"kernel ABI {ABI} cannot build an ABI-{n} ruleset")
    kwargs = dict(handled_fs=ALL_FS, handled_net=ALL_NET, abi=n,
                  required=(AccessFs.TRUNCATE, AccessNet.CONNECT_TCP))
    if n >= 4:
        Ruleset(**kwargs).close()  # type: ignore[arg-type]
        return
    with pytest.raises(landlock.IncompatibleError) as info:
        Ruleset(**kwargs)  # type: ignore[arg-type]
    named = str(info.value)
    assert "CONNECT_TCP" in named and ("TRUNCATE" in named) == (n < 3)
    assert AccessNet.CONNECT_TCP in info.value.missing


def test_simulated_abi_is_what_the_kernel_enforces(tmp_path: os.PathLike[str]) -> None:
    """At a simulated ABI 2, TRUNCATE is not handled: truncation stays allowed, for real."""
    target = os.path.join(tmp_path, "f")
    with open(target, "w") as f:
        f.write("data")

    def attempt() -> tuple[int, int]:
        return err(lambda: os.truncate(target, 0)), err(lambda: append(target))

    handled = AccessFs.WRITE_FILE | AccessFs.TRUNCATE
    if ABI >= 3:
        with Ruleset(handled_fs=handled).create() as modern:
            assert enforced(modern, attempt) == (errno.EACCES, errno.EACCES)
    with Ruleset(handled_fs=handled, abi=2).create() as old:
        assert old.handled_fs == AccessFs.WRITE_FILE
        assert old.status is RulesetStatus.PARTIALLY_ENFORCED
        assert enforced(old, attempt) == (OK, errno.EACCES)


def test_refer_dropped_at_abi1_is_not_partial() -> None:
    """ABI 1 denies every cross-directory rename/link: losing REFER is stricter, not looser."""
    with Ruleset(handled_fs=AccessFs.from_abi(2), abi=1).create() as created:
        assert created.dropped == {"handled_fs": int(AccessFs.REFER)}
        assert created.status is RulesetStatus.FULLY_ENFORCED


def test_abi_above_kernel_is_clamped() -> None:
    rs = Ruleset(handled_fs=ALL_FS, abi=ABI + 5)
    assert rs.abi == ABI
    rs.close()


def test_abi_zero_best_effort_enforces_nothing(tmp_path: os.PathLike[str]) -> None:
    allowed, denied = make_tree(tmp_path)
    rs = Ruleset(handled_fs=AccessFs.WRITE_FILE, abi=0)
    rs.add_path(allowed, AccessFs.WRITE_FILE)
    with rs.create() as created:
        assert created.fd == -1
        assert created.status is RulesetStatus.NOT_ENFORCED
        assert created.dropped == {"handled_fs": int(AccessFs.WRITE_FILE)}
        assert enforced(created, lambda: err(lambda: append(os.path.join(denied, "f")))) == OK


def test_abi_zero_with_requirements_is_unsupported() -> None:
    with pytest.raises(landlock.UnsupportedError) as info:
        Ruleset(handled_fs=AccessFs.WRITE_FILE, abi=0, compat=CompatLevel.HARD_REQUIREMENT)
    assert info.value.abi == 0 and info.value.missing == (AccessFs.WRITE_FILE,)
    with pytest.raises(landlock.UnsupportedError):
        Ruleset(handled_fs=ALL_FS, abi=0, required=AccessFs.READ_FILE)
    assert issubclass(landlock.UnsupportedError, landlock.IncompatibleError)


def test_everything_dropped_is_not_enforced() -> None:
    with Ruleset(handled_net=ALL_NET, scoped=ALL_SCOPE, abi=3).create() as created:
        assert created.fd == -1 and created.status is RulesetStatus.NOT_ENFORCED


# --- restrict_self flags -----------------------------------------------------------------

@needs_abi(7)
def test_log_flags_enforce_at_abi7(tmp_path: os.PathLike[str]) -> None:
    allowed, denied = make_tree(tmp_path)
    rs = Ruleset(handled_fs=AccessFs.WRITE_FILE).add_path(allowed, AccessFs.WRITE_FILE)
    with rs.create() as created:
        flags = RestrictFlags.LOG_NEW_EXEC_ON | RestrictFlags.LOG_SUBDOMAINS_OFF
        got = enforced(created, lambda: err(lambda: append(os.path.join(denied, "f"))), flags)
        assert got == errno.EACCES
        assert created.facts == ()


def test_log_flags_masked_below_abi7(tmp_path: os.PathLike[str]) -> None:
    allowed, denied = make_tree(tmp_path)
    rs = Ruleset(handled_fs=AccessFs.WRITE_FILE, abi=6 if ABI >= 6 else ABI)
    rs.add_path(allowed, AccessFs.WRITE_FILE)
    with rs.create() as created:
        def body() -> tuple[int, dict[str, int]]:
            set_nnp()
            created.restrict_self(RestrictFlags.LOG_SAME_EXEC_OFF)
            return err(lambda: append(os.path.join(denied, "f"))), created.dropped
        denied_errno, dropped = child(body)
        assert denied_errno == errno.EACCES
        assert dropped == {"restrict_flags": int(RestrictFlags.LOG_SAME_EXEC_OFF)}


@pytest.mark.skipif(ABI >= 8, reason="TSYNC is supported from ABI 8")
def test_tsync_hard_requirement_refused_and_nothing_enforced(tmp_path: os.PathLike[str]) -> None:
    allowed, denied = make_tree(tmp_path)
    rs = Ruleset(handled_fs=AccessFs.WRITE_FILE, compat=CompatLevel.HARD_REQUIREMENT)
    with rs.add_path(allowed, AccessFs.WRITE_FILE).create() as created:
        def body() -> tuple[str, int]:
            set_nnp()
            try:
                created.restrict_self(RestrictFlags.TSYNC)
            except landlock.IncompatibleError as e:
                return type(e.missing[0]).__name__, err(lambda: append(os.path.join(denied, "f")))
            return "no error", -1
        assert child(body) == ("RestrictFlags", OK)


# --- fd hand-off and later rules ---------------------------------------------------------

def test_ruleset_fd_is_cloexec_and_enforceable_from_fd_alone(tmp_path: os.PathLike[str]) -> None:
    allowed, denied = make_tree(tmp_path)
    rs = Ruleset(handled_fs=AccessFs.WRITE_FILE).add_path(allowed, AccessFs.WRITE_FILE)
    with rs.create() as created:
        assert fcntl.fcntl(created.fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
        fd = created.fd

        def body() -> tuple[int, int]:
            set_nnp()
            landlock.restrict_self(fd)
            return err(lambda: append(os.path.join(denied, "f"))), \
                err(lambda: append(os.path.join(allowed, "f")))
        assert body_control(denied) == OK
        assert child(body) == (errno.EACCES, OK)


def body_control(denied: str) -> int:
    """The negative control: without a domain the same write succeeds."""
    return int(child(lambda: err(lambda: append(os.path.join(denied, "f")))))


def test_add_path_fd_after_create(tmp_path: os.PathLike[str]) -> None:
    allowed, denied = make_tree(tmp_path)
    with Ruleset(handled_fs=AccessFs.WRITE_FILE | AccessFs.READ_FILE).create() as created:
        def body() -> tuple[int, int, int]:
            fd = os.open(allowed, os.O_PATH | os.O_CLOEXEC)
            created.add_path_fd(fd, AccessFs.WRITE_FILE | AccessFs.READ_FILE)
            set_nnp()
            landlock.restrict_self(created.fd)
            return (err(lambda: append(os.path.join(allowed, "f"))),
                    err(lambda: append(os.path.join(denied, "f"))),
                    err(lambda: open(os.path.join(denied, "f")).close()))
        assert child(body) == (OK, errno.EACCES, errno.EACCES)


def test_add_path_fd_checks_like_add_path(tmp_path: os.PathLike[str]) -> None:
    allowed, _ = make_tree(tmp_path)
    with Ruleset(handled_fs=AccessFs.READ_FILE | AccessFs.READ_DIR).create() as created:
        with pytest.raises(landlock.RulesetError) as info:
            created.add_path_fd(0, AccessFs.WRITE_FILE)
        assert info.value.bits == AccessFs.WRITE_FILE
        fd = os.open(os.path.join(allowed, "f"), os.O_PATH | os.O_CLOEXEC)
        try:
            created.add_path_fd(fd, AccessFs.READ_FILE | AccessFs.READ_DIR)
        finally:
            os.close(fd)
        assert [f.kind for f in created.facts] == [FactKind.DIR_RIGHTS_STRIPPED]
        with pytest.raises(landlock.PathError):
            created.add_path_fd(fd, AccessFs.READ_FILE)  # now closed: EBADF


def test_close_is_idempotent_and_final() -> None:
    created = Ruleset(handled_fs=AccessFs.WRITE_FILE).create()
    fd = created.fd
    created.close()
    created.close()
    assert created.fd == -1
    assert err(lambda: os.fstat(fd)) == errno.EBADF
    with pytest.raises(landlock.LandlockError):
        created.restrict_self()


# --- bad input: every error, and nothing enforced after it --------------------------------

def _nothing_enforced_after(build, denied: str) -> tuple[str, int]:  # type: ignore[no-untyped-def]
    """In a child with NNP set: run the failing build, then try the write it would deny."""
    def body() -> tuple[str, int]:
        set_nnp()
        try:
            build()
        except landlock.LandlockError as e:
            name = type(e).__name__
        else:
            name = "no error"
        return name, err(lambda: append(os.path.join(denied, "f")))
    return child(body)  # type: ignore[no-any-return]


def test_unknown_bits_rejected(tmp_path: os.PathLike[str]) -> None:
    allowed, denied = make_tree(tmp_path)
    bad = [
        lambda: Ruleset(handled_fs=AccessFs(1 << 40)),
        lambda: Ruleset(handled_fs=(1 << 40) | int(AccessFs.WRITE_FILE)),  # type: ignore[arg-type]
        lambda: Ruleset(handled_net=AccessNet(1 << 5)),
        lambda: Ruleset(handled_fs=AccessFs.WRITE_FILE, scoped=Scope(1 << 9)),
        lambda: Ruleset(handled_fs=AccessFs.WRITE_FILE).add_path(allowed, AccessFs(1 << 41)),
    ]
    bits = [1 << 40, 1 << 40, 1 << 5, 1 << 9, 1 << 41]
    for build, b in zip(bad, bits):
        with pytest.raises(landlock.RulesetError) as info:
            build()
        assert info.value.bits == b and f"{b:#x}" in str(info.value)
    for build in bad:
        assert _nothing_enforced_after(build, denied) == ("RulesetError", OK)


def test_unknown_restrict_flags_rejected_before_enforcing(tmp_path: os.PathLike[str]) -> None:
    allowed, denied = make_tree(tmp_path)
    with Ruleset(handled_fs=AccessFs.WRITE_FILE).create() as created:
        got = _nothing_enforced_after(lambda: created.restrict_self(RestrictFlags(1 << 20)),
                                      denied)
        assert got == ("RulesetError", OK)


def test_wrong_flag_type_and_empty_sets() -> None:
    with pytest.raises(landlock.RulesetError):
        Ruleset(handled_fs=AccessNet.BIND_TCP)  # type: ignore[arg-type]
    with pytest.raises(landlock.RulesetError, match="empty"):
        Ruleset()
    rs = Ruleset(handled_fs=AccessFs.WRITE_FILE)
    with pytest.raises(landlock.RulesetError, match="empty"):
        rs.add_path("/", AccessFs(0))
    with pytest.raises(landlock.RulesetError):
        Ruleset(handled_fs=AccessFs.WRITE_FILE, required=AccessFs.READ_FILE)
    rs.close()


def test_rights_not_handled(tmp_path: os.PathLike[str]) -> None:
    allowed, denied = make_tree(tmp_path)
    rs = Ruleset(handled_fs=AccessFs.READ_FILE)
    with pytest.raises(landlock.RulesetError) as info:
        rs.add_path(allowed, AccessFs.READ_FILE | AccessFs.WRITE_FILE)
    assert info.value.bits == AccessFs.WRITE_FILE and "WRITE_FILE" in str(info.value)
    rs.close()
    if ABI >= 4:
        with pytest.raises(landlock.RulesetError) as info:
            Ruleset(handled_net=AccessNet.BIND_TCP).add_port(80, AccessNet.CONNECT_TCP)
        assert info.value.bits == AccessNet.CONNECT_TCP
    build = lambda: Ruleset(handled_fs=AccessFs.WRITE_FILE).add_path(  # noqa: E731
        allowed, AccessFs.READ_FILE)
    assert _nothing_enforced_after(build, denied) == ("RulesetError", OK)


def test_missing_path_required_vs_optional(tmp_path: os.PathLike[str]) -> None:
    allowed, denied = make_tree(tmp_path)
    missing = os.path.join(tmp_path, "nope", "deeper")
    rs = Ruleset(handled_fs=AccessFs.WRITE_FILE)
    with pytest.raises(landlock.PathError) as info:
        rs.add_path(missing, AccessFs.WRITE_FILE)
    assert info.value.path == missing and info.value.errno == errno.ENOENT
    assert missing in str(info.value)
    rs.add_path(missing, AccessFs.WRITE_FILE, optional=True)
    rs.add_path(allowed, AccessFs.WRITE_FILE)
    with rs.create() as created:
        assert [(f.kind, f.subject) for f in created.facts] == [(FactKind.PATH_SKIPPED, missing)]
        assert created.status is RulesetStatus.FULLY_ENFORCED
    build = lambda: Ruleset(handled_fs=AccessFs.WRITE_FILE).add_path(  # noqa: E731
        missing, AccessFs.WRITE_FILE).create()
    assert _nothing_enforced_after(build, denied) == ("PathError", OK)


def test_abi_too_old_for_hard_requirement_enforces_nothing(tmp_path: os.PathLike[str]) -> None:
    allowed, denied = make_tree(tmp_path)
    with pytest.raises(landlock.IncompatibleError) as info:
        Ruleset(handled_fs=AccessFs.WRITE_FILE | AccessFs.TRUNCATE, abi=2,
                compat=CompatLevel.HARD_REQUIREMENT)
    assert info.value.missing == (AccessFs.TRUNCATE,) and info.value.abi == 2
    assert "TRUNCATE" in str(info.value)
    build = lambda: Ruleset(  # noqa: E731
        handled_fs=AccessFs.WRITE_FILE | AccessFs.TRUNCATE, abi=2,
        required=AccessFs.TRUNCATE).add_path(allowed, AccessFs.WRITE_FILE).create()
    assert _nothing_enforced_after(build, denied) == ("IncompatibleError", OK)


@pytest.mark.parametrize("port", [-1, 65536, 1 << 40, "80", True])
def test_bad_port(port: object) -> None:
    rs = Ruleset(handled_net=AccessNet.BIND_TCP) if ABI >= 4 else None
    if rs is None:
        pytest.skip("needs ABI 4 to build a net ruleset")
    with pytest.raises(landlock.PortError) as info:
        rs.add_port(port, AccessNet.BIND_TCP)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError) and repr(port) in str(info.value)
    assert info.value.port == port


def test_kernel_failure_in_create_closes_everything(tmp_path: os.PathLike[str]) -> None:
    """A rule on a pipe fd passes every Python check but the kernel refuses it (EBADFD:
    pipefs is internal): create() raises, the ruleset fd and the owned path fds are closed,
    no fd leaks, and nothing is enforced."""
    allowed, denied = make_tree(tmp_path)

    def build() -> None:
        r, w = os.pipe()
        try:
            rs = Ruleset(handled_fs=AccessFs.WRITE_FILE)
            rs.add_path(allowed, AccessFs.WRITE_FILE)  # an owned fd, to check it gets closed
            rs.add_path(w, AccessFs.WRITE_FILE)
            rs.create()
        finally:
            os.close(r)
            os.close(w)

    def body() -> tuple[str, int, int, int]:
        before = len(os.listdir("/proc/self/fd"))
        set_nnp()
        try:
            build()
            name, e = "no error", 0
        except landlock.PathError as exc:
            name, e = type(exc).__name__, exc.errno
        leaked = len(os.listdir("/proc/self/fd")) - before
        return name, e, leaked, err(lambda: append(os.path.join(denied, "f")))
    assert child(body) == ("PathError", errno.EBADFD, 0, OK)


def test_ruleset_creates_once() -> None:
    rs = Ruleset(handled_fs=AccessFs.WRITE_FILE)
    rs.create().close()
    with pytest.raises(landlock.RulesetError):
        rs.create()
    with pytest.raises(landlock.RulesetError):
        rs.add_path("/", AccessFs.WRITE_FILE)


def test_restrict_self_without_nnp_is_eperm_with_hint() -> None:
    """As nobody without no_new_privs the kernel refuses (as root it would silently succeed,
    so a root run drops to nobody in the child first). The directory is world-writable so the
    denial after enforcing is Landlock's, not the permission bits'."""
    shared = tempfile.mkdtemp(prefix="landlock-nnp-")
    target = os.path.join(shared, "f")
    try:
        os.chmod(shared, 0o777)
        with Ruleset(handled_fs=AccessFs.WRITE_FILE).create() as created:
            def body() -> tuple[int, int, bool, bool, int]:
                drop_to_nobody()
                control = err(lambda: append(target))
                try:
                    landlock.restrict_self(created.fd)
                    return control, 0, False, False, -1
                except OSError as e:
                    first = (e.errno or 0, "no_new_privs" in str(e),
                             isinstance(e, landlock.SyscallError))
                set_nnp()
                landlock.restrict_self(created.fd)  # with NNP it works
                return (control, *first, err(lambda: append(target)))
            assert child(body) == (OK, errno.EPERM, True, True, errno.EACCES)
    finally:
        shutil.rmtree(shared)


# --- raw syscalls --------------------------------------------------------------------------

def test_raw_syscalls_check_errno(tmp_path: os.PathLike[str]) -> None:
    def code(fn) -> int:  # type: ignore[no-untyped-def]
        with pytest.raises(OSError) as info:
            fn()
        return info.value.errno or 0

    assert code(lambda: _sys.create_ruleset(0, 0, 0)) == errno.ENOMSG
    assert code(lambda: _sys.create_ruleset(1 << 40)) == errno.EINVAL
    assert code(lambda: _sys.create_ruleset(1, flags=1 << 7)) == errno.EINVAL
    rfd = _sys.create_ruleset(int(AccessFs.READ_FILE | AccessFs.READ_DIR))
    r, w = os.pipe()
    try:
        dfd = os.open(tmp_path, os.O_PATH)
        _sys.add_path_beneath(rfd, int(AccessFs.READ_DIR), dfd)  # a dir rule: fine
        assert code(lambda: _sys.add_path_beneath(rfd, int(AccessFs.WRITE_FILE), dfd)) \
            == errno.EINVAL  # not handled
        assert code(lambda: _sys.add_path_beneath(rfd, 0, dfd)) == errno.ENOMSG
        assert code(lambda: _sys.add_path_beneath(rfd, int(AccessFs.READ_FILE), -1)) \
            == errno.EBADF
        assert code(lambda: _sys.add_path_beneath(r, int(AccessFs.READ_FILE), dfd)) \
            == errno.EBADFD  # not a ruleset
        os.close(dfd)

        def bad_enforce() -> tuple[int, int]:  # NNP first: without it EPERM comes before all
            set_nnp()
            return err(lambda: _sys.restrict_self(-1)), err(lambda: _sys.restrict_self(r))
        assert child(bad_enforce) == (errno.EBADF, errno.EBADFD)
    finally:
        for fd in (rfd, r, w):
            os.close(fd)
    with pytest.raises(ValueError):
        _sys.add_path_beneath(0, -1, 0)


def test_raw_dir_only_right_on_file_is_einval(tmp_path: os.PathLike[str]) -> None:
    """The kernel fact behind stripping: READ_DIR in a rule on a regular file is EINVAL."""
    path = os.path.join(tmp_path, "f")
    open(path, "w").close()
    rfd = _sys.create_ruleset(int(AccessFs.READ_FILE | AccessFs.READ_DIR))
    ffd = os.open(path, os.O_PATH)
    try:
        with pytest.raises(OSError) as info:
            _sys.add_path_beneath(rfd, int(AccessFs.READ_DIR), ffd)
        assert info.value.errno == errno.EINVAL
        _sys.add_path_beneath(rfd, int(AccessFs.READ_FILE), ffd)
    finally:
        os.close(ffd)
        os.close(rfd)


@needs_abi(4)
def test_raw_port_above_65535_is_einval() -> None:
    rfd = _sys.create_ruleset(0, int(AccessNet.BIND_TCP))
    try:
        with pytest.raises(OSError) as info:
            _sys.add_net_port(rfd, int(AccessNet.BIND_TCP), 65536)
        assert info.value.errno == errno.EINVAL
        _sys.add_net_port(rfd, int(AccessNet.BIND_TCP), 65535)
    finally:
        os.close(rfd)
