"""seccomp_profiles on the real kernel: filters installed in forked children, as root and nobody.

Every denial is checked three ways:
  - under the shipped profile the call fails with the profile's errno;
  - under a *marked* copy of the profile (each errno action replaced by an errno no syscall
    returns by itself) it fails with the marker, which proves the filter answered, not the
    kernel (needed where the kernel's own answer for an unprivileged caller is also EPERM);
  - unconfined (negative control) the same call returns what the kernel returns without a
    filter, written down per privilege below.
No mocks: the syscalls are made for real, with arguments chosen to be harmless unconfined.
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import select
import shutil
import signal
import subprocess
import termios
import threading
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional, Union

import pyseccomp
import pytest

from hcp_linux import seccomp_profiles as sp
from childproc import run_in_child

IS_ROOT = os.geteuid() == 0
MACHINE = os.uname().machine
CSRC = Path(__file__).parent / "csrc"

OK = "ok"
SELF = object()  # placeholder: the child's own pid
MARKERS = {errno.EPERM: errno.ENOTRECOVERABLE, errno.ENOSYS: errno.ERFKILL, errno.EAFNOSUPPORT: errno.EOWNERDEAD}

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_syscall.argtypes = [ctypes.c_long] * 7
_prctl = _libc.prctl
_prctl.restype = ctypes.c_int
_prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
PR_SET_NO_NEW_PRIVS = 38


# --- helpers ------------------------------------------------------------------------------


def nr_of(name: Union[str, int]) -> Optional[int]:
    """Native syscall number from libseccomp (pyseccomp: independent of the code under test)."""
    if isinstance(name, int):
        return name
    nr = pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name)
    return nr if nr >= 0 else None


def raw(name: Union[str, int], *args: Any) -> Union[str, int]:
    """Make the syscall for real; OK or the errno. bytes arguments are passed as pointers."""
    keep = []
    values = []
    for a in args:
        if a is SELF:
            a = os.getpid()
        elif isinstance(a, bytes):
            buf = ctypes.create_string_buffer(a)
            keep.append(buf)
            a = ctypes.addressof(buf)
        values.append(a)
    values += [0] * (6 - len(values))
    nr = nr_of(name)
    assert nr is not None, f"{name} does not exist here"
    ctypes.set_errno(0)
    ret = _syscall(nr, *values)
    err = ctypes.get_errno()
    return OK if ret >= 0 else err


def set_nnp() -> None:
    if _prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def confined(bpf: bytes, fn: Callable[[], Any]) -> Any:
    """fn's result in a child that set no_new_privs and installed `bpf`."""
    prepared = sp.PreparedFilter(bpf)  # in the parent, as the executor does

    def child() -> Any:
        set_nnp()
        prepared.install()
        return fn()

    return run_in_child(child).unwrap()


def unconfined(fn: Callable[[], Any]) -> Any:
    return run_in_child(fn).unwrap()


def name_err(outcome: Union[str, int]) -> str:
    return outcome if isinstance(outcome, str) else errno.errorcode.get(outcome, str(outcome))


def mark_profile(name: str, directory: Path) -> Path:
    """A copy of a shipped profile whose errno actions return marker errnos instead."""
    text = (Path(sp.load_profile(name).path)).read_text()
    for real, marker in MARKERS.items():
        text = text.replace(f'"errno:{errno.errorcode[real]}"', f'"errno:{errno.errorcode[marker]}"')
    for real in MARKERS:
        assert f'"errno:{errno.errorcode[real]}"' not in text
    out = directory / f"{name}-marked.toml"
    out.write_text(text)
    return out


@pytest.fixture(scope="module", autouse=True)
def private_cache(tmp_path_factory: pytest.TempPathFactory):
    """Compile into a throw-away cache, never the user's ~/.cache."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HCP_LINUX_SECCOMP_CACHE", str(tmp_path_factory.mktemp("programs")))
        sp.clear_memory_cache()
        yield
    sp.clear_memory_cache()


@pytest.fixture(scope="module")
def baseline() -> bytes:
    return sp.compile_profiles(["baseline"])


@pytest.fixture(scope="module")
def baseline_marked(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return sp.compile_profiles([str(mark_profile("baseline", tmp_path_factory.mktemp("marked")))])


@pytest.fixture(scope="module")
def network_off() -> bytes:
    return sp.compile_profiles(["network-off"])


@pytest.fixture(scope="module")
def network_off_marked(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return sp.compile_profiles([str(mark_profile("network-off", tmp_path_factory.mktemp("marked")))])


# --- baseline: every family, every call -----------------------------------------------------

CLONE_THREAD = 0x00010000  # without CLONE_SIGHAND: EINVAL before any process is created
CLONE_NEW = {
    "NEWNS": 0x00020000,
    "NEWCGROUP": 0x02000000,
    "NEWUTS": 0x04000000,
    "NEWIPC": 0x08000000,
    "NEWUSER": 0x10000000,
    "NEWPID": 0x20000000,
    "NEWNET": 0x40000000,
}
AT_FDCWD = -100
OPEN_TREE_CLOEXEC = os.O_CLOEXEC
UFFD_USER_MODE_ONLY = 1
PTRACE_ATTACH = 16
E = errno


class Case(NamedTuple):
    id: str
    call: Union[str, int]
    args: tuple
    denied: int                 # errno under the shipped profile
    root: frozenset             # unconfined outcomes as root
    user: frozenset             # unconfined outcomes as an unprivileged user
    setsid: bool = False        # drop the controlling terminal first


def _outcomes(v: Any) -> frozenset:
    return frozenset(v if isinstance(v, (set, frozenset, tuple)) else (v,))


def case(id: str, call: Union[str, int], args: tuple, denied: int, root: Any, user: Any = None,
         setsid: bool = False) -> Case:
    """A call, its denial, and its unconfined outcomes as root and as a user (default: same)."""
    return Case(id, call, args, denied, _outcomes(root), _outcomes(root if user is None else user), setsid)


BASELINE_CASES = [
    case("unshare", "unshare", (0,), E.EPERM, OK),
    case("setns", "setns", (-1, 0), E.EPERM, E.EBADF),
    *[case(f"clone-{n}", "clone", (bit | CLONE_THREAD, 0, 0, 0, 0), E.EPERM, E.EINVAL) for n, bit in CLONE_NEW.items()],
    case("clone3", "clone3", (0, 0), E.ENOSYS, E.EINVAL),
    case("mount", "mount", (0, 0, 0, 0, 0), E.EPERM, E.EFAULT),
    case("umount2", "umount2", (0, 0x80000000), E.EPERM, E.EINVAL),
    case("pivot_root", "pivot_root", (0, 0), E.EPERM, E.EFAULT, E.EPERM),
    case("chroot", "chroot", (0,), E.EPERM, E.EFAULT),
    case("move_mount", "move_mount", (-1, 0, -1, 0, 0xFFFF0000), E.EPERM, E.EINVAL, E.EPERM),
    case("open_tree", "open_tree", (AT_FDCWD, b"/", OPEN_TREE_CLOEXEC), E.EPERM, OK),
    case("fsopen", "fsopen", (0, 0xFFFF), E.EPERM, E.EINVAL, E.EPERM),
    case("fsconfig", "fsconfig", (-1, 0xFF, 0, 0, 0), E.EPERM, E.EINVAL),
    case("fsmount", "fsmount", (-1, 0xFFFF, 0), E.EPERM, E.EINVAL, E.EPERM),
    case("fspick", "fspick", (-1, 0, 0xFFFF), E.EPERM, E.EINVAL, E.EPERM),
    case("mount_setattr", "mount_setattr", (-1, 0, 0, 0, 0), E.EPERM, E.EINVAL),
    case("open_tree_attr", 467, (-1, 0, 0xFFFF0000, 0, 0), E.EPERM, {E.EINVAL, E.ENOSYS}),
    case("ptrace", "ptrace", (PTRACE_ATTACH, 0, 0, 0), E.EPERM, E.ESRCH),
    case("process_vm_readv", "process_vm_readv", (SELF, 0, 0, 0, 0, 1), E.EPERM, E.EINVAL),
    case("process_vm_writev", "process_vm_writev", (SELF, 0, 0, 0, 0, 1), E.EPERM, E.EINVAL),
    case("process_madvise", "process_madvise", (-1, 0, 0, 0, 0), E.EPERM, E.EBADF),
    case("pidfd_getfd", "pidfd_getfd", (-1, 0, 0), E.EPERM, E.EBADF),
    case("kcmp", "kcmp", (SELF, SELF, 99, 0, 0), E.EPERM, E.EINVAL),
    case("bpf", "bpf", (0, 0, 1 << 20), E.EPERM, E.E2BIG),
    case("perf_event_open", "perf_event_open", (0, 0, -1, -1, 0xFFFF0000), E.EPERM, E.EINVAL),
    case("userfaultfd", "userfaultfd", (UFFD_USER_MODE_ONLY | os.O_CLOEXEC,), E.EPERM, {OK, E.ENOSYS}),
    case("io_uring_setup", "io_uring_setup", (1, 0), E.EPERM, E.EFAULT),
    case("io_uring_enter", "io_uring_enter", (-1, 0, 0, 0, 0, 0), E.EPERM, E.EBADF),
    case("io_uring_register", "io_uring_register", (-1, 0, 0, 0), E.EPERM, {E.EINVAL, E.EBADF}),
    case("fanotify_init", "fanotify_init", (0xFFFFFFFF, 0), E.EPERM, E.EINVAL, E.EPERM),
    case("add_key", "add_key", (0, 0, 0, 0, 0), E.EPERM, E.EFAULT),
    case("request_key", "request_key", (0, 0, 0, 0), E.EPERM, E.EFAULT),
    case("keyctl", "keyctl", (0xDEAD, 0, 0, 0, 0), E.EPERM, E.EOPNOTSUPP),
    # Module and kexec calls are ENOSYS on kernels built without them (this VM's).
    case("init_module", "init_module", (0, 0, 0), E.EPERM, {E.ENOSYS, E.ENOEXEC, E.EFAULT}, {E.ENOSYS, E.EPERM}),
    case("finit_module", "finit_module", (-1, 0, 0), E.EPERM, {E.ENOSYS, E.EBADF}, {E.ENOSYS, E.EPERM}),
    case("delete_module", "delete_module", (0, 0), E.EPERM, {E.ENOSYS, E.EFAULT}, {E.ENOSYS, E.EPERM}),
    case("kexec_load", "kexec_load", (0, 0, 0, 0xDEAD0000), E.EPERM, {E.ENOSYS, E.EINVAL}, {E.ENOSYS, E.EPERM}),
    case("kexec_file_load", "kexec_file_load", (-1, -1, 0, 0, 0xDEAD0000), E.EPERM,
         {E.ENOSYS, E.EINVAL, E.EBADF}, {E.ENOSYS, E.EPERM}),
    case("reboot", "reboot", (0, 0, 0, 0), E.EPERM, E.EINVAL, E.EPERM),  # wrong magic: never reboots
    case("swapon", "swapon", (0, 0xFFFFFFFF), E.EPERM, E.EINVAL),
    case("swapoff", "swapoff", (0,), E.EPERM, E.EFAULT, E.EPERM),
    case("settimeofday", "settimeofday", (1, 0), E.EPERM, E.EFAULT),
    case("clock_settime", "clock_settime", (99999, 0), E.EPERM, E.EINVAL),
    case("clock_adjtime", "clock_adjtime", (99999, 0), E.EPERM, {E.EFAULT, E.EINVAL}),
    case("adjtimex", "adjtimex", (0,), E.EPERM, E.EFAULT),
    case("acct", "acct", (1,), E.EPERM, E.EFAULT, E.EPERM),
    case("quotactl", "quotactl", (0xDEAD, 0, 0, 0), E.EPERM, E.EINVAL),
    case("quotactl_fd", "quotactl_fd", (-1, 0xDEAD, 0, 0), E.EPERM, {E.EBADF, E.EINVAL}),
    case("syslog", "syslog", (10, 0, 0), E.EPERM, OK, {OK, E.EPERM}),  # SIZE_BUFFER; dmesg_restrict
    case("vhangup", "vhangup", (), E.EPERM, OK, E.EPERM, setsid=True),  # no ctty: hangs up nothing
    case("iopl", "iopl", (4,), E.EPERM, {E.EINVAL, E.ENOSYS}),
    case("ioperm", "ioperm", (0, 0, 0), E.EPERM, {E.EINVAL, E.ENOSYS}),
    case("open_by_handle_at", "open_by_handle_at", (-1, 0, 0), E.EPERM, {E.EFAULT, E.EBADF}, {E.EFAULT, E.EPERM}),
    case("lookup_dcookie", "lookup_dcookie", (0, 0, 0), E.EPERM, {E.ENOSYS, E.EINVAL, E.EFAULT}, {E.ENOSYS, E.EPERM}),
    case("nfsservctl", "nfsservctl", (0, 0, 0), E.EPERM, E.ENOSYS),
    case("uselib", "uselib", (0,), E.EPERM, {E.ENOSYS, E.EFAULT}),
    case("_sysctl", "_sysctl", (0,), E.EPERM, E.ENOSYS),
]


def _call(c: Case) -> Callable[[], Union[str, int]]:
    def fn() -> Union[str, int]:
        if c.setsid:
            os.setsid()
        return raw(c.call, *c.args)

    return fn


@pytest.mark.parametrize("c", BASELINE_CASES, ids=[c.id for c in BASELINE_CASES])
def test_baseline_denies(c: Case, baseline: bytes, baseline_marked: bytes) -> None:
    if nr_of(c.call) is None:
        pytest.skip(f"{c.call} does not exist on {MACHINE}")
    expected_unconfined = c.root if IS_ROOT else c.user
    free = unconfined(_call(c))
    assert free in expected_unconfined, f"unconfined {c.id} gave {name_err(free)}"
    assert confined(baseline, _call(c)) == c.denied
    assert confined(baseline_marked, _call(c)) == MARKERS[c.denied], "the filter did not answer"
    if c.denied not in expected_unconfined:
        assert free != c.denied


def test_baseline_covers_every_call_it_names() -> None:
    """The table above exercises every syscall of baseline (except those absent here)."""
    profile = sp.load_profile("baseline")
    tested = {c.call if isinstance(c.call, str) else c.id for c in BASELINE_CASES} | {"personality", "ioctl"}
    missing = [n for n in profile.syscalls() if n not in tested and n not in profile.unavailable]
    assert missing == []


def test_baseline_records_calls_absent_here() -> None:
    profile = sp.load_profile("baseline")
    if MACHINE == "x86_64":
        assert set(profile.unavailable) == {"umount", "stime"}
    for name in profile.unavailable:
        assert nr_of(name) is None


# --- personality ----------------------------------------------------------------------------

PERSONALITY_ALLOWED = [0, 8, 0x0020008, 0xFFFFFFFF, 0x1_FFFFFFFF]  # query with garbage: still a query
PERSONALITY_DENIED = [0x0400000, 0x0040000, 0x0200000, 0x0100000,
                      0x0040008, 0x80040000, 0xFFFFFFFE, 0xFFFBFFFF, 0x1_00040000]


def _personality_probe() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for value in PERSONALITY_ALLOWED + PERSONALITY_DENIED:
        ctypes.set_errno(0)
        ret = _syscall(nr_of("personality"), value, 0, 0, 0, 0, 0)
        out[hex(value)] = OK if ret >= 0 else ctypes.get_errno()
        _syscall(nr_of("personality"), 0, 0, 0, 0, 0, 0)  # back to PER_LINUX
    # The query really reached the kernel: it reports what was set.
    _syscall(nr_of("personality"), 8, 0, 0, 0, 0, 0)
    out["query-after-8"] = _syscall(nr_of("personality"), 0xFFFFFFFF, 0, 0, 0, 0, 0)
    return out


def test_personality_flags_refused_query_kept(baseline: bytes) -> None:
    free = unconfined(_personality_probe)
    assert all(free[hex(v)] == OK for v in PERSONALITY_ALLOWED + PERSONALITY_DENIED)
    got = confined(baseline, _personality_probe)
    assert {v: got[hex(v)] for v in PERSONALITY_ALLOWED} == {v: OK for v in PERSONALITY_ALLOWED}
    assert {v: got[hex(v)] for v in PERSONALITY_DENIED} == {v: errno.EPERM for v in PERSONALITY_DENIED}
    assert got["query-after-8"] == 8


# --- TIOCSTI / TIOCLINUX --------------------------------------------------------------------

TIOCSTI = 0x5412
TIOCLINUX = 0x541C
GARBAGE = 0xDEADBEEF_00000000


def _tty_probe() -> dict[str, Any]:
    """Own a pty as controlling terminal, then try to inject 'x\\n' into its input."""
    master, slave = os.openpty()
    os.setsid()
    fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
    out: dict[str, Any] = {
        "TIOCSTI": raw("ioctl", slave, TIOCSTI, b"x"),
        "TIOCSTI|garbage": raw("ioctl", slave, GARBAGE | TIOCSTI, b"\n"),
        "TIOCLINUX": raw("ioctl", slave, TIOCLINUX, b"\x00"),
        "TIOCLINUX|garbage": raw("ioctl", slave, GARBAGE | TIOCLINUX, b"\x00"),
        "TIOCGWINSZ": raw("ioctl", slave, termios.TIOCGWINSZ, bytes(8)),
    }
    readable, _, _ = select.select([slave], [], [], 0.2)
    out["injected"] = os.read(slave, 16) if readable else b""
    return out


def test_tiocsti_refused_on_low_32_bits(baseline: bytes) -> None:
    got = confined(baseline, _tty_probe)
    assert got == {
        "TIOCSTI": errno.EPERM,
        "TIOCSTI|garbage": errno.EPERM,
        "TIOCLINUX": errno.EPERM,
        "TIOCLINUX|garbage": errno.EPERM,
        "TIOCGWINSZ": OK,  # other ioctls pass
        "injected": b"",
    }


def test_tiocsti_works_unconfined() -> None:
    legacy = Path("/proc/sys/dev/tty/legacy_tiocsti")
    if legacy.exists() and legacy.read_text().strip() == "0":
        pytest.skip("dev.tty.legacy_tiocsti=0: the kernel refuses TIOCSTI itself, no control possible")
    got = unconfined(_tty_probe)
    assert got["TIOCSTI"] == OK and got["TIOCSTI|garbage"] == OK  # the kernel reads 32 bits
    assert got["injected"] == b"x\n"
    assert got["TIOCLINUX"] != errno.EPERM  # ENOTTY: a pty is not a virtual console


# --- ordinary programs still work ----------------------------------------------------------


def test_threads_start_under_baseline(baseline: bytes) -> None:
    def fn() -> list[int]:
        results: list[int] = []
        t = threading.Thread(target=lambda: results.append(threading.get_native_id()))
        t.start()
        t.join(10)
        return results + [raw("clone3", 0, 0)]

    native_id, clone3 = confined(baseline, fn)
    assert native_id > 0
    assert clone3 == errno.ENOSYS  # the thread was made by libc's clone fallback


def test_shell_pipeline_under_baseline(baseline: bytes) -> None:
    def fn() -> tuple[int, bytes]:
        r = subprocess.run(["sh", "-c", "echo a | tr a b"], capture_output=True, timeout=30)
        return r.returncode, r.stdout

    assert confined(baseline, fn) == (0, b"b\n")


def test_both_profiles_together(baseline: bytes) -> None:
    both = sp.compile_profiles(["baseline", "network-off"])

    def fn() -> tuple[Any, ...]:
        r = subprocess.run(["sh", "-c", "echo a | tr a b"], capture_output=True, timeout=30)
        return raw("unshare", 0), raw("socket", 2, 2, 0), raw("socket", 1, 1, 0), r.stdout

    assert confined(both, fn) == (errno.EPERM, errno.EAFNOSUPPORT, OK, b"b\n")


# --- foreign architectures ----------------------------------------------------------------


@pytest.fixture(scope="module")
def c_programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    if MACHINE != "x86_64":
        pytest.skip("i386 int 0x80 and x32 are x86_64 matters")
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc not installed (scripts/install-system-deps installs it)")
    out = tmp_path_factory.mktemp("csrc")
    out.chmod(0o755)
    built = {}
    for name in ("int80_getpid", "x32_getpid"):
        exe = out / name
        subprocess.run([gcc, "-O1", "-Wall", "-o", str(exe), str(CSRC / f"{name}.c")], check=True,
                       capture_output=True, timeout=120)
        exe.chmod(0o755)
        built[name] = str(exe)
    return built


def _exec_confined(bpf: bytes, exe: str) -> Any:
    prepared = sp.PreparedFilter(bpf)

    def child() -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        set_nnp()
        prepared.install()
        os.execv(exe, [exe])  # execve itself must pass the filter

    return run_in_child(child)


def test_i386_int80_kills_process(c_programs: dict[str, str], baseline: bytes) -> None:
    exe = c_programs["int80_getpid"]
    free = subprocess.run([exe], capture_output=True, text=True, timeout=30)
    assert free.returncode == 0, f"IA32 emulation off? {free.stdout!r}"  # int 0x80 returned the pid
    res = _exec_confined(baseline, exe)
    assert res.signal == signal.SIGSYS


def test_x32_syscall_kills_process(c_programs: dict[str, str], baseline: bytes) -> None:
    exe = c_programs["x32_getpid"]
    free = subprocess.run([exe], capture_output=True, text=True, timeout=30)
    assert free.returncode == 0
    assert int(free.stdout) == -errno.ENOSYS or int(free.stdout) > 0
    res = _exec_confined(baseline, exe)
    assert res.signal == signal.SIGSYS


def test_exec_of_a_native_program_works(baseline: bytes) -> None:
    res = _exec_confined(baseline, "/bin/true")
    assert res.signal is None and res.exit_code == 0


# --- network-off --------------------------------------------------------------------------

AF_UNIX, AF_INET, AF_INET6, AF_NETLINK, AF_PACKET = 1, 2, 10, 16, 17
SOCK_STREAM, SOCK_DGRAM, SOCK_RAW = 1, 2, 3
NETLINK_ROUTE = 0
_IPV6 = os.path.exists("/proc/net/if_inet6")

SOCKET_CASES = [
    case("AF_INET-dgram", "socket", (AF_INET, SOCK_DGRAM, 0), E.EAFNOSUPPORT, OK),
    case("AF_INET6-stream", "socket", (AF_INET6, SOCK_STREAM, 0), E.EAFNOSUPPORT, OK if _IPV6 else E.EAFNOSUPPORT),
    case("AF_PACKET-raw", "socket", (AF_PACKET, SOCK_RAW, 0), E.EAFNOSUPPORT, OK, E.EPERM),  # CAP_NET_RAW
    case("AF_NETLINK-route", "socket", (AF_NETLINK, SOCK_RAW, NETLINK_ROUTE), E.EAFNOSUPPORT, OK),
    case("socketpair-AF_INET", "socketpair", (AF_INET, SOCK_STREAM, 0, bytes(8)), E.EAFNOSUPPORT, E.EOPNOTSUPP),
    case("io_uring_setup", "io_uring_setup", (1, 0), E.EPERM, E.EFAULT),
]


@pytest.mark.parametrize("c", SOCKET_CASES, ids=[c.id for c in SOCKET_CASES])
def test_network_off_denies(c: Case, network_off: bytes, network_off_marked: bytes) -> None:
    expected_unconfined = c.root if IS_ROOT else c.user
    free = unconfined(_call(c))
    assert free in expected_unconfined, f"unconfined {c.id} gave {name_err(free)}"
    assert confined(network_off, _call(c)) == c.denied
    assert confined(network_off_marked, _call(c)) == MARKERS[c.denied]


def test_network_off_keeps_unix_sockets(network_off: bytes) -> None:
    import socket

    def fn() -> tuple[bytes, bool]:
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        a.sendall(b"ping")
        got = b.recv(4)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        ok = s.fileno() >= 0
        for x in (a, b, s):
            x.close()
        return got, ok

    assert confined(network_off, fn) == (b"ping", True)


# --- the loader ---------------------------------------------------------------------------


def _seccomp_mode() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Seccomp:"):
            return int(line.split()[1])
    raise AssertionError("no Seccomp line")


def test_install_sets_filter_mode(baseline: bytes) -> None:
    assert unconfined(_seccomp_mode) == 0
    assert confined(baseline, _seccomp_mode) == 2


def test_install_needs_nnp_unless_privileged(baseline: bytes) -> None:
    prepared = sp.PreparedFilter(baseline)

    def fn() -> Optional[int]:
        try:
            prepared.install()
        except OSError as exc:
            return exc.errno
        return None

    assert unconfined(fn) == (None if IS_ROOT else errno.EACCES)


def test_install_reports_kernel_errno() -> None:
    bad = sp.PreparedFilter(bytes(8))  # one `ld #0` and no return: the kernel refuses it

    def fn() -> tuple[int, int]:
        set_nnp()
        try:
            bad.install()
        except OSError as exc:
            return exc.errno, _seccomp_mode()
        raise AssertionError("installed an invalid program")

    assert unconfined(fn) == (errno.EINVAL, 0)


def test_install_with_tsync_and_stacking(baseline: bytes, network_off: bytes) -> None:
    first, second = sp.PreparedFilter(baseline), sp.PreparedFilter(network_off)

    def fn() -> tuple[Any, ...]:
        set_nnp()
        first.install(sp.SECCOMP_FILTER_FLAG_TSYNC)
        second.install()
        return raw("unshare", 0), raw("socket", AF_INET, SOCK_DGRAM, 0)

    assert unconfined(fn) == (errno.EPERM, errno.EAFNOSUPPORT)


def test_install_filter_convenience(network_off: bytes) -> None:
    def fn() -> Any:
        set_nnp()
        sp.install_filter(network_off)
        return raw("socket", AF_INET, SOCK_DGRAM, 0)

    assert unconfined(fn) == errno.EAFNOSUPPORT


def test_prepared_filter_rejects_non_programs() -> None:
    for junk in (b"", b"abc", bytes(8 * 4097)):
        with pytest.raises(ValueError):
            sp.PreparedFilter(junk)
    with pytest.raises(TypeError):
        sp.PreparedFilter("baseline")  # type: ignore[arg-type]


# --- bad input: refused before anything is installed ---------------------------------------


def test_bad_profile_leaves_child_unconfined(tmp_path: Path) -> None:
    bad = tmp_path / "typo.toml"
    bad.write_text('[profile]\nname = "typo"\ndefault_action = "allow"\n\n'
                   '[[rule]]\nsyscall = ["unshare", "unshaer"]\naction = "errno:EPERM"\nwhy = "typo"\n')

    def fn() -> tuple[str, Any, int]:
        set_nnp()
        try:
            sp.install_filter(sp.compile_profiles(["baseline", str(bad)]))
        except sp.UnknownSyscallError as exc:
            return exc.syscall, raw("unshare", 0), _seccomp_mode()
        raise AssertionError("compiled a profile with a typo")

    assert unconfined(fn) == ("unshaer", OK, 0)


# --- socket-families: raw and packet types of the internet families ---------------------------

SOCK_RAW, SOCK_PACKET, SOCK_NONBLOCK, SOCK_CLOEXEC = 3, 10, 0o4000, 0o2000000
AF_INET, AF_INET6, AF_PACKET = 2, 10, 17
#: (family, type, protocol): socket(AF_INET, SOCK_PACKET) the kernel turns into AF_PACKET;
#: raw IPv4/IPv6 (ICMP); the same with the flags OR-ed into type; upper-half garbage in type.
_RAW_CALLS = [(AF_INET, SOCK_PACKET, 0x0300), (AF_INET6, SOCK_PACKET, 0x0300),
              (AF_INET, SOCK_RAW, 1), (AF_INET6, SOCK_RAW, 58),
              (AF_INET, SOCK_RAW | SOCK_CLOEXEC | SOCK_NONBLOCK, 1),
              (AF_INET, SOCK_PACKET | SOCK_CLOEXEC, 0x0300),
              (AF_INET, (1 << 32) | SOCK_RAW, 1)]


def _raw_sockets() -> list[Any]:
    out = [raw("socket", *c) for c in _RAW_CALLS]
    out.append(raw("socket", AF_PACKET, SOCK_RAW, 0x0300))
    out.append(raw("socket", AF_INET, 1 | SOCK_CLOEXEC, 0))  # a TCP socket still opens
    return out


def test_socket_families_refuses_raw_and_packet_types_itself() -> None:
    """As root the process holds CAP_NET_RAW, so only the filter stands in the way; its errno
    (EACCES) is not the capability check's (EPERM): as nobody the answer is the filter's too."""
    program = sp.compile_profiles(["socket-families"])
    got = confined(program, _raw_sockets)
    assert got == [errno.EACCES] * len(_RAW_CALLS) + [errno.EAFNOSUPPORT, OK], \
        [name_err(g) for g in got]


def test_raw_and_packet_sockets_open_unconfined() -> None:
    """Control: unconfined, root opens them (AF_INET6's SOCK_PACKET does not exist); nobody
    is refused by the capability check (EPERM)."""
    got = unconfined(_raw_sockets)
    opened = OK if os.geteuid() == 0 else errno.EPERM
    want = [opened] * (len(_RAW_CALLS) + 1) + [OK]
    want[1] = errno.EINVAL  # AF_INET6 has no SOCK_PACKET compatibility path: refused anyway
    assert got == want, [name_err(g) for g in got]
