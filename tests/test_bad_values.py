"""Bad values, limits, roots and packs (issue #15): every one is refused before anything is
spawned or written, in one ``error: sandbox: ...`` line naming the field, with the documented
exit status (125; 2 for a command-line usage error), never a traceback, never wrapped into a
weaker limit.

Each class is a table of bad inputs, tried through the real CLI (``--limit``, ``--policy
FILE``, ``--jail``, ``--pack``) and through the Python API (``Policy(...)``, ``Limits(...)``).
"No side effect" is proven with a marker: the command would create it, and it is absent
afterwards, the jail unchanged. Negative controls: the nearest valid value runs and creates
the marker. Nothing is mocked.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hcp_linux import Policy, Sandbox
from hcp_linux.errors import PolicyError, printable
from hcp_linux.policy.limits import CPU_SECONDS_MAX, PID_MAX_LIMIT, Limits, nr_open
from hcp_linux.policy.pack import PackError, load_pack
from hcp_linux.policy.resolve import resolve
from hcp_linux.policy.values import MAX_DEPTH, MAX_DOCUMENT, RLIM_MAX

from sandboxing import (EXECUTOR_ARGS, EXIT_REFUSED, EXIT_USAGE, IS_ROOT, TIMEOUT,  # noqa: F401
                        caller_env, jail, run_cli, show, single_error_line, snapshot)

U64 = 1 << 64
MARKER = "MARKER"
#: The command of every run here: it creates MARKER in its working directory (the jail).
WRITE_MARKER = ("sh", "-c", f"echo ran > {MARKER}")


# --- helpers ----------------------------------------------------------------------------


def refused(jail: Path, extra: list, *, status: int = EXIT_REFUSED,
            cmd: tuple = WRITE_MARKER, marker: Path | None = None, give_jail: bool = True) -> str:
    """Run the CLI with ``extra`` (after ``--jail JAIL`` unless not ``give_jail``); it must
    refuse: ``status``, one error line and nothing else on stderr or stdout, no marker, the
    jail as it was. Returns the line."""
    marker = marker or jail / MARKER
    before = snapshot(jail)
    p = run_cli(jail if give_jail else None, *cmd, extra=extra)
    assert p.returncode == status, show(p)
    line = single_error_line(p)
    assert b"Traceback" not in p.stderr and p.stdout == b"", show(p)
    assert not marker.exists(), f"the command ran:\n{show(p)}"
    assert snapshot(jail) == before, show(p)
    return line


def runs(jail: Path, extra: list, *, cmd: tuple = WRITE_MARKER,
         marker: Path | None = None) -> None:
    """Negative control: the same CLI call with a valid value runs the command."""
    marker = marker or jail / MARKER
    p = run_cli(jail, *cmd, extra=extra)
    assert p.returncode == 0, show(p)
    assert marker.read_text() == "ran\n", show(p)
    marker.unlink()


def one_line(e: BaseException) -> str:
    """The text of an API error: one line, no control character (escaped if any was given)."""
    text = str(e)
    assert text and text == printable(text) and "\n" not in text, repr(text)
    return text


def write_policy(tmp_path: Path, body: str, name: str = "policy.toml") -> Path:
    """A policy file with ``body``, and the jail of the ``jail`` fixture unless the body
    names one: the CLI validates a file before its ``--jail`` applies (the file's jail
    defaults to the CLI's cwd, which is ``/`` here)."""
    path = tmp_path / name
    if not body.startswith("jail ="):
        body = f'jail = "{tmp_path / "jail"}"\n' + body
    path.write_text(body)
    return path


# --- 1. limits that would wrap or be clamped into weaker ones -----------------------------

NR_OPEN = nr_open()

#: (--limit value, the field the error must name). Each is out of range, or not a value of
#: its kind; before issue #15 the first ones ran with a weaker limit (cpu=2**64+1 became 1 s,
#: tmp_size=16 EiB an unlimited tmpfs) or crashed (nproc=2**64+1).
BAD_LIMITS = [
    (f"cpu={U64 + 1}", "limits.cpu"),
    (f"cpu={U64}", "limits.cpu"),
    (f"cpu={CPU_SECONDS_MAX + 1}", "limits.cpu"),  # x 10**9 ns would wrap a u64
    ("cpu=0", "limits.cpu"),  # the kernel reads 0 as 1 second
    ("cpu=-1", "limits.cpu"),
    ("cpu=1.5", "limits.cpu"),  # RLIMIT_CPU counts whole seconds
    ("cpu=nan", "limits.cpu"),
    (f"nproc={U64 + 1}", "limits.nproc"),
    (f"nproc={PID_MAX_LIMIT}", "limits.nproc"),  # pid_max would be PID_MAX_LIMIT + 1
    ("nproc=0", "limits.nproc"),
    ("nproc=0x10", "limits.nproc"),
    ("nproc=1e3", "limits.nproc"),
    ("nproc=", "limits.nproc"),
    (f"nofile={U64 + 1}", "limits.nofile"),
    (f"nofile={NR_OPEN + 1}", "limits.nofile"),  # above fs.nr_open: EPERM in the child
    ("nofile=0", "limits.nofile"),
    (f"fsize={U64 + 1}", "limits.fsize"),  # wrapped to 1 byte: SIGXFSZ at the first write
    (f"fsize={RLIM_MAX + 1}", "limits.fsize"),
    ("as=99999999999999999999999g", "limits.as"),
    ("as=1.5", "limits.as"),  # not a whole number of bytes
    ("tmp_size=17179869184g", "limits.tmp_size"),  # 2**64: size= parsed as 0, unlimited
    (f"tmp_size={U64 - 1}", "limits.tmp_size"),  # rounded up to pages it wraps to 0 too
    ("tmp_size=0", "limits.tmp_size"),
    ("tmp_size=unlimited", "limits.tmp_size"),
    ("tmp_size=0.3k", "limits.tmp_size"),
    ("tmp_size=16e", "limits.tmp_size"),
    (f"shm_size={U64}", "limits.shm_size"),
    ("output=1e3", "limits.output"),
    ("output=-5", "limits.output"),
    ("memory=18446744073709551616", "limits.memory"),
    (f"pids={PID_MAX_LIMIT + 1}", "limits.pids"),
    ("cpu_quota=nan", "limits.cpu_quota"),
    ("cpu_quota=inf", "limits.cpu_quota"),
    ("cpu_quota=0", "limits.cpu_quota"),
    ("cpu_quota=0.001", "limits.cpu_quota"),  # below the kernel's 1 ms per 100 ms period
    ("cpu_quota=-1", "limits.cpu_quota"),
    ("cpu_quota=1e9", "limits.cpu_quota"),
    ("bogus=1", "bogus"),
]

#: The nearest valid values: each runs the command.
GOOD_LIMITS = [
    "cpu=60", "cpu=2m", f"cpu={CPU_SECONDS_MAX}", "cpu=unlimited", f"nproc={PID_MAX_LIMIT - 1}",
    "nproc=256", "nofile=64", f"fsize={RLIM_MAX}", "fsize=1k", "as=1t", "as=unlimited",
    "tmp_size=16g", "tmp_size=1.5m", "shm_size=1m", "output=1k",
]


@pytest.mark.parametrize("limit, field", BAD_LIMITS, ids=[b[0][:40] for b in BAD_LIMITS])
def test_bad_limit_cli(jail: Path, limit: str, field: str) -> None:
    line = refused(jail, ["--limit", limit])
    assert field in line, line


@pytest.mark.parametrize("limit", GOOD_LIMITS)
def test_good_limit_cli_runs(jail: Path, limit: str) -> None:
    runs(jail, ["--limit", limit])


def test_cpu_quota_is_parsed_as_cpus(jail: Path) -> None:
    """cpu_quota is a number of CPUs and may be fractional. cgroup v2 limits are refused on
    a host that cannot apply them (all, in this version), but only after the value was
    parsed: a valid one is refused for the cgroup, a bad one for its value."""
    assert Limits(cpu_quota=0.5).cpu_quota == 0.5
    assert Limits.from_mapping({"cpu_quota": "0.5"}).cpu_quota == 0.5
    assert Limits(cpu_quota=2).cpu_quota == 2.0
    assert Limits(cpu_quota=0.5).cpu_max() == "50000 100000"
    assert Limits(cpu_quota=0.01).cpu_max() == "1000 100000"
    line = refused(jail, ["--limit", "cpu_quota=0.5"])
    assert "cgroup v2" in line and "expected" not in line, line
    line = refused(jail, ["--limit", "cpu_quota=0.001"])
    assert "limits.cpu_quota: expected a number from 0.01" in line, line


@pytest.mark.parametrize("limit, field", BAD_LIMITS[:12] + BAD_LIMITS[14:24],
                         ids=[b[0][:40] for b in BAD_LIMITS[:12] + BAD_LIMITS[14:24]])
def test_bad_limit_policy_file(tmp_path: Path, jail: Path, limit: str, field: str) -> None:
    """The same values from a policy file's [limits] table (TOML: a bare integer when all
    digits, a string otherwise)."""
    key, _, value = limit.partition("=")
    toml_value = value if value.isdigit() or value.lstrip("-").isdigit() else json.dumps(value)
    policy = write_policy(tmp_path, f"[limits]\n{key} = {toml_value}\n")
    line = refused(jail, ["--policy", str(policy)])
    assert field in line and f"policy file {policy}" in line, line


@pytest.mark.parametrize("body", ['[limits]\ncpu = 60\n', '[limits]\nas = "1.5g"\n',
                                  'timeout = "2m"\n', 'timeout = 30\n[limits]\nnproc = 64\n'])
def test_good_policy_file_runs(tmp_path: Path, jail: Path, body: str) -> None:
    runs(jail, ["--policy", str(write_policy(tmp_path, body))])


# --- 2. values of the wrong kind, from a policy file and from the command line -----------

BAD_POLICY_FILES = [
    ('timeout = nan\n', "timeout"),
    ('timeout = inf\n', "timeout"),
    ('timeout = -1\n', "timeout"),
    ('timeout = 0\n', "timeout"),
    ('timeout = true\n', "timeout"),
    ('timeout = "forever"\n', "timeout"),
    ('timeout = 2147484\n', "timeout"),  # beyond what a poll timeout can express
    ('[limits]\nnproc = true\n', "limits.nproc"),
    ('[limits]\nnproc = 1.5\n', "limits.nproc"),
    ('[limits]\nnofile = [1]\n', "limits.nofile"),
    ('limits = 5\n', "limits"),
    ('write_roots = "/tmp"\n', "write_roots"),  # a string where a list is expected
    ('read_only_roots = [1]\n', "read_only_roots"),
    ('system_roots = "/usr"\n', "system_roots"),
    ('system_roots = ["usr"]\n', "system_roots"),
    ('jail = "/tmp/x\\ny"\n', "jail"),  # a newline in a path
    ('jail = "relative"\n', "jail"),
    ('jail = 5\n', "jail"),
    ('sandbox = "yes"\n', "sandbox"),
    ('network = 5\n', "network"),
    ('on_exit = []\n', "on_exit"),
    ('env = { A = 1 }\n', "env"),
    ('env = "A=1"\n', "env"),
    ('allow_degraded = "userns"\n', "allow_degraded"),
    ('unknown = 1\n', "unknown"),
    ('a = ' + '[' * 5000 + ']' * 5000 + '\n', f"nested deeper than {MAX_DEPTH} levels"),
    ('a = ' + '[' * (MAX_DEPTH + 2) + ']' * (MAX_DEPTH + 2) + '\n', "nested deeper"),
    ('a = ' + '{ b = ' * 400 + '1' + ' }' * 400 + '\n', "nested deeper"),
    ('jail = \n', "malformed TOML"),
]


@pytest.mark.parametrize("body, fragment", BAD_POLICY_FILES,
                         ids=[f"{i}-{b[1][:20]}" for i, b in enumerate(BAD_POLICY_FILES)])
def test_bad_policy_file(tmp_path: Path, jail: Path, body: str, fragment: str) -> None:
    policy = write_policy(tmp_path, body)
    line = refused(jail, ["--policy", str(policy)])
    assert fragment in line and f"policy file {policy}" in line, line


def test_policy_file_too_large_or_not_text(tmp_path: Path, jail: Path) -> None:
    big = write_policy(tmp_path, "# x\n" * (MAX_DOCUMENT // 4 + 1), "big.toml")
    assert f"larger than {MAX_DOCUMENT} bytes" in refused(jail, ["--policy", str(big)])
    assert "larger than" in refused(jail, ["--policy", "/dev/zero"])
    latin = tmp_path / "latin.toml"
    latin.write_bytes(b'network = "n\xe9"\n')
    assert "not valid UTF-8" in refused(jail, ["--policy", str(latin)])
    assert "is a directory" in refused(jail, ["--policy", str(tmp_path)])
    # control: a policy file that is a pipe (a shell's <(...)) is read
    script = ('j=$1; shift; "$@" --policy <(printf \'jail = "%s"\\n\' "$j") '
              f'-- sh -c "echo ran > {MARKER}"')
    p = subprocess.run(["bash", "-c", script, "bash", str(jail),
                        sys.executable, "-m", "hcp_linux", "run", *EXECUTOR_ARGS],
                       capture_output=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL, cwd="/")
    assert p.returncode == 0 and (jail / MARKER).read_text() == "ran\n", show(p)


@pytest.mark.parametrize("extra, status, fragment", [
    (["--timeout", "nan"], EXIT_REFUSED, "timeout"),
    (["--timeout", "inf"], EXIT_REFUSED, "timeout"),
    (["--timeout", "1e400"], EXIT_REFUSED, "timeout"),
    (["--timeout", "0"], EXIT_REFUSED, "timeout"),
    (["--timeout", "-5"], EXIT_REFUSED, "timeout"),
    (["--timeout", "abc"], EXIT_USAGE, "--timeout"),
    (["--limit", "nproc"], EXIT_REFUSED, "--limit"),
    (["--jail", "relative/dir"], EXIT_REFUSED, "jail"),
], ids=lambda v: str(v)[:30])
def test_bad_cli_values(jail: Path, extra: list, status: int, fragment: str) -> None:
    line = refused(jail, extra, status=status, give_jail=extra[0] != "--jail")
    assert fragment in line, line


def test_good_timeout_runs(jail: Path) -> None:
    runs(jail, ["--timeout", "30"])
    runs(jail, ["--timeout", "0.5e2"])


# --- 3. roots that are kernel interfaces, not directories ---------------------------------

@pytest.fixture
def out(tmp_path: Path) -> Path:
    """A write root the command writes the marker into, whatever its jail."""
    d = tmp_path / "out"
    d.mkdir()
    return d


def _marker_cmd(out: Path) -> tuple:
    return ("sh", "-c", f'echo ran > "{out}/{MARKER}"')


BAD_ROOTS = [
    (["--jail", "/sys"], "under /sys"),
    (["--jail", "/sys/fs/cgroup"], "under /sys"),
    (["--jail", "/proc"], "under /proc"),
    (["--jail", "/proc/self"], "under /proc"),  # resolves to /proc/<pid>
    (["--jail", "/dev"], "under /dev"),
    (["--jail", "/dev/shm"], "under /dev"),
    (["--jail", "/dev/pts"], "under /dev"),
    (["--write-root", "/sys/kernel"], "under /sys"),
    (["--read-only-root", "/proc/sys"], "under /proc"),
    (["--read-only-root", "/"], "proc is mounted inside it at /proc"),  # a recursive bind
]


def _jail_arg(extra: list, jail: Path) -> tuple[Path | None, list]:
    """``run_cli`` puts ``--jail`` first; a case that names its own jail replaces it."""
    if extra[0] == "--jail":
        return None, extra
    return jail, extra


@pytest.mark.parametrize("extra, fragment", BAD_ROOTS, ids=[" ".join(b[0]) for b in BAD_ROOTS])
def test_pseudo_fs_roots_refused(jail: Path, out: Path, extra: list, fragment: str) -> None:
    """Refused for everyone, by path and by file system: as root, a jail of /sys is host
    sysfs opened for writing."""
    marker = out / MARKER
    j, args = _jail_arg(extra, jail)
    before = snapshot(out)
    p = run_cli(j, *_marker_cmd(out), extra=[*args, "--write-root", str(out)])
    assert p.returncode == EXIT_REFUSED, show(p)
    line = single_error_line(p)
    assert fragment in line and "cannot be granted" in line, line
    assert not marker.exists() and snapshot(out) == before, show(p)


def test_symlink_to_sys_refused_as_resolved(tmp_path: Path, out: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to("/sys")
    p = run_cli(link, *_marker_cmd(out), extra=["--write-root", str(out)])
    assert p.returncode == EXIT_REFUSED, show(p)
    line = single_error_line(p)
    assert "jail: /sys cannot be granted: it is under /sys" in line, line
    assert not (out / MARKER).exists()


def test_pseudo_system_root_refused(tmp_path: Path, jail: Path) -> None:
    policy = write_policy(tmp_path, 'system_roots = ["/usr", "/bin", "/lib", "/lib64", "/proc"]\n')
    line = refused(jail, ["--policy", str(policy)])
    assert "system_roots: /proc cannot be granted" in line, line


def test_normal_directory_roots_run(jail: Path, out: Path, tmp_path: Path) -> None:
    """Control: ordinary directories, given directly or through a symlink, are granted."""
    ro = tmp_path / "ro"
    ro.mkdir()
    runs(jail, ["--write-root", str(out), "--read-only-root", str(ro)])
    link = tmp_path / "jail-link"
    link.symlink_to(jail)
    runs(link, [], marker=jail / MARKER)


@pytest.mark.root_only
def test_jail_sys_refused_as_root(out: Path, tmp_path: Path) -> None:
    """The issue's case: as root, ``--jail /sys`` ran with host sysfs writable."""
    assert IS_ROOT
    p = run_cli("/sys", *_marker_cmd(out), extra=["--write-root", str(out)])
    assert p.returncode == EXIT_REFUSED, show(p)
    assert "jail: /sys cannot be granted" in single_error_line(p)
    assert not (out / MARKER).exists()
    # control: a normal directory, same command
    plain = tmp_path / "plain"
    plain.mkdir()
    p = run_cli(plain, *_marker_cmd(out), extra=["--write-root", str(out)])
    assert p.returncode == 0 and (out / MARKER).read_text() == "ran\n", show(p)


def _in_private_mounts(script: str, *args: str) -> subprocess.CompletedProcess:
    """``script`` in a mount namespace of its own (``unshare -m``): what it mounts never
    reaches the host, and is gone when it exits."""
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script,
                           "sh", *args], capture_output=True, timeout=TIMEOUT,
                          stdin=subprocess.DEVNULL, cwd="/")


@pytest.mark.root_only
@pytest.mark.parametrize("fstype", ["sysfs", "proc", "cgroup2", "devtmpfs", "debugfs"])
def test_pseudo_fs_anywhere_refused_by_fs_type(tmp_path: Path, out: Path, fstype: str) -> None:
    """Decided by the file system (statfs f_type; the mount table for devtmpfs), not by the
    name: a sysfs mounted at an ordinary-looking /tmp/... is refused as a jail, and a write
    root that holds one is refused too (its recursive bind would carry it in)."""
    if shutil.which("unshare") is None:
        pytest.skip("util-linux unshare is not installed")
    target = tmp_path / "mnt"
    holder = tmp_path / "holder"
    (holder / "sub").mkdir(parents=True)
    target.mkdir()
    cli = " ".join([sys.executable, "-m", "hcp_linux", "run", *EXECUTOR_ARGS])
    cmd = f'-- sh -c "echo ran > {out}/{MARKER}"'
    script = (f'mount -t {fstype} none "$1" || exit 99; '
              f'{cli} --jail "$1" --write-root {out} {cmd}; echo "jail=$?" >&2; '
              f'mount -t {fstype} none "$2/sub" || exit 99; '
              f'{cli} --jail "$2" --write-root {out} {cmd}; echo "holder=$?" >&2')
    p = _in_private_mounts(script, str(target), str(holder))
    if p.returncode == 99:
        pytest.skip(f"cannot mount {fstype} here: {p.stderr.decode(errors='replace')}")
    lines = p.stderr.decode().splitlines()
    assert lines == [f"error: sandbox: jail: {target} cannot be granted: it is on {fstype}, "
                     f"a kernel pseudo file system", "jail=125",
                     f"error: sandbox: jail: {holder} cannot be granted: {fstype} is mounted "
                     f"inside it at {holder}/sub", "holder=125"], show(p)
    assert not (out / MARKER).exists()


@pytest.mark.root_only
def test_tmpfs_mounted_jail_runs(tmp_path: Path, out: Path) -> None:
    """Control for the test above: the same mount point with a tmpfs (a real file system
    whose f_type devtmpfs shares) is granted."""
    if shutil.which("unshare") is None:
        pytest.skip("util-linux unshare is not installed")
    target = tmp_path / "mnt"
    target.mkdir()
    cli = " ".join([sys.executable, "-m", "hcp_linux", "run", *EXECUTOR_ARGS])
    p = _in_private_mounts(f'mount -t tmpfs none "$1" || exit 99; {cli} --jail "$1" '
                           f'--write-root {out} -- sh -c "echo ran > {out}/{MARKER}"',
                           str(target))
    assert p.returncode == 0, show(p)
    assert (out / MARKER).read_text() == "ran\n"


# --- 4. one line, whatever the value holds ------------------------------------------------

def test_control_characters_are_escaped(tmp_path: Path, jail: Path) -> None:
    """A value with a newline or an escape sequence is shown escaped, on one line."""
    line = refused(jail, ["--limit", "nproc=1\n2"])
    assert "\\n" in line, line
    line = refused(jail, ["--limit", "nofile=\x1b[31m"])
    assert "\\x1b" in line, line
    weird = tmp_path / "a\nb"
    weird.mkdir()  # it exists: refused for its name, not for being missing
    p = run_cli(weird, *WRITE_MARKER)
    assert p.returncode == EXIT_REFUSED
    assert "path contains a control character" in single_error_line(p)
    assert not (weird / MARKER).exists()


class _Hostile:
    def __repr__(self) -> str:
        return "line one\nerror: forged line\x1b[2J"


# --- 5. the Python API: PolicyError with one line, never a deep TypeError ---------------

def _bad_api_cases(jail: Path) -> list:
    j = str(jail)
    return [
        (lambda: Limits(nofile=True), "limits.nofile"),
        (lambda: Limits(nofile=64.0), "limits.nofile"),
        (lambda: Limits(nofile=float("nan")), "limits.nofile"),
        (lambda: Limits(nofile="12abc"), "limits.nofile"),
        (lambda: Limits(nofile=[64]), "limits.nofile"),
        (lambda: Limits(nproc=U64 + 1), "limits.nproc"),
        (lambda: Limits(nproc="9" * 5000), "limits.nproc"),  # int() of 4300+ digits raises
        (lambda: Limits(cpu=math.inf), "limits.cpu"),
        (lambda: Limits(cpu=-1), "limits.cpu"),
        (lambda: Limits(fsize=b"1m"), "limits.fsize"),
        (lambda: Limits(as_=-(1 << 70)), "limits.as"),
        (lambda: Limits(tmp_size=None), "limits.tmp_size"),
        (lambda: Limits(shm_size=U64), "limits.shm_size"),
        (lambda: Limits(cpu_quota=True), "limits.cpu_quota"),
        (lambda: Limits(cpu_quota=10 ** 400), "limits.cpu_quota"),  # beyond a float
        (lambda: Limits(cpu_quota=math.nan), "limits.cpu_quota"),
        (lambda: Limits(output=_Hostile()), "limits.output"),
        (lambda: Limits.from_mapping([("nproc", 1)]), "limits"),
        (lambda: Limits.from_mapping({_Hostile(): 1}), "unknown limit"),
        (lambda: Policy(jail=j, timeout=True), "timeout"),
        (lambda: Policy(jail=j, timeout=math.nan), "timeout"),
        (lambda: Policy(jail=j, timeout=-math.inf), "timeout"),
        (lambda: Policy(jail=j, timeout=10 ** 400), "timeout"),
        (lambda: Policy(jail=j, timeout="1e400"), "timeout"),
        (lambda: Policy(jail=j, timeout=[1]), "timeout"),
        (lambda: Policy(jail=j, write_roots="/tmp"), "write_roots"),
        (lambda: Policy(jail=j, write_roots=b"/tmp"), "write_roots"),
        (lambda: Policy(jail=j, write_roots=[None]), "write_roots"),
        (lambda: Policy(jail=j, read_only_roots=[b"/tmp\0x"]), "read_only_roots"),
        (lambda: Policy(jail=j, read_only_roots=["/tmp/a\nb"]), "read_only_roots"),
        (lambda: Policy(jail=j, read_only_roots=["/" + "x" * 5000]), "read_only_roots"),
        (lambda: Policy(jail=j, system_roots=5), "system_roots"),
        (lambda: Policy(jail=b"/tmp\0"), "jail"),
        (lambda: Policy(jail=f"{j}\n"), "jail"),
        (lambda: Policy(jail=123), "jail"),
        (lambda: Policy(jail=_Hostile()), "jail"),
        (lambda: Policy(jail=j, env={"A": b"x"}), "env"),
        (lambda: Policy(jail=j, env="A=1"), "env"),
        (lambda: Policy(jail=j, env={"A": "x" * (1 << 20)}), "env"),  # > MAX_ARG_STRLEN
        (lambda: Policy(jail=j, network=None), "network"),
        (lambda: Policy(jail=j, network=["none"]), "network"),
        (lambda: Policy(jail=j, on_exit=1), "on_exit"),
        (lambda: Policy(jail=j, sandbox=1), "sandbox"),
        (lambda: Policy(jail=j, allow_degraded="userns"), "allow_degraded"),
        (lambda: Policy(jail=j, allow_bins=["sh", 5]), "allow_bins"),
        (lambda: Policy(jail=j, seccomp_profiles="baseline"), "seccomp_profiles"),
        (lambda: Policy(jail=j, limits=[]), "limits"),
        (lambda: Policy(jail=j, limits={"nproc": [1]}), "limits.nproc"),
        (lambda: Policy(jail=j, limits={"as": "1.5"}), "limits.as"),
        # what the host says about a path: when resolved (Sandbox(policy) resolves)
        (lambda: resolve(Policy(jail=j, network="allow", allow_hosts=["example.com"],
                                proxy_log="/nonexistent-dir/log")), "proxy_log"),
        (lambda: resolve(Policy(jail=j, network="allow", allow_hosts=["example.com"],
                                proxy_log=j)), "proxy_log"),
        (lambda: Sandbox(Policy(jail="/sys")), "jail"),
        (lambda: Policy.from_mapping(["jail"]), "policy"),
    ]


def test_bad_api_values_raise_one_line_policy_error(jail: Path) -> None:
    for i, (make, fragment) in enumerate(_bad_api_cases(jail)):
        with pytest.raises(PolicyError) as info:
            make()
        text = one_line(info.value)
        assert fragment in text, (i, text)
    assert not os.listdir(jail)


def test_good_api_values(jail: Path, tmp_path: Path) -> None:
    """Controls: the nearest valid values, in each accepted spelling, normalised."""
    assert Limits(nofile="64", cpu="2m", as_="1.5g", fsize=" 10MiB ").as_dict() == {
        **Limits().as_dict(), "nofile": 64, "cpu": 120, "as": 3 << 29, "fsize": 10 << 20}
    assert Limits(cpu=CPU_SECONDS_MAX, nproc=PID_MAX_LIMIT - 1, fsize=RLIM_MAX).cpu \
        == CPU_SECONDS_MAX
    assert Limits(nofile="unlimited", output=None).nofile is None
    assert Limits.from_mapping({"as": "1k"}).as_ == 1024
    p = Policy(jail=os.fsencode(jail), timeout="30s", read_only_roots=(os.fsencode(tmp_path),))
    assert p.jail == os.path.realpath(jail) and p.timeout == 30.0
    assert p.read_only_roots == (os.path.realpath(tmp_path),)
    assert Policy(jail=str(jail), timeout=1).timeout == 1.0
    assert Policy(jail=str(jail), env={"A": "x" * 1000}).env["A"] == "x" * 1000
    from hcp_linux import Sandbox
    run = Sandbox(Policy(jail=str(jail), limits={"cpu": "1m", "nofile": "256"})).run(
        list(WRITE_MARKER), timeout=TIMEOUT)
    assert run.returncode == 0 and (jail / MARKER).read_text() == "ran\n"


def test_hostile_repr_is_escaped() -> None:
    with pytest.raises(PolicyError) as info:
        Limits(output=_Hostile())
    text = one_line(info.value)
    assert "\\x0a" in text and "\\x1b" in text, text


# --- 6. packs -----------------------------------------------------------------------------

@pytest.fixture
def pack_cli(tmp_path: Path):
    """``hcp-linux run --pack`` with its own state and temp dirs (cleaned with tmp_path)."""
    for d in ("state", "work"):
        (tmp_path / d).mkdir()
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "XDG_STATE_HOME": str(tmp_path / "state"),
           "TMPDIR": str(tmp_path), "HOME": str(tmp_path)}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "hcp_linux", "run", *EXECUTOR_ARGS, *args],
                              cwd=tmp_path / "work", env=env, capture_output=True,
                              timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    return run


def _pack(root: Path, tool: str | None, link: str | None) -> str:
    """A pack whose ``bin/x`` is ``tool`` (a script) or a symlink to ``link``."""
    (root / "bin").mkdir(parents=True)
    if tool is not None:
        (root / "libexec").mkdir()
        script = root / "libexec" / "x"
        script.write_text(tool)
        script.chmod(0o755)
    if link is not None:
        (root / "bin" / "x").symlink_to(link)
    manifest = root / "pack.toml"
    manifest.write_text('[wrap]\nbin = "bin/x"\n')
    return str(manifest)


def test_pack_bin_symlink_out_of_the_pack_refused(tmp_path: Path, out: Path, pack_cli) -> None:
    """``bin/x -> /bin/sh`` would put a shell on the allow-list under the pack's name."""
    manifest = _pack(tmp_path / "pack", None, "/bin/sh")
    with pytest.raises(PackError) as info:
        load_pack(manifest)
    assert "wrap.bin: 'bin/x' resolves to" in one_line(info.value)
    marker = out / MARKER
    p = pack_cli("--pack", manifest, "--write-root", str(out), "--", "bin/x", "-c",
                 f"echo ran > {marker}")
    assert p.returncode == EXIT_REFUSED, show(p)
    assert "outside the pack root" in single_error_line(p)
    assert not marker.exists()


def test_pack_bin_symlink_inside_the_pack_runs(tmp_path: Path, out: Path, pack_cli) -> None:
    """Control: ``bin/x -> ../libexec/x`` stays inside the pack and runs."""
    manifest = _pack(tmp_path / "pack", '#!/bin/sh\necho ran > "$1"\n', "../libexec/x")
    assert load_pack(manifest).bins == (str(tmp_path / "pack" / "bin" / "x"),)
    marker = out / MARKER
    p = pack_cli("--pack", manifest, "--write-root", str(out), "--", "bin/x", str(marker))
    assert p.returncode == 0, show(p)
    assert marker.read_text() == "ran\n"


def test_pack_root_on_a_pseudo_fs_refused(tmp_path: Path) -> None:
    """The pack root becomes a read-only root of every run: refused when the pack is read,
    before a workspace is made. Control: an ordinary directory."""
    from hcp_linux.policy.pack import Pack
    for root in ("/proc/self", "/sys/kernel", "/dev"):
        with pytest.raises(PackError) as info:
            Pack.from_mapping({"wrap": {"bin": "sh"}}, root=root)
        assert "pack root: " in one_line(info.value) and "cannot be granted" in str(info.value)
    assert Pack.from_mapping({"wrap": {"bin": "sh"}}, root=tmp_path).root == str(tmp_path)


BAD_PACKS = [
    ("pack.toml", "a = " + "[" * 5000 + "]" * 5000 + "\n[wrap]\nbin = \"sh\"\n", "nested deeper"),
    ("pack.toml", "[wrap]\nbin = \"sh\"\n[x]\n" + "a = " + "{ b = " * 40 + "1" + " }" * 40 + "\n",
     "nested deeper"),
    ("pack.json", "[" * 100_000 + "]" * 100_000, "nested deeper"),
    ("pack.json", '{"wrap": {"bin": "sh"}, "x": ' + "1" * 5000 + "}", "malformed JSON"),
    ("pack.json", '{"name": "a\\udc80", "wrap": {"bin": "sh"}}', "name"),
    ("pack.json", '{"name": "a\\nb", "wrap": {"bin": "sh"}}', "name"),
    ("pack.toml", "[wrap]\nbin = \"sh\"\n#" + "x" * MAX_DOCUMENT + "\n", "larger than"),
]


@pytest.mark.parametrize("name, body, fragment", BAD_PACKS,
                         ids=[f"{i}-{b[2]}" for i, b in enumerate(BAD_PACKS)])
def test_bad_pack_manifest(tmp_path: Path, out: Path, pack_cli, name: str, body: str,
                           fragment: str) -> None:
    root = tmp_path / "pack"
    root.mkdir()
    (root / name).write_text(body)
    with pytest.raises(PackError) as info:
        load_pack(root / name)
    assert fragment in one_line(info.value)
    marker = out / MARKER
    p = pack_cli("--pack", str(root / name), "--write-root", str(out), "--", "sh", "-c",
                 f"echo ran > {marker}")
    assert p.returncode == EXIT_REFUSED, show(p)
    assert fragment in single_error_line(p)
    assert not marker.exists()


# --- 7. where the policy meets the plan and the CLI ------------------------------------------

def test_system_roots_without_etc_run(tmp_path: Path, jail: Path) -> None:
    """A stricter view (no /etc) is a valid policy: the masks hide secrets of the view, and
    there is nothing of /etc in it to hide."""
    policy = write_policy(tmp_path, 'system_roots = ["/usr", "/bin", "/lib", "/lib64"]\n')
    runs(jail, ["--policy", str(policy)])


@pytest.mark.parametrize("limit", ["nofile=\u00b2", "nproc=" + "9" * 5000])
def test_limit_text_that_int_refuses(jail: Path, limit: str) -> None:
    assert "limits." in refused(jail, ["--limit", limit])


@pytest.mark.parametrize("name", ["A B", "1X", "X-Y", "é", ""])
def test_env_names_a_shell_cannot_name_are_refused_by_the_api(jail: Path, name: str) -> None:
    """The Python API says what the CLI (--env) and packs (wrap.agent_env) say."""
    with pytest.raises(PolicyError) as e:
        Policy(jail=str(jail), env={name: "1"})
    assert "invalid variable name" in one_line(e.value)
    Policy(jail=str(jail), env={"X_Y1": "1"})  # control: a shell name is taken


def test_a_jail_the_user_cannot_enter_is_refused_naming_it(tmp_path: Path) -> None:
    """Not a `chdir: Permission denied` after the setup: the jail is named, nothing runs."""
    if IS_ROOT:
        pytest.skip("root searches every directory (the nobody leg runs this)")
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "jail").mkdir()
    locked.chmod(0o600)  # its contents cannot be reached: no search permission
    try:
        p = run_cli(locked / "jail", "sh", "-c", f"echo ran > {tmp_path / MARKER}")
    finally:
        locked.chmod(0o700)
    assert p.returncode == EXIT_REFUSED, show(p)
    assert "jail" in single_error_line(p) and b"Traceback" not in p.stderr
    assert not (tmp_path / MARKER).exists()
    # control: the same directory, searchable, runs
    runs(locked / "jail", [])


@pytest.mark.root_only
def test_a_program_cache_in_a_system_dir_creates_nothing_there(jail: Path) -> None:
    """The seccomp cache is best effort: HCP_LINUX_SECCOMP_CACHE=/etc/hcp-linux (as root)
    keeps it in memory rather than making /etc/hcp-linux; XDG_CACHE_HOME=/etc is not read."""
    made = Path("/etc/hcp-linux")
    assert not made.exists(), "left by something else: not this test's to remove"
    try:
        for env in ({"HCP_LINUX_SECCOMP_CACHE": "/etc/hcp-linux"}, {"XDG_CACHE_HOME": "/etc"}):
            p = run_cli(jail, *WRITE_MARKER, env=caller_env(env))
            assert p.returncode == 0, show(p)
            assert not made.exists(), f"a cache directory was made under /etc ({env})"
    finally:
        if made.is_dir() and not made.is_symlink():
            shutil.rmtree(made)
