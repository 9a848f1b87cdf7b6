"""The native executor (hcp-exec): it is what runs when selected, it fails exactly like the ctypes
executor (same steps, errnos and details), it falls back cleanly when absent, and its cost does
not grow with the runtime's RSS.

The rest of the suite runs once per executor (``pytest --executor native|ctypes``); these tests
cover what is specific to the native path. Nothing is mocked below the Python/C boundary: every
test runs real processes.
"""
from __future__ import annotations

import dataclasses
import errno
import os
import re
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from runtime_hooks import put_spare, set_binary
from sandboxing import TIMEOUT, jail  # noqa: F401

from hcp_linux import Policy, Sandbox, native, protocol
from hcp_linux.ctypes_executor import child
from hcp_linux.run import executor
from hcp_linux.errors import ChildSetupError, PolicyError, SandboxError
from hcp_linux.plan.plan import compile_plan
from hcp_linux.policy.policy import LAYERS
from hcp_linux.policy.resolve import resolve

built = pytest.mark.skipif(native.binary() is None,
                           reason="native executor not built (python -m hcp_linux.native.build)")
EXECUTORS = ("native", "ctypes")


def _sleeping(jail: Path, ex: str):
    return Sandbox(Policy(jail=str(jail)), executor=ex).spawn(["sleep", "30"])


def _comm(pid: int) -> str:
    with open(f"/proc/{pid}/comm") as f:
        return f.read().strip()


# --- the C program and the Python side agree -----------------------------------------------


@built
def test_the_binary_was_built_from_protocol_py():
    """hcp-exec prints the steps, flags, message bits and limits it was compiled with: every
    one of them is protocol.py's (the build generates its header from protocol.py)."""
    out = subprocess.run([native.binary(), "--protocol"], capture_output=True, text=True,
                         check=True).stdout
    assert out == protocol.table()
    assert len(protocol.FLAGS) == 19 and f"step {len(protocol.STEPS) - 1} helper\n" in out


def test_the_header_is_generated_and_named_in_the_binary():
    """hcp_exec.c holds no copy of the protocol, and the binary's name changes with the
    header: a binary built against other values is never used."""
    with open(native.SOURCE) as f:
        src = f.read()
    assert '#include "hcp_exec_protocol.h"' in src
    assert not re.search(r"#define (F_|M_|PLAN_|INLINE_MAX|DETAIL_MAX)|enum step \{", src)
    for text in (*protocol.DETAILS.values(), "/proc/self/status lacks"):
        assert text.replace("{}", "") not in src, text  # the details come from protocol.py
    header = protocol.c_header()
    for i, name in enumerate(protocol.STEPS):
        assert f"    S_{name.upper().replace('-', '_')} = {i},\n" in header
    for name, bit in protocol.FLAGS.items():
        assert f"#define F_{name} {bit}u\n" in header
    name = native.artifact_name()
    real = protocol.c_header
    try:
        protocol.c_header = lambda: real().replace("PLAN_VERSION", "PLAN_VERSION_")
        assert native.artifact_name() != name
    finally:
        protocol.c_header = real


def _dump_lines(section: str, layout: tuple, values: dict, label: str = "") -> list[str]:
    """What ``hcp-exec --dump-plan`` prints for ``values``, walked here from the layout
    independently of the C generator and of wire.encode."""
    out = []
    for name, kind in layout:
        value, key = values[name], f"{section} {label}{name}"
        if kind in ("u64", "u32", "u16", "i64", "int"):
            bits = {"u32": 32, "u16": 16}.get(kind, 64)
            value &= (1 << bits) - 1
            if kind in ("i64", "int") and value >> 63:
                value -= 1 << 64
            out.append(f"{key} {value}")
        elif kind == "magic":
            out.append(f"{key} {protocol.PLAN_VERSION << 32 | protocol.PLAN_MAGIC}")
        elif kind in ("str", "bytes"):
            out.append(f"{key} {bytes(value).hex()}")
        elif kind == "view":
            out.append(f"{key} {len(value)}")
            out += _dump_lines("view", protocol.VIEW_LAYOUT, values["_view"])
        elif kind in ("strs", "ports"):
            out.append(f"{key} {len(value)}")
            out += [f"{key} {v.hex() if kind == 'strs' else v}" for v in value]
        elif kind[0] == "list":
            out.append(f"{key} {len(value)}")
            names = [f for f, _ in kind[1]]
            for record in value:
                out += _dump_lines(section, kind[1], dict(zip(names, record)), f"{label}{name}.")
        elif value is not None:
            out += _dump_lines(section, kind[3], value, f"{label}{name}.")
    return out


@built
@pytest.mark.parametrize("case", ["default", "proxy", "userns-only"])
def test_the_plan_layout_round_trips_through_the_c_parser(jail: Path, case: str) -> None:
    """wire.py writes the plan from protocol.PLAN_LAYOUT and hcp-exec reads it with parsers
    generated from it: what hcp-exec read (``--dump-plan``: every field, lists and strings
    included) is what wire.py wrote, field for field, and nothing is left over."""
    import resource

    from hcp_linux.native import wire
    from hcp_linux.proc.hcp_spawn import memfd
    policy, layers = resolve(Policy(jail=str(jail))), frozenset(LAYERS)
    if case == "proxy":
        policy = resolve(Policy(jail=str(jail), network="allow",
                                allow_hosts=("example.com:443",)))
        layers = frozenset(LAYERS) - {"ipcns"}
    elif case == "userns-only":
        layers = frozenset({"userns"})
    plan = compile_plan(policy, ["sh", "-c", "echo 'a b'\n", ""], layers=layers,
                        env={"HCP_TEST": "x=y", "EMPTY": ""})
    plan = dataclasses.replace(plan, rlimits=(*plan.rlimits, (resource.RLIMIT_NOFILE, 1024),
                                              (resource.RLIMIT_CORE, resource.RLIM_INFINITY)))
    ruleset = (plan.landlock.create()
               if plan.landlock is not None and not native.makes_ruleset(plan) else None)
    try:
        fds = protocol.RunFds(9, (3, 4, 5), proxy=6 if plan.proxy else -1, done=7, notify=-1)
        fields = wire.plan_fields(plan, fds, ruleset, True, process=(0o22, 1 << 12, 1 << 9))
        view = wire.view_bytes(plan)
        assert fields["view"] == view
        fields["_view"] = wire.view_fields(plan, *_view_args(plan, view))
        blob = wire.plan_bytes(plan, fds, ruleset, True, process=(0o22, 1 << 12, 1 << 9))
    finally:
        if ruleset is not None:
            ruleset.close()
        plan.close()
    exe = native.binary()
    assert exe is not None
    fd = memfd(blob)
    try:
        out = subprocess.run([exe, "--dump-plan", str(fd)], pass_fds=(fd,),
                             capture_output=True, text=True, timeout=TIMEOUT)
    finally:
        os.close(fd)
    assert out.returncode == 0, out.stderr
    expected = _dump_lines("plan", protocol.PLAN_LAYOUT, fields)
    assert out.stdout.splitlines() == expected
    if case == "proxy":
        assert "view capture_ports 443" in expected and "view landlock.ll_fs" in out.stdout
    if case == "userns-only":
        assert "view landlock" not in out.stdout


def _view_args(plan, view: bytes) -> tuple[int, bytes]:
    """The (flags, seccomp program) view_bytes gave the prepared section: its first field,
    and the plan's program."""
    return (struct.unpack_from("<Q", view)[0],
            plan.seccomp.bpf if plan.seccomp is not None else b"")


def test_the_plan_layout_is_written_whole() -> None:
    """wire.encode refuses a value the layout has no field for, and a field with no value:
    the layout is the whole format, on both sides."""
    from hcp_linux.native import wire
    layout = (("a", "u64"), ("b", "str"))
    parts: list[bytes] = []
    wire.encode(layout, {"a": 1, "b": b"x"}, parts)
    assert b"".join(parts) == struct.pack("<QQ", 1, 2) + b"x\0"
    for values in ({"a": 1}, {"a": 1, "b": b"x", "c": 2}, {"a": 1, "c": 2}):
        with pytest.raises((ValueError, KeyError)):
            wire.encode(layout, values, [])


def test_the_run_fds_are_one_value_on_both_sides() -> None:
    """The run's channels are one value (protocol.RunFds) in Python and one struct, generated
    from it, in C: no fd of the run travels loose, and no count is written by hand."""
    fds = protocol.RunFds(9, (0, 1, 2), done=7)
    assert (fds.err, fds.stdio, fds.proxy, fds.done, fds.notify) == (9, (0, 1, 2), -1, 7, -1)
    assert fds.all() == (9, 0, 1, 2, 7) and protocol.RunFds(*fds.fields()) == fds
    with pytest.raises(AttributeError):
        fds.done = 3  # type: ignore[misc]
    header = protocol.c_header()
    members = "".join(f"    int {name}{'' if n == 1 else f'[{n}]'};\n"
                      for name, n, _ in protocol.RUN_FDS)
    assert "struct run_fds {\n" + members + "};" in header
    assert f"#define RUN_FDS_COUNT {sum(n for _, n, _ in protocol.RUN_FDS)} " in header
    with open(native.SOURCE) as f:
        src = f.read()
    assert "struct run_fds fds;" in src and "fds[MESSAGE_FDS_MAX]" in src
    assert not re.search(r"\b(proxy_fd|done_fd|notify_fd|errfd)\b|int fds\[\d+\]|\[10\]", src)
    # the plan's fields are read by the generated parsers only
    assert not re.search(r"(\bP\.|->)[\w.\[\]]+ = (\([a-z0-9_ *]+\))*get_(u64|str|count|bytes)\(",
                         src)


def test_the_ctypes_executor_reports_only_protocol_steps():
    """Every step name child.py reports is one of protocol.STEPS (an unknown one would be
    reported as "internal")."""
    with open(child.__file__) as f:
        src = f.read()
    used = set(re.findall(r'(?:_step|_StepFailed|_report)\(\s*(?:errfd, )?"([a-z0-9-]+)"', src))
    assert used and used <= set(protocol.STEPS), used - set(protocol.STEPS)


def test_error_records_round_trip():
    record = protocol.encode_error_record("bind-clone", errno.ESTALE, "/x changed")
    assert protocol.decode_error_record(record) == ("bind-clone", errno.ESTALE, "/x changed")
    assert protocol.decode_error_record(b"\xff\xff\x05\x00")[0] == "internal"
    long = protocol.encode_error_record("verify", errno.EPERM, "x" * 1000)
    assert len(long) == protocol.ERROR_RECORD.size + protocol.DETAIL_MAX


def test_c_constants_match_the_python_ones():
    from hcp_linux import _libc as L
    with open(native.SOURCE) as f:
        src = f.read()
    assert f"#define SECURE_ALL_LOCKED_ 0x{L.SECURE_ALL_LOCKED:x} " in src


def test_executor_names_are_checked():
    with pytest.raises(PolicyError):
        Sandbox(Policy(), executor="fastest")
    with pytest.raises(PolicyError):
        native.set_default("fork")
    assert native.get_default() in native.EXECUTORS


# --- it is really what runs ------------------------------------------------------------------


@built
def test_native_executor_is_what_runs(jail: Path) -> None:
    """The monitor is hcp-exec itself (no Python was forked), and it confines."""
    proc = _sleeping(jail, "native")
    try:
        assert _comm(proc.pid).startswith("hcp-exec"), _comm(proc.pid)
        assert os.path.realpath(f"/proc/{proc.pid}/exe") == os.path.realpath(native.binary())
    finally:
        proc.kill()
        proc.wait(TIMEOUT)
    run = Sandbox(Policy(jail=str(jail)), executor="native").run(
        ["sh", "-c", "grep -E '^(NoNewPrivs|Seccomp|CapEff):' /proc/self/status; "
                     "echo x > ../beside 2>/dev/null; cat /proc/1/comm"],
        capture_output=True, timeout=TIMEOUT)
    assert run.returncode == 0, run
    out = run.stdout.decode()
    assert "NoNewPrivs:\t1" in out and "Seccomp:\t2" in out and "CapEff:\t0000000000000000" in out
    assert not (jail.parent / "beside").exists()  # at most in the sandbox's private /tmp
    assert out.splitlines()[-1].startswith("hcp-exec")  # the sandbox's init is hcp-exec too


def test_ctypes_executor_is_what_runs(jail: Path) -> None:
    proc = _sleeping(jail, "ctypes")
    try:
        assert not _comm(proc.pid).startswith("hcp-exec")
        assert os.readlink(f"/proc/{proc.pid}/exe") == os.readlink(f"/proc/{os.getpid()}/exe")
    finally:
        proc.kill()
        proc.wait(TIMEOUT)


@built
def test_cli_takes_a_hidden_executor_flag(jail: Path) -> None:
    base = [sys.executable, "-m", "hcp_linux", "run", "--jail", str(jail)]
    for ex in native.EXECUTORS:
        p = subprocess.run(base + ["--executor", ex, "--", "sh", "-c", "cat /proc/1/comm"],
                           capture_output=True, timeout=TIMEOUT, cwd="/", stdin=subprocess.DEVNULL)
        assert p.returncode == 0, p
        assert p.stdout.decode().startswith("hcp-exec") == (ex != "ctypes"), (ex, p.stdout)
    p = subprocess.run(base + ["--executor", "bogus", "--", "true"], capture_output=True,
                       timeout=TIMEOUT, cwd="/")
    assert p.returncode == 2 and b"error: sandbox:" in p.stderr
    help_text = subprocess.run(base[:4] + ["--help"], capture_output=True, timeout=TIMEOUT).stdout
    assert b"--executor" not in help_text  # hidden


_SIG_SCRIPT = ["grep", "-E", "^Sig(Ign|Blk):", "/proc/self/status"]  # no shell: dash resets the mask


def _sig_bits(status: bytes, field: bytes) -> int:
    return int(status.split(field)[1].split()[0], 16)


@built
def test_the_command_gets_the_same_signal_dispositions(jail: Path) -> None:
    """Ignored and blocked signals reach the command as subprocess gives them: SIGPIPE and
    SIGXFSZ (ignored by Python) back to default, and glibc posix_spawn's internal signals 32
    and 33 ignored only when the runtime ignores them."""
    plain = subprocess.run(_SIG_SCRIPT, capture_output=True, check=True).stdout
    ignored = _sig_bits(plain, b"SigIgn:")
    assert not ignored & (1 << (signal.SIGPIPE - 1) | 1 << (signal.SIGXFSZ - 1)), plain
    for ex in EXECUTORS:
        run = Sandbox(Policy(jail=str(jail)), executor=ex).run(_SIG_SCRIPT, capture_output=True,
                                                              timeout=TIMEOUT)
        assert run.returncode == 0, run
        assert run.stdout == plain, (ex, run.stdout, plain)


@built
def test_dispositions_changed_after_a_spare_was_made_reach_the_command(jail: Path,
                                                                      spares_auto) -> None:
    """A spare is started ahead of time; the command still gets the runtime's ignored signals
    and the spawning thread's mask of the moment of the spawn, like a plain fork."""
    sb = Sandbox(Policy(jail=str(jail)), executor="native")
    for _ in range(3):  # the kind repeats: the keeper makes spares with today's dispositions
        assert sb.run(["true"], timeout=TIMEOUT).returncode == 0
    deadline = time.monotonic() + 10
    while not native.spares.idle_pids() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert native.spares.idle_pids(), "no spare was made"
    hup, usr2 = 1 << (signal.SIGHUP - 1), 1 << (signal.SIGUSR2 - 1)
    old = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR2])
    try:
        plain = subprocess.run(_SIG_SCRIPT, capture_output=True, check=True).stdout
        assert _sig_bits(plain, b"SigIgn:") & hup and _sig_bits(plain, b"SigBlk:") & usr2, plain
        ready = native.stats["ready"]
        run = sb.run(_SIG_SCRIPT, capture_output=True, timeout=TIMEOUT)
        assert native.stats["ready"] == ready + 1  # it was a spare made before the change
        assert (run.returncode, run.stdout) == (0, plain), (run, plain)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGUSR2])
        signal.signal(signal.SIGHUP, old)
    after = sb.run(_SIG_SCRIPT, capture_output=True, timeout=TIMEOUT).stdout
    # back as they were (whatever the suite inherited: nohup ignores SIGHUP): as a plain fork
    restored = subprocess.run(_SIG_SCRIPT, capture_output=True, check=True).stdout
    assert after == restored, (after, restored)
    if old == signal.SIG_DFL:
        assert not _sig_bits(after, b"SigIgn:") & hup
    assert not _sig_bits(after, b"SigBlk:") & usr2


@built
def test_sigpipe_ends_a_confined_writer_as_it_ends_a_plain_one(jail: Path) -> None:
    """`yes | head -1` ends because yes dies of SIGPIPE; ignored, yes would get EPIPE."""
    script = ["bash", "-c", "yes | head -c 2 >/dev/null; echo ${PIPESTATUS[0]}"]
    plain = subprocess.run(script, capture_output=True, check=True).stdout
    assert plain == b"141\n"  # 128 + SIGPIPE
    for ex in EXECUTORS:
        run = Sandbox(Policy(jail=str(jail)), executor=ex).run(script, capture_output=True,
                                                              timeout=TIMEOUT)
        assert (run.returncode, run.stdout) == (0, plain), (ex, run)


# --- same failures, same reports --------------------------------------------------------------


def _plan(jail: Path):
    return compile_plan(resolve(Policy(jail=str(jail))), ["true"], layers=frozenset(LAYERS))


def _failure(plan, ex: str) -> tuple[str, int, str]:
    try:
        proc = executor.spawn(plan, executor=ex)
    except ChildSetupError as e:
        return e.step, e.errno, e.detail
    finally:
        plan.close()
    proc.wait(TIMEOUT)
    raise AssertionError(f"{ex}: the spawn did not fail")


def _swapped_inode(plan):
    b = plan.binds[-1]
    return dataclasses.replace(plan, binds=[*plan.binds[:-1],
                                            dataclasses.replace(b, ino=b.ino + 1)])


def _missing_cwd(plan):
    return dataclasses.replace(plan, cwd=b"/nonexistent-hcp-cwd")


def _missing_exe(plan):
    return dataclasses.replace(plan, exe=b"/nonexistent-hcp-bin")


@built
@pytest.mark.parametrize("mutate, step, err", [
    (_swapped_inode, "bind-clone", errno.ESTALE),
    (_missing_cwd, "chdir", errno.ENOENT),
    (_missing_exe, "execve", errno.ENOENT),
])
def test_failures_are_reported_identically(jail: Path, mutate, step: str, err: int) -> None:
    """A failing step reaches the parent as the same (step, errno, detail) from either
    executor, so the error mapping and the degraded-host logic are shared."""
    seen = {}
    for ex in EXECUTORS:
        seen[ex] = _failure(mutate(_plan(jail)), ex)
    assert seen["native"] == seen["ctypes"], seen
    assert seen["native"][:2] == (step, err), seen


@built
def test_rlimit_failure_is_the_rlimits_step(jail: Path) -> None:
    """The ctypes executor reports this one as "internal" (CPython's resource.setrlimit raises
    ValueError, not OSError, for EPERM/EINVAL); the native one names the step."""
    import resource
    plan = _plan(jail)
    # above fs.nr_open: EPERM
    plan = dataclasses.replace(plan, rlimits=(*plan.rlimits, (resource.RLIMIT_NOFILE, 1 << 40)))
    assert _failure(plan, "native") == ("rlimits", errno.EPERM, str(resource.RLIMIT_NOFILE))


@built
def test_malformed_plan_fails_closed(jail: Path, monkeypatch) -> None:
    good = native.plan_bytes
    monkeypatch.setattr(native, "plan_bytes", lambda *a, **k: good(*a, **k)[:-5])
    step, err, detail = _failure(_plan(jail), "native")
    assert (step, err) == ("internal", errno.EINVAL) and "malformed plan" in detail, detail


# --- absent, broken, or unbuildable: the ctypes executor carries on ---------------------------


def test_fallback_when_not_built(jail: Path, request) -> None:
    set_binary(None)
    request.addfinalizer(set_binary)
    assert native.selected("auto") == "ctypes" and not native.available()
    run = Sandbox(Policy(jail=str(jail)), executor="auto").run(["true"], timeout=TIMEOUT)
    assert run.returncode == 0
    with pytest.raises(SandboxError, match="native executor unavailable"):
        Sandbox(Policy(jail=str(jail)), executor="native").run(["true"], timeout=TIMEOUT)


def test_fallback_when_it_cannot_be_executed(jail: Path, tmp_path: Path, request) -> None:
    """A binary that cannot be executed (a noexec mount, say): auto falls back for good."""
    fake = tmp_path / "hcp-exec-fake"
    fake.write_bytes(b"\0not an executable")
    fake.chmod(0o644)  # EACCES at exec
    set_binary(str(fake))
    request.addfinalizer(set_binary)
    with pytest.raises(SandboxError, match="native executor .*Permission denied"):
        Sandbox(Policy(jail=str(jail)), executor="native").run(["true"], timeout=TIMEOUT)
    assert Sandbox(Policy(jail=str(jail)), executor="auto").run(["true"],
                                                                timeout=TIMEOUT).returncode == 0
    used, why = native.status()
    assert used == "ctypes" and "Permission denied" in why and native.selected("auto") == "ctypes"


def test_build_without_a_compiler_is_not_an_error(monkeypatch, capsys) -> None:
    """A user's build; with CI's HCP_WERROR=1 the same build that makes nothing is an error."""
    from hcp_linux.native import build
    monkeypatch.delenv("HCP_WERROR", raising=False)
    monkeypatch.setattr(build, "compiler", lambda: None)
    monkeypatch.setattr(build, "trusted", lambda path: False)
    assert build.main([]) == 0
    assert "no C compiler" in capsys.readouterr().err
    assert build.main(["--check", "--quiet"]) == 1
    monkeypatch.setenv("HCP_WERROR", "1")
    assert build.main([]) == 1
    assert "HCP_WERROR=1 and nothing was built" in capsys.readouterr().err


def _build_into(tmp_path: Path, monkeypatch, capsys, recipes=None) -> tuple[Path, str]:
    from hcp_linux.native import build
    out = tmp_path / "hcp-exec-test"
    monkeypatch.setattr(build, "BUILD_DIR", str(tmp_path))
    monkeypatch.setattr(build, "artifact_path", lambda: str(out))
    if recipes is not None:
        real = build.recipes
        monkeypatch.setattr(build, "recipes", lambda cc, inc: recipes(cc) + real(cc, inc))
    assert build.build(force=True) == str(out)
    return out, capsys.readouterr().err


def test_build_prefers_musl_and_makes_a_static_binary(tmp_path: Path, monkeypatch,
                                                     capsys) -> None:
    """hcp-exec is linked against musl when musl-gcc is there (no cpuid probing at start-up:
    each spare is one start), and statically either way (no dynamic loader at exec)."""
    import shutil
    out, said = _build_into(tmp_path, monkeypatch, capsys)
    expected = "(musl, static)" if shutil.which("musl-gcc") else "(static)"
    assert said.rstrip().endswith(expected), said
    elf = out.read_bytes()
    assert b"ld-linux" not in elf and b"GLIBC_2." not in elf  # no interpreter, no versioned glibc
    p = subprocess.run([str(out)], capture_output=True, timeout=TIMEOUT)
    assert (p.returncode, p.stderr[:10]) == (2, b"hcp-exec: ")
    if expected == "(musl, static)":  # control: glibc's static build carries glibc's strings
        from hcp_linux.native import build
        which = shutil.which
        monkeypatch.setattr(build.shutil, "which", lambda name: None if name == "musl-gcc"
                            else which(name))
        out, said = _build_into(tmp_path, monkeypatch, capsys)
        assert said.rstrip().endswith("(static)"), said
        assert b"GLIBC" in out.read_bytes()


def test_build_goes_on_to_the_next_recipe(tmp_path: Path, monkeypatch, capsys) -> None:
    """A recipe that fails to compile, or makes a binary that does not answer as hcp-exec
    (here: its entry point aborts), is passed over for the next one."""
    from hcp_linux.native import build
    cc = build.compiler()
    assert cc is not None
    aborts = [cc, "-static", "-Wl,-e,abort"]
    out, said = _build_into(tmp_path, monkeypatch, capsys, recipes=lambda cc: [
        ("broken", [cc, "-include", str(tmp_path / "no-such-header.h")]), ("aborts", aborts)])
    assert said.rstrip().endswith(("(musl, static)", "(static)", "(dynamic)")), said
    p = subprocess.run([str(out)], capture_output=True, timeout=TIMEOUT)
    assert (p.returncode, p.stderr[:10]) == (2, b"hcp-exec: ")
    # control: the "aborts" recipe does compile, and its binary does not answer as hcp-exec
    odd = tmp_path / "aborts"
    build.write_header(str(tmp_path))
    subprocess.run([*aborts, "-iquote", str(tmp_path), "-o", str(odd), build.SOURCE],
                   check=True, capture_output=True)
    assert subprocess.run([str(odd)], capture_output=True, timeout=TIMEOUT).returncode != 2


def test_build_with_no_working_recipe_says_why_and_builds_nothing(tmp_path: Path, monkeypatch,
                                                                 capsys) -> None:
    from hcp_linux.native import build
    out = tmp_path / "hcp-exec-test"
    monkeypatch.setattr(build, "BUILD_DIR", str(tmp_path))
    monkeypatch.setattr(build, "artifact_path", lambda: str(out))
    monkeypatch.setattr(build, "recipes", lambda cc, inc: [
        ("broken", [cc, "-include", str(tmp_path / "no-such-header.h")]),
        ("aborts", [cc, "-static", "-Wl,-e,abort"])])
    assert build.build(force=True) is None
    said = capsys.readouterr().err
    assert "compiling failed; the ctypes executor will be used" in said
    assert "[broken]" in said and "no-such-header.h" in said
    assert "[aborts] the binary did not answer as hcp-exec" in said
    assert not out.exists() and not list(tmp_path.glob(".hcp-exec-*"))  # nothing left behind


def test_untrusted_binary_is_ignored(tmp_path: Path) -> None:
    exe = tmp_path / "hcp-exec"
    exe.write_bytes(b"#!/bin/sh\n")
    exe.chmod(0o777)  # writable by others: never run it
    assert native.untrusted(str(exe))
    exe.chmod(0o755)
    assert native.untrusted(str(exe)) is None


# --- cost independent of the runtime's size; safe with threads --------------------------------


def _vm_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


@built
def test_the_native_executor_never_copies_the_runtime(jail: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Why its cost does not grow with the runtime's RSS (bench/spawn.py measures it): a fork
    copies the runtime's address space (page tables grow with RSS); hcp-exec is posix_spawn()ed
    (vfork + exec), so no process of a native run ever holds the runtime's memory. Nor does
    the ctypes executor's helper, which it starts when the runtime has threads (as this one
    does). Negative control: its fork of the runtime (what it does while the runtime has one
    thread; forced here) maps all of it."""
    from hcp_linux.ctypes_executor import child_main
    ballast = bytearray(b"\x01") * (256 << 20)  # touched: really resident
    sizes = {}
    try:
        for ex in (*EXECUTORS, "ctypes-fork"):
            with monkeypatch.context() as m:
                if ex == "ctypes-fork":
                    m.setattr(child_main, "threads", lambda: 1)
                proc = Sandbox(Policy(jail=str(jail)), executor=ex.split("-")[0]).spawn(
                    ["sleep", "30"])
            try:
                sizes[ex] = _vm_kib(proc.pid, "VmSize"), _vm_kib(proc.pid, "VmRSS")
            finally:
                proc.kill()
                proc.wait(TIMEOUT)
    finally:
        del ballast
    assert sizes["native"][0] < 64 << 10, sizes  # KiB: a small static program, nothing more
    assert sizes["ctypes"][0] < 256 << 10, sizes  # a fresh interpreter, none of the ballast
    assert sizes["ctypes-fork"][0] > 256 << 10, sizes  # control: a fork maps the whole ballast


@built
def test_concurrent_callers(jail: Path) -> None:
    sandbox = Sandbox(Policy(jail=str(jail)), executor="native")
    failures: list[object] = []

    def worker(i: int) -> None:
        for j in range(10):
            run = sandbox.run(["sh", "-c", f"echo {i}-{j}"], capture_output=True, timeout=TIMEOUT)
            if run.returncode != 0 or run.stdout != f"{i}-{j}\n".encode():
                failures.append((i, j, run.returncode, run.stdout, run.stderr))
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert not failures, failures[:3]


@built
def test_no_fd_of_the_runtime_or_the_plan_reaches_the_command(jail: Path) -> None:
    r, w = os.pipe()  # inheritable in the runtime: must still not reach the command
    os.set_inheritable(r, True)
    os.set_inheritable(w, True)
    try:
        run = Sandbox(Policy(jail=str(jail)), executor="native").run(
            ["sh", "-c", "ls /proc/self/fd"], capture_output=True, timeout=TIMEOUT)
    finally:
        os.close(r)
        os.close(w)
    assert run.returncode == 0, run
    assert sorted(run.stdout.split()) == [b"0", b"1", b"2", b"3"], run.stdout  # 3: ls's own


# --- spares: the same run, prepared ahead ---------------------------------------------------

_PROBE = ("umask; id -u; id -g; pwd; ls -a /; ls -a /dev /tmp; cat /proc/self/uid_map; "
          "grep -E '^(NoNewPrivs|Seccomp|Cap(Eff|Prm|Bnd|Amb)):' /proc/self/status; "
          "ls /proc/self/fd; cat /proc/sys/kernel/pid_max; echo $HOME $TMPDIR $PATH; "
          "cut -d' ' -f4- /proc/self/mountinfo; cat /proc/net/dev | cut -d: -f1; "
          "set -- /proc/[0-9]*; echo $#")  # the shell's own glob: no child racing to be seen


def _probe(sandbox: Sandbox) -> tuple[int, bytes, bytes]:
    run = sandbox.run(["sh", "-c", _PROBE], capture_output=True, timeout=TIMEOUT)
    return run.returncode, run.stdout, run.stderr


@pytest.fixture
def spares_auto():
    """Spares on, and a pool with nothing from earlier tests in it."""
    native.set_spares("auto")
    native.spares.clear()
    yield
    native.set_spares("auto")
    native.spares.clear()


@built
def test_a_ready_spare_runs_exactly_like_a_direct_spawn(jail: Path, spares_auto) -> None:
    """The probe's view of the sandbox (mounts, ids, fds, capabilities, env, umask...) is the
    same through hcp-exec with the plan on its command line, a spare started on the spot,
    and a ready spare whose namespaces and mount view were built before the plan existed."""
    sandbox = Sandbox(Policy(jail=str(jail)), executor="native")
    native.set_spares("never")
    direct = _probe(sandbox)
    assert direct[0] == 0, direct
    native.set_spares("auto")
    before = dict(native.stats)
    results = []
    for _ in range(6):
        results.append(_probe(sandbox))
        time.sleep(0.05)  # let the keeper have one ready
    assert native.stats["on_the_spot"] > before["on_the_spot"]
    assert native.stats["ready"] > before["ready"], native.stats
    for r in results:
        assert r == direct


@built
def test_a_ready_spare_takes_the_umask_of_the_moment(jail: Path, spares_auto) -> None:
    sandbox = Sandbox(Policy(jail=str(jail)), executor="native")
    for _ in range(4):
        sandbox.run(["true"], timeout=TIMEOUT)
    time.sleep(0.1)
    ready = native.stats["ready"]
    old = os.umask(0o077)
    try:
        run = sandbox.run(["sh", "-c", "umask"], capture_output=True, timeout=TIMEOUT)
    finally:
        os.umask(old)
    assert native.stats["ready"] == ready + 1  # it was a spare made under the old umask
    assert run.stdout == b"0077\n", run


def _memfds_made(monkeypatch) -> list[int]:
    """Sizes of the plans (not view templates) put in a memfd, from now on."""
    sizes: list[int] = []
    real = native.spares.memfd
    magic = struct.pack("<Q", protocol.PLAN_VERSION << 32 | protocol.PLAN_MAGIC)

    def counting(blob: bytes) -> int:
        if blob.startswith(magic):
            sizes.append(len(blob))
        return real(blob)
    monkeypatch.setattr(native.spares, "memfd", counting)
    return sizes


@built
@pytest.mark.parametrize("size,in_memfd", [(100, 0), (100 << 10, 1)])  # an argument: ≤ 128 KiB
def test_a_plan_reaches_a_spare_in_the_message_or_in_a_memfd(jail: Path, spares_auto,
                                                            monkeypatch, size: int,
                                                            in_memfd: int) -> None:
    """A plan up to INLINE_MAX travels in the hand-over message; a larger one (here a 100 KiB
    argument) in a memfd. Either way the command gets every byte of its argv."""
    sandbox = Sandbox(Policy(jail=str(jail)), executor="native")
    memfds = _memfds_made(monkeypatch)
    arg = "x" * size
    before = native.stats["ready"] + native.stats["on_the_spot"]
    run = sandbox.run(["sh", "-c", 'printf %s "$1" | wc -c', "sh", arg], capture_output=True,
                      timeout=TIMEOUT)
    assert run.returncode == 0 and int(run.stdout) == size, run
    assert native.stats["ready"] + native.stats["on_the_spot"] == before + 1  # a spare took it
    assert len(memfds) == in_memfd, memfds


@built
def test_a_plan_goes_in_a_memfd_when_the_send_buffer_is_small(jail: Path, spares_auto,
                                                             monkeypatch) -> None:
    """A socket whose send buffer cannot hold the plan refuses the message (EMSGSIZE, nothing
    sent): the plan goes in a memfd instead and the run is the same. Control: the same
    plan through a spare with the default buffer goes in the message."""
    import socket
    sandbox = Sandbox(Policy(jail=str(jail)), executor="native")
    argv = ["sh", "-c", 'printf %s "$1" | wc -c', "sh", "y" * (20 << 10)]
    memfds = _memfds_made(monkeypatch)
    assert sandbox.run(argv, capture_output=True, timeout=TIMEOUT).stdout == b"20480\n"
    assert memfds == []  # control: in the message
    real = native.spares.make

    def small_buffer(kind, sigmask=None):
        spare = real(kind, sigmask)
        spare.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        return spare
    monkeypatch.setattr(native.spares, "make", small_buffer)
    native.spares.clear()
    run = sandbox.run(argv, capture_output=True, timeout=TIMEOUT)
    assert run.returncode == 0 and run.stdout == b"20480\n", run
    assert len(memfds) == 1 and memfds[0] > 20 << 10, memfds


@built
@pytest.mark.parametrize("payload", [b"", b"\0" * 8])
def test_a_spare_refuses_a_malformed_inline_plan(jail: Path, spares_auto, payload: bytes
                                                ) -> None:
    """A hand-over that says the plan is in the message but brings none (or a truncated one)
    is refused on the error pipe (EPROTO / EINVAL), and nothing runs. Control: the same
    spare kind with a real plan runs."""
    import array
    import socket
    plan = _plan(jail)
    key = native.spares.spare_key(plan, native.binary())
    assert _failure_free(plan)  # control
    spare = native.spares.make(key + (None,))
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    try:
        header = struct.pack("<Q", protocol.PLAN_VERSION << 32 | protocol.PLAN_MAGIC)
        spare.sock.sendmsg([header, struct.pack("<Q", protocol.MESSAGE_BITS["INLINE"]), payload],
                           [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                             array.array("i", [err_w, 0, 1, 2]))])
        spare.sock.close()
        os.close(err_w)
        err_w = -1
        with os.fdopen(err_r, "rb") as f:
            record = f.read()
        err_r = -1
        _, status = os.waitpid(spare.pid, 0)
    finally:
        for fd in (err_r, err_w):
            if fd >= 0:
                os.close(fd)
    step, err, _ = protocol.decode_error_record(record)
    assert step == "internal" and err in (errno.EPROTO, errno.EINVAL), record
    assert os.WEXITSTATUS(status) == 125


def _failure_free(plan) -> bool:
    try:
        proc = executor.spawn(plan, executor="native")
        return proc.wait(TIMEOUT) == 0
    finally:
        plan.close()


def _inject(plan, spare) -> None:
    """Put ``spare`` where the pool will hand it to ``plan``, first in line. Its kind is
    marked wanted: the keeper (alive since an earlier test) retires idle spares of kinds
    nobody wants, and could take this one away before the spawn."""
    key = native.spares.spare_key(plan, native.binary())
    kind = key + (native.view_bytes(plan),)
    put_spare(native.spares.pool(), kind, spare)


@built
def test_a_spare_refuses_a_plan_it_was_not_prepared_for(jail: Path, tmp_path: Path,
                                                       spares_auto) -> None:
    other = tmp_path / "other"
    other.mkdir()
    prepared = _plan(other)
    spare = native.spares.make(native.spares.spare_key(prepared, native.binary())
                               + (native.view_bytes(prepared),))
    prepared.close()
    plan = _plan(jail)
    _inject(plan, spare)  # a lie: the pool thinks it was made for this plan's view
    step, err, detail = _failure(plan, "native")
    assert (step, err) == ("internal", errno.EPROTO) and "another plan" in detail, detail


@built
def test_a_spare_reports_a_step_that_failed_before_the_plan_came(jail: Path,
                                                                spares_auto) -> None:
    """A view built ahead of time from a template whose inode is stale fails at bind-clone;
    the spare says so on the error pipe of the run it is given, like a direct spawn would."""
    plan = _swapped_inode(_plan(jail))
    src = plan.binds[-1].source.decode()
    spare = native.spares.make(native.spares.spare_key(plan, native.binary())
                               + (native.view_bytes(plan),))
    _inject(plan, spare)
    step, err, detail = _failure(plan, "native")
    assert (step, err, detail) == ("bind-clone", errno.ESTALE, f"{src} changed since it was checked")


@built
def test_an_idle_spare_holds_no_fd_of_the_runtime(jail: Path) -> None:
    r, w = os.pipe()
    os.set_inheritable(w, True)  # a pipe whose reader waits for EOF
    plan = _plan(jail)
    try:
        spare = native.spares.make(native.spares.spare_key(plan, native.binary()) + (None,))
    finally:
        os.close(w)
        plan.close()
    try:
        time.sleep(0.1)
        ours = f"pipe:[{os.fstat(r).st_ino}]"
        with open(f"/proc/{spare.pid}/task/{spare.pid}/children") as f:
            pid1 = [int(c) for c in f.read().split()]
        assert pid1, "the spare has no init yet"
        for pid in [spare.pid] + pid1:
            targets = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
            assert ours not in targets, targets
        os.set_blocking(r, False)
        assert os.read(r, 1) == b""  # EOF: nobody else holds the write end
    finally:
        os.close(r)
        native.spares.retire(spare)


def _status_fields(pid: int, *names: str) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    return {n: fields[n].strip() for n in names}


def _init_of(spare) -> int:
    """The spare's pid 1 once it waits for a plan (its setup done)."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        with open(f"/proc/{spare.pid}/task/{spare.pid}/children") as f:
            children = [int(c) for c in f.read().split()]
        if children:
            with open(f"/proc/{children[0]}/wchan") as f:
                wchan = f.read()  # blocked in recvmsg: __skb_wait_for_more_packets
            if "skb" in wchan or "recv" in wchan:
                return children[0]
        time.sleep(0.01)
    raise AssertionError("the spare never came to wait for a plan")


@built
def test_a_prepared_spare_waits_already_confined(jail: Path) -> None:
    """Given a template, a spare sets no_new_privs, drops every capability and loads the
    seccomp program before any plan comes; a spare without one (namespaces only) holds its
    capabilities until the plan comes, as the control shows."""
    plan = _plan(jail)
    try:
        key = native.spares.spare_key(plan, native.binary())
        prepared = native.spares.make(key + (native.view_bytes(plan),))
        bare = native.spares.make(key + (None,))
    finally:
        plan.close()
    try:
        fields = ("NoNewPrivs", "Seccomp", "CapEff", "CapBnd")
        early = _status_fields(_init_of(prepared), *fields)
        late = _status_fields(_init_of(bare), *fields)
        assert early == {"NoNewPrivs": "1", "Seccomp": "2", "CapEff": "0" * 16,
                         "CapBnd": "0" * 16}, early
        assert late["NoNewPrivs"] == "0" and late["Seccomp"] == "0", late
        assert late["CapEff"] != "0" * 16, late
    finally:
        native.spares.retire(prepared)
        native.spares.retire(bare)


def _through_prepared_spare(jail: Path, policy: Policy, layers: frozenset[str],
                            argv: list[str]) -> tuple[int, bytes]:
    """Run ``argv`` through a spare prepared (view, Landlock, seccomp...) for its plan."""
    plan = compile_plan(resolve(policy), argv, layers=layers)
    try:
        spare = native.spares.make(native.spares.spare_key(plan, native.binary())
                                   + (native.view_bytes(plan),))
        _inject(plan, spare)
        ready = native.stats["ready"]
        proc = executor.spawn(plan, stdout=executor.DEVNULL, stderr=executor.PIPE,
                              executor="native")
        assert native.stats["ready"] == ready + 1  # that very spare took it
    finally:
        plan.close()
    _, err = proc.communicate(timeout=TIMEOUT)
    return proc.returncode, err


@built
def test_landlock_made_by_a_prepared_spare_confines_the_command(jail: Path,
                                                                spares_auto) -> None:
    """A prepared spare makes the Landlock ruleset and restricts itself before the plan comes;
    the command it then runs cannot read the canary file in the sandbox's root, which only
    Landlock denies (no rule grants it; nothing else stops a read of an empty file in a
    tmpfs). Control: the same file through a prepared spare of a plan without Landlock."""
    argv = ["cat", "/.hcp-canary"]
    rc, err = _through_prepared_spare(jail, Policy(jail=str(jail)), frozenset(LAYERS), argv)
    assert rc == 1 and b"Permission denied" in err, (rc, err)
    rc, err = _through_prepared_spare(
        jail, Policy(jail=str(jail), allow_degraded=("landlock",)),
        frozenset(LAYERS) - {"landlock"}, argv)
    assert (rc, err) == (0, b""), (rc, err)


@built
def test_a_spare_refuses_a_plan_with_another_seccomp_program(jail: Path, spares_auto) -> None:
    """Same view, another seccomp program: the spare loaded its own before the plan came, so
    the prepared section differs and the plan is refused, not run under the wrong filter."""
    plan = compile_plan(resolve(Policy(jail=str(jail), seccomp_profiles=("baseline",))), ["true"],
                        layers=frozenset(LAYERS))
    spare = native.spares.make(native.spares.spare_key(plan, native.binary())
                               + (native.view_bytes(plan),))
    plan.close()
    plan = _plan(jail)  # baseline + socket-families
    _inject(plan, spare)  # a lie: the pool thinks it was made for this plan
    step, err, detail = _failure(plan, "native")
    assert (step, err) == ("internal", errno.EPROTO) and "another plan" in detail, detail


@built
def test_idle_spares_are_replaced_when_stale(jail: Path, spares_auto, monkeypatch) -> None:
    monkeypatch.setattr(native.spares, "SPARE_MAX_AGE", 0.3)
    sandbox = Sandbox(Policy(jail=str(jail)), executor="native")
    for _ in range(3):
        sandbox.run(["true"], timeout=TIMEOUT)
    time.sleep(0.2)

    def idle() -> set[int]:
        return set(native.spares.idle_pids())
    first = idle()
    assert first
    time.sleep(1.0)
    assert first.isdisjoint(idle()), "stale spares were kept"
    for pid in first:  # retired and reaped by the keeper
        assert not os.path.exists(f"/proc/{pid}")


def test_a_forked_runtime_starts_its_own_pool() -> None:
    parent_pool = native.spares.pool()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            pool = native.spares.pool()
            ok = pool is not parent_pool and not pool.idle_pids()
            os.write(w, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(w)
    try:
        assert os.read(r, 1) == b"1"
    finally:
        os.close(r)
        os.waitpid(pid, 0)


@built
def test_spares_die_with_the_runtime(jail: Path) -> None:
    code = ("import sys, time, os\n"
            "from hcp_linux import Policy, Sandbox, native\n"
            "sb = Sandbox(Policy(jail=sys.argv[1]), executor='native')\n"
            "for _ in range(3): sb.run(['true'])\n"
            "time.sleep(0.3)\n"
            "print(' '.join(map(str, native.spares.idle_pids())), flush=True)\n"
            "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(jail)], stdout=subprocess.PIPE,
                            cwd="/")
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert pids, "no spare was made"
        kids = []
        for pid in pids:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                kids += [int(c) for c in f.read().split()]
    finally:
        proc.kill()
        proc.wait(TIMEOUT)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in pids + kids):
        time.sleep(0.05)
    alive = [p for p in pids + kids if os.path.exists(f"/proc/{p}")
             and open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"]
    assert not alive, alive


@built
@pytest.mark.parametrize("ex", EXECUTORS)
def test_a_receipt_that_fails_after_the_hand_over_leaves_no_run(jail: Path, ex: str,
                                                                 monkeypatch) -> None:
    """The receipt is made while the child sets up (off the critical path); should making it
    fail, the spawn raises and the run it started is killed and reaped before it returns.
    Control: the same spawn with the receipt intact runs the command."""
    from sandboxing import processes_with, sleep_token, wait_for
    from hcp_linux import sandbox as sandbox_module

    token = sleep_token(30)
    proc = Sandbox(Policy(jail=str(jail)), executor=ex).spawn(["sleep", token])
    try:
        wait_for(lambda: processes_with(token), "the control's command")
    finally:
        proc.kill()
        proc.wait(TIMEOUT)
    wait_for(lambda: not processes_with(token), "the control's end")

    def broken(*args, **kwargs):
        raise RuntimeError("receipt broke")

    monkeypatch.setattr(sandbox_module, "build_receipt", broken)
    token = sleep_token(30)
    with pytest.raises(RuntimeError, match="receipt broke"):
        Sandbox(Policy(jail=str(jail)), executor=ex).spawn(["sleep", token])
    assert processes_with(token) == []  # killed and reaped before spawn raised
    time.sleep(0.5)  # a run left going would have exec'd by now
    assert processes_with(token) == []
