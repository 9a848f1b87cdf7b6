"""A hidden or read-only path whose file the host replaces during the run (issue: the world
outside one run).

Such a carve-out is a mount over the host's own name (a mask, a read-only bind), and when a
host process unlinks or renames over that name (an editor's save, `git` rewriting a file) the
kernel takes the mount away in every other namespace: the command would then read the hidden
file, or write the read-only one, as the root shows it. The sandbox's init watches its mount
table (POLLPRI on /proc/self/mountinfo) and kills the run the moment a watched path is no
longer a mount point; the receipt's ``end.by`` is ``view-lost`` and the CLI says so in a line.
Between the kernel's detach and the kill the command runs on (the inherent window): the tests
show the run ends at once, not that nothing was read in that window. Protected names are not
watched (their sweep moves aside what replaced them: tests/test_protected.py). Both
executors, every way a run starts, root and nobody.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import sandboxing
from fuzzing import fuzz
from hcp_linux import Policy, Sandbox, SandboxProcess
from sandboxing import TIMEOUT, jail, kill_by_pid, wait_for  # noqa: F401

#: Reads (or writes) the carve-out every 50 ms for ~10 s, then says it ran out: killed, it
#: never does.
_LOOP = ("touch ready; i=0; while [ $i -lt 200 ]; do {act}; sleep 0.05; i=$((i+1)); done; "
         "echo ran-out")
_READ = _LOOP.format(act="cat .env 2>/dev/null")
_WRITE = _LOOP.format(act="echo planted >> .env 2>/dev/null && echo wrote")
_LINE = b"error: sandbox: a hidden or read-only path was replaced on the host during the run"


def _replace(path: Path, text: str) -> None:
    """An editor's save: a new file renamed over the old."""
    new = path.with_name(path.name + ".new")
    new.write_text(text)
    os.replace(new, path)


def _run_replacing(jail: Path, fields: dict, loop: str,
                   replaced: "Path | None") -> "tuple[SandboxProcess, bytes]":
    """``loop`` run through Sandbox.spawn with the policy's ``fields``; once it is ready,
    the file ``replaced`` as an editor saves it (None: left alone, and the loop cut short so
    that it runs out). The run is over, killed (-9) when replaced, else exited 0: the
    process and its output."""
    if replaced is None:
        loop = loop.replace("-lt 200", "-lt 4")
    p = Sandbox(Policy(jail=str(jail), **fields)).spawn(["/bin/sh", "-c", loop],
                                                        stdout=subprocess.PIPE)
    try:
        wait_for(lambda: (jail / "ready").exists(), "the command")
        if replaced is not None:
            _replace(replaced, "SECRET2\n")
        out = p.stdout.read()  # type: ignore[union-attr]
        assert p.wait(TIMEOUT) == (0 if replaced is None else -signal.SIGKILL), out
    finally:
        if p.returncode is None:
            p.kill()
            p.wait()
        p.stdout.close()  # type: ignore[union-attr]
    return p, out


def _carve(jail: Path, kind: str) -> tuple[list[str], dict]:
    (jail / ".env").write_text("SECRET1\n")
    if kind == "hidden":
        return ["--hide-path", str(jail / ".env")], {"hidden_paths": (str(jail / ".env"),)}
    return ["--read-only-path", str(jail / ".env")], {"read_only_paths": (str(jail / ".env"),)}


@pytest.mark.parametrize("kind", ["hidden", "read-only"])
@pytest.mark.parametrize("replaced", [True, False], ids=["replaced", "control"])
def test_the_api_run_ends_when_a_carve_out_loses_its_mount(jail: Path, kind: str,
                                                          replaced: bool) -> None:
    """Sandbox.spawn: replaced, the run is killed (-9) and ``end.by`` says why; control: the
    same run, left alone, runs out its loop (its writes refused, its reads denied)."""
    from hcp_linux.receipt_keys import END_NOTES
    _, fields = _carve(jail, kind)
    p, out = _run_replacing(jail, fields, _READ if kind == "hidden" else _WRITE,
                            jail / ".env" if replaced else None)
    assert str(jail / ".env") in p.receipt["layers"]["mountns"]["watched"]
    if replaced:
        assert b"ran-out" not in out, out
        assert p.receipt["end"] == {"by": "view-lost", "notes": [END_NOTES["view-lost"]]}, p.receipt["end"]
    else:
        assert b"ran-out" in out and b"SECRET" not in out and b"wrote" not in out, out
        assert p.receipt["end"] == {"by": "exit"}
        assert (jail / ".env").read_text() == "SECRET1\n"


@pytest.mark.parametrize("how", ["python", "native", "native served", "python served"])
def test_the_cli_says_the_run_ended_when_a_hidden_file_was_replaced(
        jail: Path, tmp_path: Path, how: str) -> None:
    """Every way `hcp-linux run` starts a run: exit 137, one line, and the receipt (where
    the client writes one) says ``view-lost``. Control: the same command with nothing
    replaced runs out its loop."""
    from test_caller_state import way
    args, _ = _carve(jail, "hidden")
    receipt = tmp_path / "r.json"
    # a receipt sends the native client's run to Python: without one it is the native's
    extra = [] if how.startswith("native") else ["--receipt", str(receipt)]
    with way(how, tmp_path) as (cli, env):
        proc = subprocess.Popen([*cli, "run", *sandboxing.EXECUTOR_ARGS, "--jail", str(jail),
                                 *args, *extra, "--", "/bin/sh", "-c", _READ],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, env=env, cwd="/")
        try:
            wait_for(lambda: (jail / "ready").exists(), "the command")
            _replace(jail / ".env", "SECRET2\n")
            out, err = proc.communicate(timeout=TIMEOUT)
        finally:
            kill_by_pid(proc)
        assert proc.returncode == 128 + signal.SIGKILL, err
        assert b"ran-out" not in out, out
        assert err.count(_LINE) == 1 and err.endswith(b"\n"), err
        if extra:
            assert json.loads(receipt.read_text())["end"]["by"] == "view-lost"
        (jail / "ready").unlink()
        control = subprocess.run([*cli, "run", *sandboxing.EXECUTOR_ARGS, "--jail", str(jail),
                                  *args, "--", "/bin/sh", "-c", _READ.replace("-lt 200", "-lt 2")],
                                 capture_output=True, stdin=subprocess.DEVNULL, env=env,
                                 cwd="/", timeout=TIMEOUT)
    assert control.returncode == 0 and b"ran-out" in control.stdout, sandboxing.show(control)
    assert _LINE not in control.stderr


def test_a_protected_name_replaced_on_the_host_does_not_end_the_run(jail: Path) -> None:
    """Protected names are not watched: the user's own `git config` or editor during an
    agent's run must not kill it; what replaced the name is moved aside after the run
    (tests/test_protected.py). The control, a hidden path replaced the same way, is above."""
    (jail / ".envrc").write_text("user\n")
    p = Sandbox(Policy(jail=str(jail))).spawn(
        ["/bin/sh", "-c", "touch ready; while [ ! -e go ]; do sleep 0.02; done; echo ran"],
        stdout=subprocess.PIPE)
    try:
        wait_for(lambda: (jail / "ready").exists(), "the command")
        _replace(jail / ".envrc", "user, edited\n")
        (jail / "go").touch()
        out = p.stdout.read()  # type: ignore[union-attr]
        assert p.wait(TIMEOUT) == 0 and out == b"ran\n", out
    finally:
        if p.returncode is None:
            p.kill()
            p.wait()
        p.stdout.close()  # type: ignore[union-attr]
    assert p.receipt["end"] == {"by": "exit"}


def test_a_ready_spare_whose_carve_out_lost_its_mount_is_passed_over(
        jail: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ready spare built its view before the plan came; the host replaced the hidden file
    since: the spare's init finds the mask gone before the command exists (step ``watch``),
    and the run is started afresh with a view of the file as it is now, hidden again.
    Control: the run before the replacement took a spare too."""
    from hcp_linux import native
    from test_failure_paths import _native, _ready_spares
    monkeypatch.setattr(native.spares, "SPARE_MAX_AGE", 300.0)
    _, fields = _carve(jail, "hidden")
    sb = Sandbox(Policy(jail=str(jail), **fields), executor=_native())
    try:
        _ready_spares(sb)
        ready = native.stats["ready"]
        assert sb.run(["true"], timeout=TIMEOUT).returncode == 0
        assert native.stats["ready"] == ready + 1  # control: a spare took it
        wait_for(lambda: len(native.spares.idle_pids()) >= native.spares.SPARE_TARGET,
                 "the pool to refill")
        _replace(jail / ".env", "SECRET2\n")
        r = sb.run(["/bin/sh", "-c", "cat .env; echo read"], capture_output=True,
                   timeout=TIMEOUT)
        assert (r.returncode, r.stdout) == (0, b"read\n"), r  # hidden, as the new file is
        assert b"SECRET" not in r.stdout + r.stderr
    finally:
        native.spares.clear()


#: A name with each character mountinfo escapes as \ooo that a policy's path may hold (space,
#: backslash; tab and newline are control characters, refused: hcp_linux.policy.values).
_ODD = "a b\\c d\\.env"


@pytest.mark.parametrize("replaced", [True, False], ids=["replaced", "control"])
def test_a_watched_name_mountinfo_escapes_is_read_back_as_the_kernel_wrote_it(
        jail: Path, replaced: bool) -> None:
    """The init finds a watched path among mountinfo's mount points by undoing the kernel's
    escapes (both executors parse it). Misread, the name is never a mount point: the run is
    refused at step ``watch`` before the command, and a replacement goes unseen. Control:
    left alone, the run ends by exit with the file hidden; replaced, it is killed."""
    (jail / _ODD).write_text("SECRET1\n")
    p, out = _run_replacing(jail, {"hidden_paths": (str(jail / _ODD),)},
                            _LOOP.format(act="cat ./a*.env 2>/dev/null"),
                            jail / _ODD if replaced else None)
    assert b"SECRET" not in out, out
    assert p.receipt["end"]["by"] == ("view-lost" if replaced else "exit"), p.receipt["end"]
    assert (b"ran-out" in out) is not replaced, out


def _mangle(name: bytes) -> bytes:
    """How the kernel writes a mount point into mountinfo (fs/proc_namespace.c: space, tab,
    newline and backslash as \\ooo)."""
    return b"".join(b"\\%03o" % c if c in b" \t\n\\" else bytes([c]) for c in name)


@fuzz()
@given(st.binary(max_size=64))
def test_the_ctypes_inits_unescape_undoes_the_kernels_mangle(name: bytes) -> None:
    """The ctypes init's reading of a mount point is the name the kernel escaped, for every
    name; and no field at all, escaped or not, makes it raise or grow."""
    from hcp_linux.ctypes_executor.child import _unescape
    assert _unescape(_mangle(name)) == name
    assert len(_unescape(name)) <= len(name)
