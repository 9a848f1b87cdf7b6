"""`hcp-linux run` as a user meets it: exit statuses, the allow-list (HCP §10.2.1/10.5),
refused environment variables, the receipt, bad input, native-local and TTYs (issue 3).

Every refusal is checked to be one ``error: sandbox: ...`` line with the documented exit
status, and to have run and written nothing (a marker the command would create is absent,
the receipt file is absent, the jail is unchanged).
"""
from __future__ import annotations

import json
import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sandboxing import (EXECUTOR_ARGS, EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND,  # noqa: F401
                        EXIT_REFUSED, EXIT_USAGE, IS_ROOT, TIMEOUT, assert_ok, err, hcp_argv, imported_by_run,
                        jail, out, read_receipt,
                        run_cli, sh, show, single_error_line, snapshot)

SECRET = "hcp-test-secret-c41d2e"


def test_a_default_run_imports_nothing_it_does_not_use(jail: Path) -> None:
    """Issue 35: every `hcp-linux run` pays for what it imports before the command starts.
    A default run parses no size or duration (fractions, decimal), hashes with the
    interpreter's own SHA-256 (not OpenSSL's, through hashlib), and needs neither the probe,
    the driver nor the egress proxy (tomllib is not listed: a cold seccomp cache compiles
    the profiles, which are TOML). Modules, not milliseconds: a test never times."""
    done, imported = imported_by_run(jail, "true")
    assert done.returncode == 0, show(done)
    assert "hcp_linux.sandbox" in imported, imported  # it ran in-process, as meant
    unused = {"fractions", "decimal", "hashlib", "_hashlib", "hcp_linux.probe",
              "hcp_linux.driver", "hcp_linux.egress"}
    assert not unused & set(imported), sorted(unused & set(imported))

# --- 15. exit statuses and the allow-list ------------------------------------------------


def test_exit_status_is_the_childs(jail: Path) -> None:
    assert run_cli(jail, "sh", "-c", "exit 7").returncode == 7
    assert run_cli(jail, "sh", "-c", "exit 0").returncode == 0
    assert run_cli(jail, "false").returncode == 1


@pytest.mark.parametrize("cmd, sig", [
    # A self-inflicted signal: the sandbox's pid 1 would be shielded from it by the kernel,
    # so the command must not be pid 1.
    pytest.param(["sh", "-c", "kill -TERM $$"], signal.SIGTERM, id="sh-kill-TERM-self"),
    pytest.param(["sh", "-c", "kill -KILL $$"], signal.SIGKILL, id="sh-kill-KILL-self"),
    pytest.param(["python3", "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"],
                 signal.SIGTERM, id="python-kill-TERM-self"),
    pytest.param(["python3", "-c", "import os; os.abort()"], signal.SIGABRT, id="abort"),
    pytest.param(["python3", "-c", "import ctypes; ctypes.string_at(0)"], signal.SIGSEGV,
                 id="segfault"),
])
def test_exit_status_of_a_signal(jail: Path, cmd: list[str], sig: int) -> None:
    c = subprocess.run(["sh", "-c", '"$@"; echo status=$?', "sh", *cmd], capture_output=True,
                       timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    assert f"status={128 + sig}" in c.stdout.decode(), c  # control: unconfined
    p = run_cli(jail, *cmd)
    assert p.returncode == 128 + sig, show(p)


def test_signal_status_python_api(jail: Path) -> None:
    from hcp_linux import Policy, Sandbox
    r = Sandbox(Policy(jail=str(jail))).run(
        ["python3", "-c", "import ctypes; ctypes.string_at(0)"], capture_output=True,
        timeout=TIMEOUT)
    assert r.returncode == -signal.SIGSEGV, r


def test_bin_not_allowlisted(jail: Path) -> None:
    p = run_cli(jail, "ls", extra=["--allow-bin", "true"])
    assert p.returncode == EXIT_NOT_FOUND
    assert p.stderr == b'error: sandbox: bin "ls" not allowlisted\n', show(p)
    assert p.stdout == b""
    p = run_cli(jail, "/usr/bin/false", extra=["--allow-bin", "true"])
    assert p.returncode == EXIT_NOT_FOUND
    assert p.stderr == b'error: sandbox: bin "/usr/bin/false" not allowlisted\n', show(p)


def test_bin_not_allowlisted_python_api(jail: Path) -> None:
    from hcp_linux import NotAllowlistedError, Policy, Sandbox
    with pytest.raises(NotAllowlistedError) as ei:
        Sandbox(Policy(jail=str(jail), allow_bins=("true",))).run(["ls"])
    assert str(ei.value) == 'bin "ls" not allowlisted' and ei.value.exit_code == 127


@pytest.fixture
def evil_on_path(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An executable named `evil` on the caller's PATH only; running it creates a marker."""
    bindir = tmp_path / "callerbin"
    bindir.mkdir()
    marker = tmp_path / "evil-ran"
    evil = bindir / "evil"
    evil.write_text(f"#!/bin/sh\necho ran > {marker}\n")
    evil.chmod(0o755)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    return env, marker


def test_unlisted_bare_name_never_resolved_via_path(jail: Path, evil_on_path) -> None:
    env, marker = evil_on_path
    p = run_cli(jail, "evil", extra=["--allow-bin", "true"], env=env)
    assert p.returncode == EXIT_NOT_FOUND
    assert p.stderr == b'error: sandbox: bin "evil" not allowlisted\n', show(p)
    assert not marker.exists()
    # control: the caller's PATH really does resolve it
    assert_ok(sh("evil", env=env))
    assert marker.exists()


def test_listed_bare_name_resolves_on_sandbox_path_only(jail: Path, evil_on_path) -> None:
    env, marker = evil_on_path
    for extra in (["--allow-bin", "evil"], []):
        p = run_cli(jail, "evil", extra=extra, env=env)
        assert p.returncode == EXIT_NOT_FOUND, show(p)
        single_error_line(p)
        assert "not found" in err(p)
        assert not marker.exists()


def test_allowlist_matching(jail: Path) -> None:
    # a listed absolute path works
    assert_ok(run_cli(jail, "/usr/bin/true", extra=["--allow-bin", "/usr/bin/true"]))
    # a bare entry matches a path ending in /<name>
    assert_ok(run_cli(jail, "/usr/bin/true", extra=["--allow-bin", "true"]))
    # a listed bare name resolves on the sandbox PATH
    p = run_cli(jail, "echo", "hi", extra=["--allow-bin", "echo", "--allow-bin", "true"])
    assert_ok(p)
    assert out(p) == "hi\n"
    # without --allow-bin, the command itself is the allow-list
    assert_ok(run_cli(jail, "true"))
    # a binary in the jail, listed by its absolute path
    shutil.copy2("/bin/echo", jail / "myecho")
    p = run_cli(jail, str(jail / "myecho"), "from-jail", extra=["--allow-bin", str(jail / "myecho")])
    assert_ok(p)
    assert out(p) == "from-jail\n"


def test_bin_not_executable(jail: Path, tmp_path: Path) -> None:
    script = jail / "script.sh"
    script.write_text(f"#!/bin/sh\necho ran > {tmp_path}/ran\n")
    script.chmod(0o644)
    p = run_cli(jail, str(script), extra=["--allow-bin", str(script)])
    assert p.returncode == EXIT_NOT_EXECUTABLE, show(p)
    assert script.name in single_error_line(p)
    (jail / "adir").mkdir()
    p = run_cli(jail, str(jail / "adir"), extra=["--allow-bin", str(jail / "adir")])
    assert p.returncode == EXIT_NOT_EXECUTABLE, show(p)
    single_error_line(p)
    assert not (tmp_path / "ran").exists()


def test_bin_with_exec_format_error_is_126(jail: Path) -> None:
    bad = jail / "garbage"
    bad.write_bytes(b"\x00\x01\x02 not an executable\n")
    bad.chmod(0o755)
    c = subprocess.run(["sh", "-c", f"{bad}; echo status=$?"], capture_output=True,
                       timeout=TIMEOUT)
    assert "status=126" in c.stdout.decode()  # control: the shell says 126
    p = run_cli(jail, str(bad), extra=["--allow-bin", str(bad)])
    assert p.returncode == EXIT_NOT_EXECUTABLE, show(p)
    single_error_line(p)


def test_script_with_missing_interpreter_is_127(jail: Path) -> None:
    script = jail / "script.sh"
    script.write_text("#!/nonexistent/interpreter\n")
    script.chmod(0o755)
    c = subprocess.run(["sh", "-c", f"{script}; echo status=$?"], capture_output=True,
                       timeout=TIMEOUT)
    assert "status=127" in c.stdout.decode()  # control: the shell says 127
    p = run_cli(jail, str(script), extra=["--allow-bin", str(script)])
    assert p.returncode == EXIT_NOT_FOUND, show(p)
    single_error_line(p)


def test_bin_missing(jail: Path) -> None:
    p = run_cli(jail, "/nonexistent/tool", extra=["--allow-bin", "/nonexistent/tool"])
    assert p.returncode == EXIT_NOT_FOUND, show(p)
    single_error_line(p)
    p = run_cli(jail, "no-such-tool-hcp", extra=["--allow-bin", "no-such-tool-hcp"])
    assert p.returncode == EXIT_NOT_FOUND, show(p)
    single_error_line(p)


# --- 13. code-injection variables --------------------------------------------------------


@pytest.mark.parametrize("assignment", [
    "LD_PRELOAD=/tmp/evil.so", "LD_LIBRARY_PATH=/tmp", "BASH_ENV=/tmp/evil.sh", "ENV=/tmp/evil.sh",
    "PYTHONSTARTUP=/tmp/evil.py", "PYTHONPATH=/tmp", "NODE_OPTIONS=--require=/tmp/evil.js",
    "GIT_SSH_COMMAND=touch /tmp/evil", "GIT_CONFIG_COUNT=1", "PERL5OPT=-Mevil",
    "BASH_FUNC_x%%=() { touch /tmp/evil; }", "HCP_SANDBOX=native-local",
])
def test_code_injection_env_refused(jail: Path, assignment: str) -> None:
    key = assignment.split("=", 1)[0]
    before = snapshot(jail)
    receipt = jail.parent / "receipt.json"
    p = run_cli(jail, "sh", "-c", "echo ran > ran.txt",
                extra=["--env", assignment, "--receipt", receipt])
    assert p.returncode == EXIT_REFUSED, show(p)
    line = single_error_line(p)
    assert f'"{key}"' in line, line
    assert p.stdout == b""
    assert not (jail / "ran.txt").exists() and not receipt.exists()
    assert snapshot(jail) == before


def test_code_injection_env_refused_python_api(jail: Path) -> None:
    from hcp_linux import Policy, PolicyError, Sandbox
    with pytest.raises(PolicyError, match="LD_PRELOAD"):
        Sandbox(Policy(jail=str(jail), env={"LD_PRELOAD": "/x.so"})).run(
            ["sh", "-c", "echo ran > ran.txt"])
    assert not (jail / "ran.txt").exists()


def test_explicit_env_reaches_child(jail: Path) -> None:
    p = run_cli(jail, "sh", "-c", 'echo "$FOO|$EMPTY|$WITH_EQ"',
                extra=["--env", "FOO=bar", "--env", "EMPTY=", "--env", "WITH_EQ=a=b"])
    assert_ok(p)
    assert out(p) == "bar||a=b\n"


# --- 17. the receipt ---------------------------------------------------------------------


def _check_full_receipt(r: dict, jail: Path) -> None:
    from hcp_linux import landlock
    assert r["mode"] == "sandbox"
    assert r["policy"].startswith("sha256:") and len(r["policy"]) > 20
    layers = r["layers"]
    for name in ("userns", "mountns", "netns", "ipcns", "pidns", "landlock", "seccomp", "nnp",
                 "capabilities"):
        assert layers[name]["status"] == "enforced", (name, layers[name])
    ll = layers["landlock"]
    assert ll["abi"] == landlock.abi_version()
    for right in ("execute", "write_file", "read_file", "read_dir", "make_reg", "refer",
                  "truncate"):
        assert right in ll["handled_fs"], ll
    assert "baseline" in layers["seccomp"]["profiles"]
    assert layers["capabilities"]["effective"] == 0
    assert str(jail) in layers["mountns"]["read_write"]
    assert "HCP_SANDBOX" in r["env"]["set"] and "FOO" in r["env"]["set"]
    assert "AWS_SECRET_ACCESS_KEY" in r["env"]["removed"]
    assert "AWS_SECRET_ACCESS_KEY" not in r["env"]["set"]
    assert r["cwd"] == str(jail) and r["exe"] == "/usr/bin/true"
    assert SECRET not in json.dumps(r)  # the receipt names keys, never values


def test_receipt_file(jail: Path, tmp_path: Path) -> None:
    path = tmp_path / "receipt.json"
    env = dict(os.environ, AWS_SECRET_ACCESS_KEY=SECRET)
    p = run_cli(jail, "true", extra=["--receipt", path, "--env", "FOO=1"], env=env)
    assert_ok(p)
    r = read_receipt(path)
    _check_full_receipt(r, jail)
    assert r["exit"] == {"returncode": 0, "timed_out": False}
    assert list(tmp_path.glob("receipt.json.tmp*")) == []  # written atomically


def test_receipt_stderr(jail: Path) -> None:
    env = dict(os.environ, AWS_SECRET_ACCESS_KEY=SECRET)
    p = run_cli(jail, "true", extra=["--receipt", "-", "--env", "FOO=1"], env=env)
    assert_ok(p)
    assert p.stdout == b""
    _check_full_receipt(json.loads(err(p)), jail)


def test_receipt_policy_digest_tracks_the_policy(jail: Path, tmp_path: Path) -> None:
    def digest(*extra: str) -> str:
        path = tmp_path / "r.json"
        assert_ok(run_cli(jail, "true", extra=["--receipt", path, *extra]))
        return read_receipt(path)["policy"]
    a, b, c = digest(), digest(), digest("--env", "X=1")
    assert a == b != c


def test_receipt_records_timeout(jail: Path, tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    p = run_cli(jail, "sleep", "30", extra=["--timeout", "0.5", "--receipt", path])
    assert p.returncode == 124, show(p)
    assert read_receipt(path)["exit"]["timed_out"] is True


def test_python_api_receipt(jail: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hcp_linux import Policy, Sandbox
    # the secret in this process's own environment: what the allow-list protects (an env=
    # argument is a grant, docs/popen.md)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    r = Sandbox(Policy(jail=str(jail), env={"FOO": "1"})).run(["true"], timeout=TIMEOUT)
    assert r.returncode == 0 and not r.timed_out
    _check_full_receipt(r.receipt, jail)


# --- 18. bad input -----------------------------------------------------------------------


def _bad_input_cases(tmp: Path, jail: Path) -> dict:
    """name -> (argv after `run`, expected status, fragment of the message)."""
    pol = tmp / "policies"
    pol.mkdir()
    (pol / "malformed.toml").write_text("network = \n[[[\n")
    (pol / "unknown.toml").write_text('network = "none"\nfrobnicate = true\n')
    (pol / "badnet.toml").write_text('network = "bridge"\n')
    (pol / "badtype.toml").write_text('write_roots = "not-a-list"\n')
    (pol / "nonutf8.toml").write_bytes(b'network = "\xff"\n')
    unreadable = pol / "unreadable.toml"
    if IS_ROOT:
        unreadable.mkdir()  # root reads mode-000 files; a directory cannot be read either
    else:
        unreadable.write_text('network = "none"\n')
        unreadable.chmod(0)
    (jail / "sub").mkdir()
    cmd = ["--", "sh", "-c", f"echo ran > {jail}/ran; echo ran > {tmp}/ran"]
    j = ["--jail", str(jail)]
    return {
        "missing-jail": (["--jail", str(tmp / "nope")] + cmd, EXIT_REFUSED, "jail"),
        "relative-jail": (["--jail", "jail"] + cmd, EXIT_REFUSED, "absolute"),
        "ro-root-inside-jail": (j + ["--read-only-root", str(jail / "sub")] + cmd, EXIT_REFUSED,
                                "overlapping"),
        "jail-is-root": (["--jail", "/"] + cmd, EXIT_REFUSED, "overlapping"),
        "write-root-is-usr": (j + ["--write-root", "/usr"] + cmd, EXIT_REFUSED, "overlapping"),
        "missing-write-root": (j + ["--write-root", str(tmp / "nope")] + cmd, EXIT_REFUSED,
                               "write_roots"),
        "unknown-network": (j + ["--network", "bridge"] + cmd, EXIT_REFUSED, "network"),
        "policy-missing": (j + ["--policy", str(pol / "missing.toml")] + cmd, EXIT_REFUSED,
                           "missing.toml"),
        "policy-unreadable": (j + ["--policy", str(unreadable)] + cmd, EXIT_REFUSED,
                              "unreadable.toml"),
        "policy-malformed": (j + ["--policy", str(pol / "malformed.toml")] + cmd, EXIT_REFUSED,
                             "malformed"),
        "policy-unknown-key": (j + ["--policy", str(pol / "unknown.toml")] + cmd, EXIT_REFUSED,
                               "frobnicate"),
        "policy-unknown-network": (j + ["--policy", str(pol / "badnet.toml")] + cmd,
                                   EXIT_REFUSED, "network"),
        "policy-bad-type": (j + ["--policy", str(pol / "badtype.toml")] + cmd, EXIT_REFUSED,
                            "write_roots"),
        "policy-not-utf8": (j + ["--policy", str(pol / "nonutf8.toml")] + cmd, EXIT_REFUSED,
                            "nonutf8.toml"),
        "non-utf8-argument": (j + ["--", "sh", "-c", f"echo ran > {jail}/ran", b"\xff"],
                              EXIT_REFUSED, "UTF-8"),
        "non-utf8-env": (j + ["--env", b"A=\xff"] + cmd, EXIT_REFUSED, "UTF-8"),
        "env-without-equals": (j + ["--env", "NOEQUALS"] + cmd, EXIT_REFUSED, "NOEQUALS"),
        "env-empty-name": (j + ["--env", "=x"] + cmd, EXIT_REFUSED, "env"),
        "no-sandbox-alone": (j + ["--no-sandbox"] + cmd, EXIT_REFUSED, "native-local"),
        "native-local-alone": (j + ["--native-local"] + cmd, EXIT_REFUSED, "native-local"),
        "empty-command": (j + ["--"], EXIT_REFUSED, "command"),
        "no-command": (j, EXIT_REFUSED, "command"),
        "unknown-degraded-layer": (j + ["--allow-degraded", "everything"] + cmd, EXIT_REFUSED,
                                   "everything"),
        "negative-timeout": (j + ["--timeout", "-1"] + cmd, EXIT_REFUSED, "timeout"),
        "zero-timeout": (j + ["--timeout", "0"] + cmd, EXIT_REFUSED, "timeout"),
        "nan-timeout": (j + ["--timeout", "nan"] + cmd, EXIT_REFUSED, "timeout"),
        "infinite-timeout": (j + ["--timeout", "inf"] + cmd, EXIT_REFUSED, "timeout"),
        "huge-timeout": (j + ["--timeout", "1e300"] + cmd, EXIT_REFUSED, "timeout"),
        "jail-is-a-file": (["--jail", str(pol / "badnet.toml")] + cmd, EXIT_REFUSED, "jail"),
        "read-only-root-missing": (j + ["--read-only-root", str(tmp / "nope")] + cmd,
                                   EXIT_REFUSED, "read_only_roots"),
        "non-numeric-timeout": (j + ["--timeout", "soon"] + cmd, EXIT_USAGE, "timeout"),
        "unknown-option": (j + ["--frobnicate"] + cmd, EXIT_USAGE, "frobnicate"),
    }


BAD_INPUT = ["missing-jail", "relative-jail", "jail-is-a-file", "ro-root-inside-jail",
             "jail-is-root", "write-root-is-usr", "missing-write-root", "read-only-root-missing",
             "unknown-network", "policy-missing", "policy-unreadable", "policy-malformed",
             "policy-unknown-key", "policy-unknown-network", "policy-bad-type",
             "policy-not-utf8", "non-utf8-argument", "non-utf8-env", "env-without-equals",
             "env-empty-name", "no-sandbox-alone", "native-local-alone", "empty-command",
             "no-command", "unknown-degraded-layer", "negative-timeout", "zero-timeout",
             "nan-timeout", "infinite-timeout", "huge-timeout", "non-numeric-timeout",
             "unknown-option"]
_BAD_INPUT_NAMES = {c if isinstance(c, str) else c.values[0] for c in BAD_INPUT}


@pytest.mark.parametrize("case", BAD_INPUT)
def test_bad_input(tmp_path: Path, jail: Path, case: str) -> None:
    cases = _bad_input_cases(tmp_path, jail)
    assert set(cases) == _BAD_INPUT_NAMES
    args, status, fragment = cases[case]
    receipt = tmp_path / "receipt.json"
    before = snapshot(jail)
    argv = [sys.executable, "-m", "hcp_linux", "run", *EXECUTOR_ARGS, "--receipt", str(receipt),
            *args]
    p = subprocess.run(argv, capture_output=True, timeout=TIMEOUT, cwd=tmp_path,
                       stdin=subprocess.DEVNULL)
    assert p.returncode == status, show(p)
    line = single_error_line(p)
    assert fragment in line, line
    assert p.stdout == b""
    assert not (jail / "ran").exists() and not (tmp_path / "ran").exists(), "the command ran"
    assert not receipt.exists()
    assert snapshot(jail) == before
    assert not (tmp_path / "nope").exists()


def test_nul_bytes_refused_python_api(jail: Path) -> None:
    from hcp_linux import Policy, PolicyError, Sandbox
    before = snapshot(jail)
    with pytest.raises(PolicyError, match="NUL"):
        Sandbox(Policy(jail=str(jail))).run(["sh", "-c", "echo ran > ran\0x"])
    with pytest.raises(PolicyError, match="NUL"):
        Sandbox(Policy(jail=str(jail))).run(["sh\0", "-c", "echo ran > ran"])
    with pytest.raises(PolicyError, match="NUL"):
        Policy(jail=str(jail), env={"A": "b\0c"})
    with pytest.raises(PolicyError):
        Policy(jail=str(jail), env={"A\0": "b"})
    with pytest.raises(PolicyError, match="NUL"):
        Policy(jail=str(jail) + "\0x")
    with pytest.raises(PolicyError):
        Sandbox(Policy(jail=str(jail))).run([])
    assert snapshot(jail) == before
    # control: the same command without the NUL byte runs
    assert Sandbox(Policy(jail=str(jail))).run(["sh", "-c", "echo ran > ran"]).returncode == 0
    assert (jail / "ran").exists()


# --- 19. native-local ----------------------------------------------------------------------


def test_native_local(jail: Path) -> None:
    env = dict(os.environ, GITHUB_TOKEN=SECRET, HCP_SANDBOX="sandbox")
    p = run_cli(jail, "sh", "-c", "echo marker=$HCP_SANDBOX; env; grep -E '^(NoNewPrivs|Seccomp):' "
                "/proc/self/status", extra=["--no-sandbox", "--native-local"], env=env)
    assert_ok(p)
    lines = out(p).splitlines()
    assert lines[0] == "marker=native-local"
    assert "HCP_SANDBOX=native-local" in lines
    assert SECRET not in out(p)  # the env is still scrubbed
    assert "Seccomp:\t0" in lines  # a trust decision, not a confinement
    p = run_cli(jail, "ls", extra=["--no-sandbox", "--native-local", "--allow-bin", "true"])
    assert p.returncode == EXIT_NOT_FOUND
    assert p.stderr == b'error: sandbox: bin "ls" not allowlisted\n', show(p)
    p = run_cli(jail, "sh", "-c", "echo x", extra=["--no-sandbox", "--native-local", "--env",
                                                     "LD_PRELOAD=/x.so"])
    assert p.returncode == EXIT_REFUSED and "LD_PRELOAD" in single_error_line(p)


def test_native_local_receipt(jail: Path, tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    assert_ok(run_cli(jail, "true", extra=["--no-sandbox", "--native-local", "--receipt", path]))
    r = read_receipt(path)
    assert r["mode"] == "native-local"
    for name in ("userns", "mountns", "netns", "landlock", "seccomp", "nnp"):
        assert r["layers"][name]["status"] == "off", r["layers"][name]


def test_env_flag_mocks_ignored(jail: Path) -> None:
    """HCP §10.2.5: no environment variable of the caller changes what the driver does."""
    env = dict(os.environ, HCP_SANDBOX="native-local", HCP_NATIVE_LOCAL="1", HCP_MOCK="1",
               HCP_LINUX_NO_SANDBOX="1", SANDBOX="false", NATIVE_LOCAL="true")
    p = run_cli(jail, "sh", "-c", "echo $HCP_SANDBOX; grep Seccomp: /proc/self/status", env=env)
    assert_ok(p)
    assert out(p).splitlines() == ["sandbox", "Seccomp:\t2"], show(p)


# --- 20. a TTY ---------------------------------------------------------------------------


def _read_until(fd: int, needle: bytes, deadline: float) -> bytes:
    buf = b""
    while needle not in buf and time.monotonic() < deadline:
        r, _, _ = select.select([fd], [], [], 0.2)
        if r:
            try:
                chunk = os.read(fd, 1024)
            except OSError:
                break
            if not chunk:
                break
            buf += chunk
    return buf


def test_tty_works_for_interactive_tools(jail: Path) -> None:
    master, slave = pty.openpty()
    proc = subprocess.Popen(hcp_argv(jail, "sh", "-c", "test -t 0 && test -t 1 && echo tty-ok; "
                                     "read x; echo got $x"),
                            stdin=slave, stdout=slave, stderr=slave, cwd="/")
    os.close(slave)
    try:
        deadline = time.monotonic() + 30
        buf = _read_until(master, b"tty-ok", deadline)
        assert b"tty-ok" in buf, buf
        os.write(master, b"hello-from-the-terminal\n")
        buf += _read_until(master, b"got hello-from-the-terminal", deadline)
        assert b"got hello-from-the-terminal" in buf, buf
        assert proc.wait(timeout=TIMEOUT) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=TIMEOUT)
        os.close(master)


def test_tty_has_a_name_inside(jail: Path) -> None:
    master, slave = pty.openpty()
    other_master, other_slave = pty.openpty()  # another terminal of the same user
    try:
        c = subprocess.run(["tty"], stdin=slave, capture_output=True, timeout=TIMEOUT)
        assert c.returncode == 0 and c.stdout.startswith(b"/dev/pts/"), c  # control
        p = run_cli(jail, "tty", stdin=slave)
        assert p.returncode == 0 and p.stdout == c.stdout, show(p)
        # only the command's own terminal is in the view, not the user's other ones
        p = run_cli(jail, "ls", "/dev/pts", stdin=slave)
        assert p.stdout.split() == [os.path.basename(os.ttyname(slave)).encode()], show(p)
        assert os.path.basename(os.ttyname(other_slave)).encode() not in p.stdout
    finally:
        for fd in (master, slave, other_master, other_slave):
            os.close(fd)
