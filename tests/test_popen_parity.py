"""Sandbox.spawn/run against subprocess.Popen/run: the same calls, through both, compared.

Every parameter of ``subprocess.Popen`` and ``subprocess.run`` (taken from this interpreter's
own signatures, so a parameter a new Python adds fails here until it is classified) is either
honoured, shown by running the same call through subprocess and through the sandbox and
comparing what came out (bytes, str, return codes, exceptions and their fields), or refused
with an error naming it; a refused call is shown to have run nothing, and the same call
through plain subprocess is the control that it would have run. docs/popen.md is the table.

Every run is real: the default policy, a tmp jail, the commands the allow-list lets through.
"""
from __future__ import annotations

import fcntl
import inspect
import io
import os
import pathlib
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from hcp_linux import Policy, PolicyError, Sandbox
from hcp_linux.errors import BinNotFoundError, NotAllowlistedError
from hcp_linux.sandbox import CalledProcessError, TimeoutExpired
from sandboxing import TIMEOUT, jail, pid_alive, processes_with, sleep_token, wait_for  # noqa: F401

PIPE, STDOUT, DEVNULL = subprocess.PIPE, subprocess.STDOUT, subprocess.DEVNULL
#: A script that writes to both streams, interleaved: merged, the order must survive.
BOTH = "echo out1; echo err1 >&2; echo out2; echo err2 >&2; exit 3"


@pytest.fixture
def sb(jail: Path) -> Sandbox:
    return Sandbox(Policy(jail=str(jail)))


def both(sb: Sandbox, jail: Path, args: Any, **kw: Any
         ) -> tuple[subprocess.CompletedProcess, Any]:
    """The same subprocess.run call, unconfined (in the jail, the sandbox's cwd) and
    confined."""
    kw.setdefault("timeout", TIMEOUT)
    plain_cwd = kw.pop("plain_cwd", jail)
    plain = subprocess.run(args, **{**kw, "cwd": plain_cwd})
    return plain, sb.run(args, **kw)


def same(plain: Any, run: Any) -> None:
    assert (run.args, run.returncode, run.stdout, run.stderr) == \
        (plain.args, plain.returncode, plain.stdout, plain.stderr)


# --- the signatures -------------------------------------------------------------------------

POPEN = inspect.signature(subprocess.Popen)
RUN_OWN = [p for p in inspect.signature(subprocess.run).parameters.values()
           if p.kind == p.KEYWORD_ONLY]  # input, capture_output, timeout, check
PARAMETERS = [p for p in POPEN.parameters] + [p.name for p in RUN_OWN]


def test_spawn_has_popens_signature() -> None:
    """Names, order, kinds (positional or keyword-only) and defaults, one by one."""
    ours = list(inspect.signature(Sandbox.spawn).parameters.values())[1:]  # self
    theirs = list(POPEN.parameters.values())
    assert [(p.name, p.kind, p.default) for p in ours] == \
        [(p.name, p.kind, p.default) for p in theirs]


def test_run_has_runs_parameters() -> None:
    """run's own keyword-only parameters with their defaults, and Popen's, nothing else."""
    ours = dict(list(inspect.signature(Sandbox.run).parameters.items())[1:])
    for p in RUN_OWN:
        assert (ours[p.name].kind, ours[p.name].default) == (p.KEYWORD_ONLY, p.default)
    for p in POPEN.parameters.values():
        assert ours[p.name].default == p.default, p.name
    assert set(ours) == set(PARAMETERS)


def test_unknown_keyword_is_a_type_error(sb: Sandbox, jail: Path) -> None:
    for call in (sb.run, sb.spawn, subprocess.run, subprocess.Popen):
        with pytest.raises(TypeError, match="no_such_argument"):
            call(["sh", "-c", "echo ran > ran"], no_such_argument=1)  # type: ignore[operator]
    assert not (jail / "ran").exists()


# --- every parameter: honoured (compared) or refused (named) -------------------------------

def _args(sb: Sandbox, jail: Path, tmp: Path) -> None:
    plain, run = both(sb, jail, ["sh", "-c", BOTH], capture_output=True)
    same(plain, run)
    # bytes and path-like items, as subprocess takes them (os.fsencode)
    plain, run = both(sb, jail, [b"sh", pathlib.PurePosixPath("-c"), "echo $0 $1", "x", b"y"],
                      capture_output=True)
    same(plain, run)
    # a lone str is the program's whole name (no shell): a program of that name
    plain, run = both(sb, jail, "true")
    same(plain, run)
    with pytest.raises(FileNotFoundError) as e:
        subprocess.run("/bin/echo hi", cwd=jail)
    assert e.value.filename == "/bin/echo hi"
    with pytest.raises(BinNotFoundError, match='"/bin/echo hi" not found'):
        sb.run("/bin/echo hi")
    with pytest.raises(IndexError):  # subprocess: an empty argv is an IndexError
        subprocess.run([])
    with pytest.raises(PolicyError, match="args: empty command"):
        sb.run([])
    for bad in ([1], ["sh", None]):  # what os.fsencode refuses: TypeError, both
        with pytest.raises(TypeError):
            subprocess.run(bad)
        with pytest.raises(TypeError, match="expected str, bytes or os.PathLike"):
            sb.run(bad)


def _bufsize(sb: Sandbox, jail: Path, tmp: Path) -> None:
    for bufsize, kind in ((0, io.FileIO), (-1, io.BufferedReader), (4096, io.BufferedReader)):
        with subprocess.Popen(["sh", "-c", "echo hi"], bufsize=bufsize, stdout=PIPE,
                              cwd=jail) as p, \
                sb.spawn(["sh", "-c", "echo hi"], bufsize=bufsize, stdout=PIPE) as q:
            assert type(p.stdout) is type(q.stdout) is kind
            assert p.stdout.read() == q.stdout.read() == b"hi\n"  # type: ignore[union-attr]
    # 1 in text mode: a line-buffered stdin
    with subprocess.Popen(["cat"], bufsize=1, text=True, stdin=PIPE, stdout=DEVNULL) as p, \
            sb.spawn(["cat"], bufsize=1, text=True, stdin=PIPE, stdout=DEVNULL) as q:
        assert p.stdin.line_buffering is q.stdin.line_buffering is True  # type: ignore
    for call in (subprocess.Popen, sb.spawn):
        with pytest.raises(TypeError, match="bufsize must be an integer"):
            call(["true"], bufsize="1")  # type: ignore[operator]


def _executable(sb: Sandbox, jail: Path, tmp: Path) -> None:
    # argv[0] is only the name the program sees; the program is `executable`
    plain, run = both(sb, jail, ["some-name", "-c", 'echo "$0"'], executable="/bin/sh",
                      capture_output=True)
    same(plain, run)
    assert run.stdout == b"some-name\n"
    # the allow-list is asked about the program run, not the name shown
    strict = Sandbox(Policy(jail=str(jail), allow_bins=("true",)))
    with pytest.raises(NotAllowlistedError, match='"/bin/sh" not allowlisted'):
        strict.run(["true", "-c", "echo ran > ran"], executable="/bin/sh")
    assert not (jail / "ran").exists()


def _stdin(sb: Sandbox, jail: Path, tmp: Path) -> None:
    src = tmp / "input.txt"
    src.write_bytes(b"from a file\n")
    with open(src, "rb") as f1, open(src, "rb") as f2:
        plain = subprocess.run(["cat"], stdin=f1, capture_output=True, cwd=jail)
        run = sb.run(["cat"], stdin=f2, capture_output=True)
    same(plain, run)
    with open(src, "rb") as f1, open(src, "rb") as f2:  # a raw fd
        plain = subprocess.run(["cat"], stdin=f1.fileno(), capture_output=True, cwd=jail)
        run = sb.run(["cat"], stdin=f2.fileno(), capture_output=True)
    same(plain, run)
    plain, run = both(sb, jail, ["cat"], stdin=DEVNULL, capture_output=True)
    same(plain, run)
    assert run.stdout == b""
    for call in (subprocess.run, sb.run):
        with pytest.raises(ValueError, match="stdin and input arguments may not both be used"):
            call(["cat"], stdin=DEVNULL, input=b"x")


def _stdout(sb: Sandbox, jail: Path, tmp: Path) -> None:
    outs = []
    for name in ("plain", "run"):
        with open(tmp / name, "wb") as f:
            call = subprocess.run if name == "plain" else sb.run
            kw = {"cwd": jail} if name == "plain" else {}
            call(["sh", "-c", "echo to a file"], stdout=f, timeout=TIMEOUT, **kw)
        outs.append((tmp / name).read_bytes())
    assert outs[0] == outs[1] == b"to a file\n"
    plain, run = both(sb, jail, ["sh", "-c", "echo gone; echo kept >&2"], stdout=DEVNULL,
                      stderr=PIPE)
    same(plain, run)
    assert run.stdout is None and run.stderr == b"kept\n"
    # STDOUT is for stderr only: Popen lets the child fail on fd -2; here it is a ValueError
    with pytest.raises(ValueError, match="stdout=STDOUT"):
        sb.run(["sh", "-c", "echo ran > ran"], stdout=STDOUT)
    assert not (jail / "ran").exists()


def _stderr(sb: Sandbox, jail: Path, tmp: Path) -> None:
    plain, run = both(sb, jail, ["sh", "-c", BOTH], stdout=PIPE, stderr=STDOUT)
    same(plain, run)
    assert run.stdout == b"out1\nerr1\nout2\nerr2\n"  # one pipe: the order as written
    plain, run = both(sb, jail, ["sh", "-c", BOTH], stdout=PIPE, stderr=PIPE)
    same(plain, run)
    # merged into a stdout that is a file, and in text mode
    outs = []
    for name in ("plain", "run"):
        with open(tmp / name, "wb") as f:
            call = subprocess.run if name == "plain" else sb.run
            kw = {"cwd": jail} if name == "plain" else {}
            call(["sh", "-c", BOTH], stdout=f, stderr=STDOUT, timeout=TIMEOUT, **kw)
        outs.append((tmp / name).read_bytes())
    assert outs[0] == outs[1] == b"out1\nerr1\nout2\nerr2\n"
    plain, run = both(sb, jail, ["sh", "-c", BOTH], stdout=PIPE, stderr=STDOUT, text=True)
    same(plain, run)


def _refused(name: str, value: Any, control: Callable[[Path], None] | None = None, *,
             root_control: bool = False) -> Callable[[Sandbox, Path, Path], None]:
    """A parameter the sandbox refuses: PolicyError naming it, before anything ran; the
    same call through subprocess is the control (it runs, and ``control`` checks what it
    did). ``root_control``: only root may make that call at all (setgroups)."""
    def case(sb: Sandbox, jail: Path, tmp: Path) -> None:
        script = ["sh", "-c", "echo ran > ran"]
        for call in (sb.run, sb.spawn):
            with pytest.raises(PolicyError, match=rf"^{name}=.* refused: "):
                call(script, **{name: value})
        assert not (jail / "ran").exists()
        if root_control and os.geteuid() != 0:
            with pytest.raises(PermissionError):  # what subprocess says here, unprivileged
                subprocess.run(script, cwd=jail, timeout=TIMEOUT, **{name: value})
            return
        plain = subprocess.run(script, cwd=jail, timeout=TIMEOUT, **{name: value})
        assert plain.returncode == 0 and (jail / "ran").exists()
        if control is not None:
            control(jail)
    return case


def _close_fds(sb: Sandbox, jail: Path, tmp: Path) -> None:
    r, w = os.pipe()  # inheritable: only close_fds keeps it from the child
    os.set_inheritable(r, True)
    try:
        plain, run = both(sb, jail, ["ls", "/proc/self/fd"], close_fds=True,
                          capture_output=True)
        same(plain, run)
        assert str(r).encode() not in run.stdout.split()
        _refused("close_fds", False)(sb, jail, tmp)
    finally:
        os.close(r)
        os.close(w)


def _pass_fds(sb: Sandbox, jail: Path, tmp: Path) -> None:
    r, w = os.pipe()
    try:
        def passed(jail: Path) -> None:  # the control's child really had the fd
            plain = subprocess.run(["ls", "/proc/self/fd"], pass_fds=(r,), capture_output=True,
                                   timeout=TIMEOUT)
            assert str(r).encode() in plain.stdout.split()
        _refused("pass_fds", (r,), passed)(sb, jail, tmp)
        plain, run = both(sb, jail, ["true"], pass_fds=())
        same(plain, run)
    finally:
        os.close(r)
        os.close(w)


def _shell(sb: Sandbox, jail: Path, tmp: Path) -> None:
    plain, run = both(sb, jail, "echo $((1 + 2)); echo err >&2; exit 4", shell=True,
                      capture_output=True)
    same(plain, run)
    plain, run = both(sb, jail, ['echo "$0" "$1"', "name", "one"], shell=True,
                      capture_output=True)
    same(plain, run)
    # the shell is a program like another: the allow-list decides
    strict = Sandbox(Policy(jail=str(jail), allow_bins=("true",)))
    with pytest.raises(NotAllowlistedError, match='"/bin/sh" not allowlisted'):
        strict.run("echo ran > ran", shell=True)
    assert not (jail / "ran").exists()
    for call in (subprocess.run, sb.run):
        with pytest.raises(TypeError, match="path-like args is not allowed when shell is true"):
            call(pathlib.Path("x"), shell=True)


def _cwd(sb: Sandbox, jail: Path, tmp: Path) -> None:
    (jail / "sub").mkdir()
    # relative: from the jail (the sandbox's working directory; subprocess's is the caller's)
    plain, run = both(sb, jail, ["pwd"], cwd="sub", plain_cwd=jail / "sub", capture_output=True)
    same(plain, run)
    assert run.stdout.decode().strip() == os.path.realpath(jail / "sub")
    assert run.receipt["cwd"] == os.path.realpath(jail / "sub")
    plain, run = both(sb, jail, ["pwd"], plain_cwd=Path("/usr"), cwd=Path("/usr"),
                      capture_output=True)
    same(plain, run)
    # a relative program is found from cwd, as subprocess finds it
    tool = jail / "sub" / "tool"
    tool.write_text("#!/bin/sh\necho tool ran\n")
    tool.chmod(0o755)
    plain, run = both(sb, jail, ["./tool"], cwd="sub", plain_cwd=jail / "sub",
                      capture_output=True)
    same(plain, run)
    # outside the sandbox's view: refused, naming cwd; unconfined, the same place works
    outside = tmp / "outside"
    outside.mkdir()
    with pytest.raises(PolicyError, match="cwd: .* is outside the sandbox's view"):
        sb.run(["sh", "-c", "echo ran > ran"], cwd=outside)
    with pytest.raises(PolicyError, match="cwd: .* is outside the sandbox's view"):
        sb.run(["sh", "-c", "echo ran > ran"], cwd="..")  # the jail's parent
    (jail / "escape").symlink_to(outside)
    with pytest.raises(PolicyError, match="cwd: escape .* is outside the sandbox's view"):
        sb.run(["sh", "-c", "echo ran > ran"], cwd="escape")
    assert not (outside / "ran").exists() and not (jail / "ran").exists()
    assert subprocess.run(["sh", "-c", "echo ran > ran"], cwd=outside).returncode == 0
    assert (outside / "ran").exists()  # control
    with pytest.raises(PolicyError, match="cwd: missing .*is not an existing directory"):
        sb.run(["true"], cwd="missing")
    with pytest.raises(FileNotFoundError):
        subprocess.run(["true"], cwd=jail / "missing")


def _env(sb: Sandbox, jail: Path, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HCP_PARITY_AMBIENT", "from-the-runtime")
    monkeypatch.setenv("LANG", "C.UTF-8")
    script = 'echo "${FOO-unset}|${HCP_PARITY_AMBIENT-unset}|${LANG-unset}"'
    # given: exactly the variables granted reach the command (none of the caller's), as with
    # Popen, where env replaces the environment (the sandbox adds only its own: PATH...)
    plain, run = both(sb, jail, ["sh", "-c", script], env={"FOO": "bar", b"B": b"1"},
                      capture_output=True)
    same(plain, run)
    assert run.stdout == b"bar|unset|unset\n"
    # not given (or os.environ itself, which means the same to subprocess): the allow-list
    # draws locale and terminal variables from os.environ, nothing else (a documented
    # difference: subprocess passes all of os.environ)
    for env in (None, os.environ):
        run = sb.run(["sh", "-c", script], env=env, capture_output=True, timeout=TIMEOUT)
        assert run.stdout == b"unset|unset|C.UTF-8\n"
        plain = subprocess.run(["sh", "-c", script], env=env, capture_output=True, cwd=jail)
        assert plain.stdout == b"unset|from-the-runtime|C.UTF-8\n"  # control
    # a variable that injects code is refused even when granted, naming it; nothing ran
    with pytest.raises(PolicyError, match="LD_PRELOAD"):
        sb.run(["sh", "-c", "echo ran > ran"], env={"LD_PRELOAD": "/nonexistent.so"})
    assert not (jail / "ran").exists()
    for call in (subprocess.run, sb.run):  # a name execve cannot carry: ValueError, both
        with pytest.raises(ValueError):
            call(["true"], env={"A=B": "1"})
        with pytest.raises(TypeError):
            call(["true"], env={"A": 1})


def _text_mode(name: str) -> Callable[[Sandbox, Path, Path], None]:
    def case(sb: Sandbox, jail: Path, tmp: Path) -> None:
        script = r"printf 'a\r\nb\rc\n'; printf 'x\r\n' >&2"
        plain, run = both(sb, jail, ["sh", "-c", script], capture_output=True, **{name: True})
        same(plain, run)
        assert run.stdout == "a\nb\nc\n" and run.stderr == "x\n"  # newlines translated
        plain, run = both(sb, jail, ["cat"], input="é\r\n", capture_output=True,
                          encoding="utf-8", **{name: True})
        same(plain, run)
        with subprocess.Popen(["cat"], stdin=PIPE, stdout=PIPE, cwd=jail, **{name: True}) as p, \
                sb.spawn(["cat"], stdin=PIPE, stdout=PIPE, **{name: True}) as q:
            assert (p.text_mode, q.text_mode) == (True, True)
            assert p.communicate("line\n") == q.communicate("line\n") == ("line\n", None)
        for call in (subprocess.Popen, sb.spawn):
            with pytest.raises(subprocess.SubprocessError, match="Cannot disambiguate"):
                call(["true"], text=True, universal_newlines=False)  # type: ignore[operator]
    return case


def _encoding(sb: Sandbox, jail: Path, tmp: Path) -> None:
    plain, run = both(sb, jail, ["printf", r"\351t\351"], capture_output=True,
                      encoding="latin-1")
    same(plain, run)
    assert run.stdout == "été"
    plain, run = both(sb, jail, ["cat"], input="ünï", capture_output=True, encoding="utf-16")
    same(plain, run)


def _errors(sb: Sandbox, jail: Path, tmp: Path) -> None:
    bad = ["printf", r"ok\377"]
    for errors in ("replace", "surrogateescape", "ignore"):
        plain, run = both(sb, jail, bad, capture_output=True, encoding="utf-8", errors=errors)
        same(plain, run)
    with pytest.raises(UnicodeDecodeError) as e1:
        subprocess.run(bad, capture_output=True, encoding="utf-8", cwd=jail)
    with pytest.raises(UnicodeDecodeError) as e2:
        sb.run(bad, capture_output=True, encoding="utf-8")
    assert (e1.value.object, e1.value.start, e1.value.reason) == \
        (e2.value.object, e2.value.start, e2.value.reason)


def _windows_only(name: str, value: Any) -> Callable[[Sandbox, Path, Path], None]:
    def case(sb: Sandbox, jail: Path, tmp: Path) -> None:
        messages = []
        for call in (subprocess.run, sb.run):
            with pytest.raises(ValueError) as e:
                call(["sh", "-c", "echo ran > ran"], **{name: value})
            messages.append(str(e.value))
        assert messages[0] == messages[1] == f"{name} is only supported on Windows platforms"
        assert not (jail / "ran").exists()
    return case


def _restore_signals(sb: Sandbox, jail: Path, tmp: Path) -> None:
    # this interpreter ignores SIGPIPE and SIGXFSZ; the command gets them at their defaults
    script = ["sh", "-c", "grep -E '^Sig(Ign|Blk)' /proc/self/status"]
    plain, run = both(sb, jail, script, restore_signals=True, capture_output=True)
    same(plain, run)
    ignored = int(run.stdout.split()[3], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1))
    _refused("restore_signals", False)(sb, jail, tmp)


def _start_new_session(sb: Sandbox, jail: Path, tmp: Path) -> None:
    token = sleep_token(30)
    for new in (True, False):
        p = subprocess.Popen(["sleep", token], start_new_session=new, cwd=jail)
        q = sb.spawn(["sleep", token], start_new_session=new)
        try:
            assert (os.getsid(p.pid) == p.pid) is new
            # the sandbox's run always leads a session of its own (setsid, so that no
            # terminal of the caller's can be driven from it): True and False alike
            assert os.getsid(q.pid) == q.pid != os.getsid(0)
        finally:
            p.kill()
            q.kill()
            p.wait()
            q.wait()


def _pipesize(sb: Sandbox, jail: Path, tmp: Path) -> None:
    size = 4 * 65536
    with subprocess.Popen(["cat"], stdin=PIPE, stdout=PIPE, pipesize=size, cwd=jail) as p, \
            sb.spawn(["cat"], stdin=PIPE, stdout=PIPE, pipesize=size) as q:
        for a, b in ((p.stdin, q.stdin), (p.stdout, q.stdout)):
            assert fcntl.fcntl(a, fcntl.F_GETPIPE_SZ) == fcntl.fcntl(b, fcntl.F_GETPIPE_SZ) \
                == size
        assert p.communicate(b"x" * size) == q.communicate(b"x" * size)
    for call in (subprocess.Popen, sb.spawn):
        with pytest.raises(TypeError, match="pipesize must be an integer"):
            call(["true"], pipesize="1")  # type: ignore[operator]


def _umask_control(jail: Path) -> None:
    assert (jail / "ran").stat().st_mode & 0o777 == 0o600


def _input(sb: Sandbox, jail: Path, tmp: Path) -> None:
    data = os.urandom(300_000)  # more than a pipe holds: written while the output is read
    plain, run = both(sb, jail, ["cat"], input=data, capture_output=True)
    same(plain, run)
    plain, run = both(sb, jail, ["cat"], input="text", capture_output=True, text=True)
    same(plain, run)


def _capture_output(sb: Sandbox, jail: Path, tmp: Path) -> None:
    plain, run = both(sb, jail, ["sh", "-c", BOTH], capture_output=True)
    same(plain, run)
    for call in (subprocess.run, sb.run):
        with pytest.raises(ValueError, match="stdout and stderr arguments may not be used "
                                             "with capture_output"):
            call(["true"], capture_output=True, stderr=STDOUT)


def _timeout(sb: Sandbox, jail: Path, tmp: Path) -> None:
    """subprocess raises TimeoutExpired after killing the child. The sandbox kills the whole
    run too, and says so in ``timed_out`` (kept for its callers); with check=True it raises
    what subprocess raises."""
    token = sleep_token(30)
    script = ["sh", "-c", f"echo partial; echo noted >&2; exec sleep {token}"]
    with pytest.raises(subprocess.TimeoutExpired) as e1:
        subprocess.run(script, capture_output=True, timeout=1, cwd=jail)
    with pytest.raises(TimeoutExpired) as e2:
        sb.run(script, capture_output=True, timeout=1, check=True)
    for e in (e1.value, e2.value):
        assert (e.cmd, e.timeout, e.stdout, e.stderr) == \
            (script, 1, b"partial\n", b"noted\n")
    assert e2.value.receipt["end"]["by"] == "timeout"
    assert isinstance(e2.value, subprocess.TimeoutExpired)
    run = sb.run(script, capture_output=True, timeout=1)
    assert (run.timed_out, run.returncode, run.stdout) == (True, -signal.SIGKILL,
                                                           b"partial\n")
    assert processes_with(token) == []  # killed, all three times
    # text mode: the exception's output is bytes, as subprocess's
    with pytest.raises(TimeoutExpired) as e3:
        sb.run(script, capture_output=True, timeout=1, check=True, text=True)
    assert e3.value.stdout == b"partial\n"


def _check(sb: Sandbox, jail: Path, tmp: Path) -> None:
    errors = []
    for call in (subprocess.run, sb.run):
        kw = {"cwd": jail} if call is subprocess.run else {}
        with pytest.raises(subprocess.CalledProcessError) as e:
            call(["sh", "-c", BOTH], capture_output=True, check=True, **kw)
        errors.append(e.value)
    fields = [(e.returncode, e.cmd, e.output, e.stderr, str(e)) for e in errors]
    assert fields[0] == fields[1]
    assert isinstance(errors[1], CalledProcessError) and errors[1].receipt["end"]["by"] == "exit"
    plain, run = both(sb, jail, ["true"], check=True)
    same(plain, run)


#: Every parameter of Popen and run: how it is shown honoured or refused.
CASES: dict[str, Callable[..., None]] = {
    "args": _args,
    "bufsize": _bufsize,
    "executable": _executable,
    "stdin": _stdin,
    "stdout": _stdout,
    "stderr": _stderr,
    "preexec_fn": _refused("preexec_fn", lambda: None),
    "close_fds": _close_fds,
    "shell": _shell,
    "cwd": _cwd,
    "env": _env,
    "universal_newlines": _text_mode("universal_newlines"),
    "startupinfo": _windows_only("startupinfo", object()),
    "creationflags": _windows_only("creationflags", 1),
    "restore_signals": _restore_signals,
    "start_new_session": _start_new_session,
    "pass_fds": _pass_fds,
    "user": _refused("user", os.getuid()),
    "group": _refused("group", os.getgid()),
    "extra_groups": _refused("extra_groups", list(os.getgroups()), root_control=True),
    "encoding": _encoding,
    "errors": _errors,
    "text": _text_mode("text"),
    "umask": _refused("umask", 0o077, _umask_control),
    "pipesize": _pipesize,
    "process_group": _refused("process_group", 0),
    "input": _input,
    "capture_output": _capture_output,
    "timeout": _timeout,
    "check": _check,
}


@pytest.mark.parametrize("name", PARAMETERS)
def test_parameter(name: str, sb: Sandbox, jail: Path, tmp_path: Path,
                   monkeypatch: pytest.MonkeyPatch) -> None:
    case = CASES.get(name)
    assert case is not None, (f"Popen/run parameter {name!r} is not classified: honour it "
                              f"or refuse it (hcp_linux/run/popen.py), add it to docs/popen.md "
                              f"and to CASES here")
    if "monkeypatch" in inspect.signature(case).parameters:
        case(sb, jail, tmp_path, monkeypatch)
    else:
        case(sb, jail, tmp_path)


def test_every_case_is_a_parameter() -> None:
    assert set(CASES) == set(PARAMETERS)


# --- the process object ----------------------------------------------------------------------

def test_args_attribute(sb: Sandbox, jail: Path) -> None:
    for args in ("true", ["true"], ("sh", "-c", "true"), [b"true"]):
        with subprocess.Popen(args, cwd=jail) as p, sb.spawn(args) as q:
            pass
        assert q.args == p.args and q.args is args
        assert sb.run(args).args is args


def test_context_manager_closes_pipes_and_waits(sb: Sandbox, jail: Path) -> None:
    for start in (lambda **kw: subprocess.Popen(cwd=jail, **kw), sb.spawn):
        with start(args=["sh", "-c", "cat > got"], stdin=PIPE,  # type: ignore[operator]
                   stdout=PIPE, stderr=PIPE) as p:
            p.stdin.write(b"buffered")  # held in stdin's buffer until close flushes it
        assert p.stdin.closed and p.stdout.closed and p.stderr.closed
        # the end of the block flushed and closed stdin, then waited: cat saw EOF, exited
        assert p.returncode == 0 and (jail / "got").read_bytes() == b"buffered"
        (jail / "got").unlink()


def test_context_manager_kills_on_keyboard_interrupt(sb: Sandbox) -> None:
    """Popen's child got the terminal's ^C too; the sandbox's, in its own session, did not:
    leaving the block by KeyboardInterrupt kills the run instead of leaving it behind."""
    token = sleep_token(30)
    with pytest.raises(KeyboardInterrupt):
        with sb.spawn(["sleep", token]) as q:
            wait_for(lambda: processes_with(token), "the sleep")
            raise KeyboardInterrupt
    assert q.returncode == -signal.SIGKILL and processes_with(token) == []


def test_wait_and_communicate_time_out_without_killing(sb: Sandbox, jail: Path) -> None:
    token = sleep_token(30)
    script = ["sh", "-c", f"echo early; exec sleep {token}"]
    for start in (lambda a, **kw: subprocess.Popen(a, cwd=jail, **kw), sb.spawn):
        p = start(script, stdout=PIPE)
        try:
            with pytest.raises(subprocess.TimeoutExpired) as e:
                p.communicate(timeout=0.5)
            assert (e.value.cmd, e.value.timeout, e.value.output) == (script, 0.5, b"early\n")
            with pytest.raises(subprocess.TimeoutExpired) as e:
                p.wait(timeout=0.2)
            assert (e.value.cmd, e.value.timeout) == (script, 0.2)
            assert p.poll() is None and pid_alive(p.pid)  # still running: nothing killed
            assert processes_with(token)
        finally:
            p.kill()
        # a second communicate goes on where the first stopped: what was read is kept
        assert p.communicate() == (b"early\n", None) and p.returncode == -signal.SIGKILL


def test_communicate_after_start_refuses_new_input(sb: Sandbox, jail: Path) -> None:
    for start in (lambda a, **kw: subprocess.Popen(a, cwd=jail, **kw), sb.spawn):
        with start(["sh", "-c", "cat; sleep 1"], stdin=PIPE, stdout=PIPE) as p:
            with pytest.raises(subprocess.TimeoutExpired):
                p.communicate(b"x", timeout=0.2)
            with pytest.raises(ValueError, match="Cannot send input after starting"):
                p.communicate(b"more")
            assert p.communicate() == (b"x", None)


def test_text_mode_output_cut_at_the_limit_drops_a_split_character(jail: Path) -> None:
    """limits.output may cut a stream inside a multi-byte character: the partial character
    is dropped, not raised as a decoding error (the cut itself is in ``truncated``)."""
    sb = Sandbox(Policy(jail=str(jail), limits={"output": 3}))
    run = sb.run(["printf", r"a\303\251b"], capture_output=True, text=True, encoding="utf-8")
    assert (run.stdout, run.truncated) == ("aé", frozenset({"stdout"}))
    run = sb.run(["printf", r"ab\303\251"], capture_output=True, text=True, encoding="utf-8")
    assert (run.stdout, run.truncated) == ("ab", frozenset({"stdout"}))
    # control: within the limit, everything, nothing truncated
    run = sb.run(["printf", r"a\303\251"], capture_output=True, text=True, encoding="utf-8")
    assert (run.stdout, run.truncated) == ("aé", frozenset())


def test_failed_run_leaves_no_fd_open(sb: Sandbox) -> None:
    """A run that raises half-way (input that does not encode, output that does not
    decode) still closes its pipes, as subprocess.run's does (control: the same after a run
    that succeeds). Pipes only: the native executor's pool of spares holds sockets and
    pidfds that come and go."""
    def fds() -> list[str]:
        out = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                if os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:"):
                    out.append(fd)
            except OSError:  # the listing's own fd, gone
                pass
        return sorted(out)
    sb.run(["true"], capture_output=True)  # what a first run sets up for good (the pool's)
    before = fds()
    raised = []
    for call in (subprocess.run, sb.run):
        with pytest.raises(UnicodeEncodeError) as e:
            call(["cat"], input="é", capture_output=True, encoding="ascii")
        raised.append(e)  # held, with its traceback (and the frames that made the pipes)
        with pytest.raises(UnicodeDecodeError) as e:
            call(["printf", r"\377"], stdin=PIPE, capture_output=True, encoding="utf-8")
        raised.append(e)
        assert fds() == before, call
    sb.run(["true"], stdin=PIPE, capture_output=True)
    assert fds() == before


def test_refusals_start_nothing(sb: Sandbox, jail: Path, monkeypatch: pytest.MonkeyPatch
                                ) -> None:
    """A refused argument is found before any process is made: the executor is never asked
    to start one (control: an accepted call asks it once), and nothing is written."""
    from hcp_linux.run import executor
    started = []
    spawn = executor.spawn

    def counting(*args: Any, **kw: Any) -> Any:
        started.append(args)
        return spawn(*args, **kw)
    monkeypatch.setattr(executor, "spawn", counting)
    for kw in ({"preexec_fn": print}, {"pass_fds": (0,)}, {"umask": 0}, {"user": 0},
               {"close_fds": False}, {"cwd": "/proc"}, {"env": {"BASH_ENV": "/x"}},
               {"process_group": 0}, {"restore_signals": False}):
        with pytest.raises(PolicyError):
            sb.spawn(["sh", "-c", "echo ran > ran"], **kw)
    assert started == [] and not (jail / "ran").exists()
    assert sb.run(["sh", "-c", "echo ran > ran"]).returncode == 0
    assert len(started) == 1 and (jail / "ran").exists()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
