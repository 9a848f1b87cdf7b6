"""Every bad input to the CLI: one clear line, the documented status, no side effect (issue 15).

The command line, the environment variables the program reads (TMPDIR, XDG_STATE_HOME, HOME,
HCP_LINUX_SERVER), the output files (``--receipt``, ``--proxy-log``, ``--junit``) and
``serve --socket``. Each case runs the real CLI (``python -m hcp_linux``, and the installed
``hcp-linux`` for ``--version`` and a bare call) and checks:

- the exit status is the documented one (2 usage, 125 refused);
- stderr is exactly one ``error: sandbox: `` line (argparse's errors included), with control
  characters escaped, and no traceback;
- nothing ran and nothing changed: the command ``sh -c 'echo ran > MARKER'`` left no MARKER,
  and the scratch directory (every directory the case points at) is as it was, down to
  inodes and mtimes.

Each group has a negative control: the nearest valid input runs and creates MARKER (or the
receipt, or is served), so a refusal is never the test's own doing.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path
from typing import Iterator, Mapping, Sequence

import pytest

import hcp_linux
from sandboxing import EXECUTOR_ARGS, IS_ROOT, TIMEOUT, kill_by_pid, show

PREFIX = "error: sandbox: "
EXIT_USAGE, EXIT_REFUSED = 2, 125
#: The installed command (pyproject's script-files: bin/hcp-linux), next to this interpreter.
ENTRY_POINT = os.path.join(os.path.dirname(sys.executable), "hcp-linux")
#: A pid no process can have (the kernel's PID_MAX_LIMIT is the first pid it never gives).
NO_SUCH_PID = 4194304


# --- the scratch directory ------------------------------------------------------------------


class Scratch:
    """One test's world: a jail, a shared write root (where MARKER is written), an output
    dir, a work dir (the CLI's cwd), a temp dir, a state dir, a home, two packs (ephemeral
    and workspace mode), a regular file and a FIFO to point outputs at."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.jail, self.shared, self.out, self.work = (base / n for n in
                                                       ("jail", "shared", "out", "work"))
        self.tmp, self.state, self.home = base / "tmp", base / "state", base / "home"
        self.pack, self.wpack = base / "pack", base / "wpack"
        for d in (self.jail, self.shared, self.out, self.work, self.tmp, self.state,
                  self.home, self.pack, self.wpack):
            d.mkdir(parents=True)
        self.marker = self.shared / "MARKER"
        self.file = base / "file.txt"
        self.file.write_text("precious\n")
        self.fifo = base / "fifo"
        os.mkfifo(self.fifo)
        self.link = base / "link"
        self.link.symlink_to(self.file)
        self.pack_file = self.pack / "pack.toml"
        self.pack_file.write_text('[wrap]\nbin = ["sh"]\nworkspace = { mode = "ephemeral" }\n')
        self.wpack_file = self.wpack / "pack.toml"
        self.wpack_file.write_text('[wrap]\nbin = ["sh"]\nworkspace = { mode = "workspace" }\n')
        self.garbage = base / "garbage.toml"
        self.garbage.write_text("wrap = [[[\n")
        self.env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "TMPDIR": str(self.tmp),
                    "XDG_STATE_HOME": str(self.state), "HOME": str(self.home)}
        if IS_ROOT:  # outputs under a directory nobody can write: only meaningful unprivileged
            self.readonly: Path | None = None
        else:
            self.readonly = base / "readonly"
            self.readonly.mkdir(mode=0o500)

    @property
    def command(self) -> list[str]:
        """What every `run` case runs: it leaves MARKER when it runs at all."""
        return ["--", "sh", "-c", f"echo ran > {self.marker}"]


@pytest.fixture
def s(tmp_path: Path) -> Iterator[Scratch]:
    scratch = Scratch(tmp_path / "scratch")
    yield scratch
    if scratch.readonly is not None:
        scratch.readonly.chmod(0o700)  # so that pytest can remove it


def tree(path: "str | os.PathLike[str]") -> dict[str, tuple[int, int, int, int]]:
    """Every entry under ``path``, and ``path`` itself, with its type and mode, size, mtime
    and inode: equal before and after means nothing was created, changed or replaced."""
    root = os.fspath(path)
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for p in [dirpath] + [os.path.join(dirpath, n) for n in dirnames + filenames]:
            st = os.lstat(p)
            out[os.path.relpath(p, root)] = (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ino)
    return out


def cli(args: Sequence["str | bytes"], env: Mapping[str, str], cwd: "Path | str",
        argv0: Sequence[str] = ()) -> subprocess.CompletedProcess:
    """The CLI as a separate process (``python -m hcp_linux`` unless ``argv0``)."""
    return subprocess.run([*(argv0 or [sys.executable, "-m", "hcp_linux"]), *args],
                          capture_output=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL,
                          env=dict(env), cwd=cwd)


def one_error_line(p: subprocess.CompletedProcess, status: int) -> str:
    """The single ``error: sandbox: `` line of a refusal (or usage error), with the status;
    no traceback, no raw control character, nothing on stdout."""
    text = p.stderr.decode(errors="replace")
    assert p.returncode == status, show(p)
    assert "Traceback" not in text, show(p)
    assert text.endswith("\n") and text.count("\n") == 1, f"not one line:\n{show(p)}"
    assert text.startswith(PREFIX), show(p)
    assert text[:-1].isprintable(), f"raw control characters:\n{show(p)}"
    assert p.stdout == b"", show(p)
    return text[:-1]


# --- `run`: one table of bad inputs -----------------------------------------------------------


def _run_cases(s: Scratch) -> dict[str, tuple[list, dict, int, str]]:
    """name -> (argv after `run` (the command is added), environment changes, expected
    status, a fragment of the message: the culprit)."""
    j = ["--jail", str(s.jail), "--write-root", str(s.shared)]
    w = ["--write-root", str(s.shared)]  # with --pack: the jail is the pack's
    pack, wpack = ["--pack", str(s.pack_file)] + w, ["--pack", str(s.wpack_file)] + w
    allow = ["--network", "allow", "--allow-host", "example.com"]
    long_name = "r" * 300
    cases = {
        # usage errors: argparse's own, one line, exit 2
        "jail-twice": (j + ["--jail", str(s.jail)], {}, EXIT_USAGE, "--jail"),
        "timeout-twice": (j + ["--timeout", "5", "--timeout", "500"], {}, EXIT_USAGE,
                          "--timeout"),
        "receipt-twice": (j + ["--receipt", "-", "--receipt", str(s.out / "r.json")], {},
                          EXIT_USAGE, "--receipt"),
        "pack-twice": (pack + ["--pack", str(s.pack_file)], {}, EXIT_USAGE, "--pack"),
        "unknown-option-with-escape": (j + ["--\x1b[2Jbogus"], {}, EXIT_USAGE, "\\x1b"),
        "timeout-with-newline": (j + ["--timeout", "5\nerror: sandbox: forged"], {},
                                 EXIT_USAGE, "5\\nerror"),
        "timeout-not-a-number": (j + ["--timeout", "soon"], {}, EXIT_USAGE, "soon"),
        "on-exit-bogus": (j + ["--on-exit", "bogus"], {}, EXIT_USAGE, "bogus"),
        "jail-without-value": (["--jail"], {}, EXIT_USAGE, "--jail"),
        # the receipt: checked before the run, never after it
        "receipt-empty": (j + ["--receipt", ""], {}, EXIT_REFUSED, "--receipt"),
        "receipt-missing-dir": (j + ["--receipt", str(s.out / "nope" / "r.json")], {},
                                EXIT_REFUSED, "nope"),
        "receipt-is-a-dir": (j + ["--receipt", str(s.out)], {}, EXIT_REFUSED, "directory"),
        "receipt-trailing-slash": (j + ["--receipt", str(s.out) + "/"], {}, EXIT_REFUSED,
                                   "directory"),
        "receipt-parent-is-a-file": (j + ["--receipt", str(s.file / "r.json")], {},
                                     EXIT_REFUSED, "file.txt"),
        "receipt-is-a-symlink": (j + ["--receipt", str(s.link)], {}, EXIT_REFUSED,
                                 "regular file"),
        "receipt-is-a-fifo": (j + ["--receipt", str(s.fifo)], {}, EXIT_REFUSED,
                              "regular file"),
        "receipt-name-too-long": (j + ["--receipt", str(s.out / long_name)], {},
                                  EXIT_REFUSED, "too long"),
        "receipt-not-utf8": (j + ["--receipt", os.fsencode(s.out) + b"/\xff/r.json"], {},
                             EXIT_REFUSED, "\\xff"),
        "receipt-with-pack": (pack + ["--receipt", str(s.out / "nope" / "r.json")], {},
                              EXIT_REFUSED, "nope"),
        # the proxy log (append): the same, up front
        "proxy-log-missing-dir": (j + allow + ["--proxy-log", str(s.out / "nope" / "p.log")],
                                  {}, EXIT_REFUSED, "nope"),
        "proxy-log-is-a-dir": (j + allow + ["--proxy-log", str(s.out)], {}, EXIT_REFUSED,
                               "directory"),
        "proxy-log-empty": (j + allow + ["--proxy-log", ""], {}, EXIT_REFUSED, "--proxy-log"),
        # --env
        "env-without-equals": (j + ["--env", "NOEQUALS"], {}, EXIT_REFUSED, "NOEQUALS"),
        "env-name-with-space": (j + ["--env", "A B=1"], {}, EXIT_REFUSED, "A B"),
        "env-name-with-escape": (j + ["--env", "A\x1b=1"], {}, EXIT_REFUSED, "\\x1b"),
        "env-name-leading-digit": (j + ["--env", "1A=1"], {}, EXIT_REFUSED, "1A"),
        "env-ld-preload": (j + ["--env", "LD_PRELOAD=/tmp/x.so"], {}, EXIT_REFUSED,
                           "LD_PRELOAD"),
        # --jail and other values the policy validates (one line, no traceback)
        "jail-is-a-file": (["--jail", str(s.file)] + w, {}, EXIT_REFUSED, "jail"),
        "jail-missing": (["--jail", str(s.base / "nope")] + w, {}, EXIT_REFUSED, "jail"),
        "jail-empty": (["--jail", ""] + w, {}, EXIT_REFUSED, "jail"),
        "jail-very-long": (["--jail", "/" + "a/" * 3000] + w, {}, EXIT_REFUSED, "jail"),
        "jail-not-utf8": (["--jail", os.fsencode(s.base) + b"/\xff"] + w, {}, EXIT_REFUSED,
                          "jail"),
        "timeout-zero": (j + ["--timeout", "0"], {}, EXIT_REFUSED, "timeout"),
        "timeout-negative": (j + ["--timeout", "-1"], {}, EXIT_REFUSED, "timeout"),
        "timeout-nan": (j + ["--timeout", "nan"], {}, EXIT_REFUSED, "timeout"),
        "timeout-inf": (j + ["--timeout", "inf"], {}, EXIT_REFUSED, "timeout"),
        "timeout-overflow": (j + ["--timeout", "1e309"], {}, EXIT_REFUSED, "timeout"),
        "network-bogus": (j + ["--network", "bogus"], {}, EXIT_REFUSED, "bogus"),
        "allow-degraded-bogus": (j + ["--allow-degraded", "bogus"], {}, EXIT_REFUSED, "bogus"),
        "policy-empty": (j + ["--policy", ""], {}, EXIT_REFUSED, "--policy"),
        "policy-is-a-dir": (j + ["--policy", str(s.out)], {}, EXIT_REFUSED, "out"),
        # --pack, --principal
        "pack-empty": (["--pack", ""] + w, {}, EXIT_REFUSED, "--pack"),
        "pack-missing": (["--pack", str(s.base / "nope.toml")] + w, {}, EXIT_REFUSED,
                         "nope.toml"),
        "pack-is-a-dir": (["--pack", str(s.pack)] + w, {}, EXIT_REFUSED, "pack"),
        "pack-garbage": (["--pack", str(s.garbage)] + w, {}, EXIT_REFUSED, "garbage.toml"),
        "principal-with-slash": (wpack + ["--principal", "a/b"], {}, EXIT_REFUSED, "a/b"),
        "principal-dotdot": (wpack + ["--principal", ".."], {}, EXIT_REFUSED, ".."),
        "principal-empty": (wpack + ["--principal", ""], {}, EXIT_REFUSED, "principal"),
        "principal-without-pack": (j + ["--principal", "alice"], {}, EXIT_REFUSED,
                                   "--principal"),
        # TMPDIR (where a pack's jails are made)
        "tmpdir-relative": (pack, {"TMPDIR": "tmp"}, EXIT_REFUSED, "TMPDIR"),
        "tmpdir-missing": (pack, {"TMPDIR": str(s.base / "nope")}, EXIT_REFUSED, "TMPDIR"),
        "tmpdir-is-a-file": (pack, {"TMPDIR": str(s.file)}, EXIT_REFUSED, "TMPDIR"),
        "tmpdir-etc": (pack, {"TMPDIR": "/etc"}, EXIT_REFUSED, "TMPDIR"),
        "tmpdir-root": (pack, {"TMPDIR": "/"}, EXIT_REFUSED, "TMPDIR"),
        "tmpdir-with-escape": (pack, {"TMPDIR": str(s.base / "no\x1bpe")}, EXIT_REFUSED,
                               "\\x1b"),
        # XDG_STATE_HOME and HOME (where a workspace-mode pack's workspaces live)
        "xdg-state-relative": (wpack, {"XDG_STATE_HOME": "state"}, EXIT_REFUSED,
                               "XDG_STATE_HOME"),
        "xdg-state-is-a-file": (wpack, {"XDG_STATE_HOME": str(s.file)}, EXIT_REFUSED,
                                "XDG_STATE_HOME"),
        "xdg-state-etc": (wpack, {"XDG_STATE_HOME": "/etc"}, EXIT_REFUSED, "XDG_STATE_HOME"),
        "xdg-state-usr": (wpack, {"XDG_STATE_HOME": "/usr/local/share"}, EXIT_REFUSED,
                          "XDG_STATE_HOME"),
        "home-empty": (wpack, {"XDG_STATE_HOME": None, "HOME": ""}, EXIT_REFUSED, "HOME"),
        "home-relative": (wpack, {"XDG_STATE_HOME": None, "HOME": "home"}, EXIT_REFUSED,
                          "HOME"),
        "home-missing": (wpack, {"XDG_STATE_HOME": None, "HOME": str(s.base / "nope")},
                         EXIT_REFUSED, "HOME"),
        "home-etc": (wpack, {"XDG_STATE_HOME": None, "HOME": "/etc"}, EXIT_REFUSED, "HOME"),
    }
    if s.readonly is not None:
        cases["receipt-dir-not-writable"] = (j + ["--receipt", str(s.readonly / "r.json")],
                                             {}, EXIT_REFUSED, "not writable")
    return cases


RUN_CASES = [
    "jail-twice", "timeout-twice", "receipt-twice", "pack-twice", "unknown-option-with-escape",
    "timeout-with-newline", "timeout-not-a-number", "on-exit-bogus", "jail-without-value",
    "receipt-empty", "receipt-missing-dir", "receipt-is-a-dir", "receipt-trailing-slash",
    "receipt-parent-is-a-file", "receipt-is-a-symlink", "receipt-is-a-fifo",
    "receipt-name-too-long", "receipt-not-utf8", "receipt-with-pack",
    pytest.param("receipt-dir-not-writable", marks=pytest.mark.skipif(
        IS_ROOT, reason="root writes in a mode-500 directory")),
    "proxy-log-missing-dir", "proxy-log-is-a-dir", "proxy-log-empty",
    "env-without-equals", "env-name-with-space", "env-name-with-escape",
    "env-name-leading-digit", "env-ld-preload",
    "jail-is-a-file", "jail-missing", "jail-empty", "jail-very-long", "jail-not-utf8",
    "timeout-zero", "timeout-negative", "timeout-nan", "timeout-inf", "timeout-overflow",
    "network-bogus", "allow-degraded-bogus", "policy-empty", "policy-is-a-dir",
    "pack-empty", "pack-missing", "pack-is-a-dir", "pack-garbage", "principal-with-slash",
    "principal-dotdot", "principal-empty", "principal-without-pack",
    "tmpdir-relative", "tmpdir-missing", "tmpdir-is-a-file", "tmpdir-etc", "tmpdir-root",
    "tmpdir-with-escape", "xdg-state-relative", "xdg-state-is-a-file", "xdg-state-etc",
    "xdg-state-usr", "home-empty", "home-relative", "home-missing", "home-etc",
]


def _env(s: Scratch, changes: Mapping[str, "str | None"]) -> dict[str, str]:
    env = dict(s.env)
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


#: Directories outside the scratch dir that cases point at (TMPDIR=/etc, HOME=/etc...),
#: and the names a regression would make there: an ephemeral jail, the state dir.
OUTSIDE = ("/", "/etc", "/usr/local/share")
OURS = ("hcp-linux", ".local")


def _ours_in(dirs: Sequence[str]) -> dict[str, set[str]]:
    """Our names in ``dirs``: a refused run must add none."""
    return {d: {n for n in os.listdir(d) if n.startswith(OURS)} for d in dirs
            if os.path.isdir(d)}


@pytest.mark.parametrize("case", RUN_CASES)
def test_bad_run_input(s: Scratch, case: str) -> None:
    cases = _run_cases(s)
    args, changes, status, fragment = cases[case]
    before, before_outside = tree(s.base), _ours_in(OUTSIDE)
    p = cli(["run", *EXECUTOR_ARGS, *args, *s.command], _env(s, changes), s.work)
    after_outside = _ours_in(OUTSIDE)
    for d in after_outside:  # should the bug come back, leave nothing behind (exact names)
        for name in after_outside[d] - before_outside[d]:
            shutil.rmtree(os.path.join(d, name), ignore_errors=True)
    line = one_error_line(p, status)
    assert fragment in line, line
    assert not s.marker.exists(), "the command ran"
    assert tree(s.base) == before, "the scratch dir changed"
    assert after_outside == before_outside, "something was made outside the scratch dir"


def test_run_case_table_is_complete(s: Scratch) -> None:
    names = {c if isinstance(c, str) else c.values[0] for c in RUN_CASES}
    assert set(_run_cases(s)) == names - ({"receipt-dir-not-writable"} if IS_ROOT else set())


#: The nearest valid input of each group above: it runs, and leaves MARKER.
CONTROLS = ["plain", "receipt", "receipt-name-250-bytes", "receipt-stderr", "proxy-log",
            "env-name", "timeout", "pack", "pack-tmpdir", "workspace-xdg-state",
            "workspace-xdg-state-made-on-first-use", "workspace-home", "principal"]


def _controls(s: Scratch) -> dict[str, tuple[list, dict, "Path | None"]]:
    """name -> (argv after `run`, environment changes, a file the run must have written)."""
    j = ["--jail", str(s.jail), "--write-root", str(s.shared)]
    w = ["--write-root", str(s.shared)]
    pack, wpack = ["--pack", str(s.pack_file)] + w, ["--pack", str(s.wpack_file)] + w
    new_state = s.base / "new-state" / "xdg"
    return {
        "plain": (j, {}, None),
        "receipt": (j + ["--receipt", str(s.out / "r.json")], {}, s.out / "r.json"),
        "receipt-name-250-bytes": (j + ["--receipt", str(s.out / ("r" * 250))], {},
                                   s.out / ("r" * 250)),
        "receipt-stderr": (j + ["--receipt", "-"], {}, None),
        "proxy-log": (j + ["--network", "allow", "--allow-host", "example.com",
                           "--proxy-log", str(s.out / "p.log")], {}, None),
        "env-name": (j + ["--env", "A_B1=x y"], {}, None),
        "timeout": (j + ["--timeout", "30"], {}, None),
        "pack": (pack + ["--receipt", str(s.out / "r.json")], {}, s.out / "r.json"),
        "pack-tmpdir": (pack, {"TMPDIR": str(s.out)}, None),
        "workspace-xdg-state": (wpack, {}, s.state / "hcp-linux"),
        "workspace-xdg-state-made-on-first-use": (wpack, {"XDG_STATE_HOME": str(new_state)},
                                                  new_state / "hcp-linux"),
        "workspace-home": (wpack, {"XDG_STATE_HOME": None}, s.home / ".local" / "state"),
        "principal": (wpack + ["--principal", "alice"], {}, s.state / "hcp-linux"),
    }


@pytest.mark.parametrize("case", CONTROLS)
def test_nearest_valid_input_runs(s: Scratch, case: str) -> None:
    args, changes, written = _controls(s)[case]
    p = cli(["run", *EXECUTOR_ARGS, *args, *s.command], _env(s, changes), s.work)
    assert p.returncode == 0, show(p)
    assert s.marker.read_text() == "ran\n"
    if written is not None:
        assert written.exists(), show(p)
    assert "Traceback" not in p.stderr.decode(errors="replace")
    assert [n for n in os.listdir(s.out) if ".hcp-" in n] == [], "a temp file was left"


def test_run_from_a_removed_directory(s: Scratch) -> None:
    """The jail defaults to the cwd: a removed one is one line, not a traceback. Control:
    the same from a directory that still exists runs there."""
    gone = s.base / "gone"
    script = 'cd "$1" && rmdir "$1" && shift && exec "$@"'
    for remove in (True, False):
        gone.mkdir()
        argv = [sys.executable, "-m", "hcp_linux", "run", *EXECUTOR_ARGS, "--write-root",
                str(s.shared), *s.command]
        p = subprocess.run(["sh", "-c", script if remove else script.replace("rmdir", "true"),
                            "sh", str(gone), *argv], capture_output=True, timeout=TIMEOUT,
                           env=s.env, stdin=subprocess.DEVNULL)
        if remove:
            line = one_error_line(p, EXIT_REFUSED)
            assert "current directory" in line, line
            assert not s.marker.exists()
        else:
            assert p.returncode == 0 and s.marker.exists(), show(p)
            gone.rmdir()


def test_receipt_dir_removed_during_the_run(s: Scratch) -> None:
    """Checked up front, the receipt's directory can still go while the command runs (here
    the command removes it): one line, exit 125, no traceback, no temp file. Control: the
    same run with the directory kept writes the receipt and exits 0."""
    out = s.shared / "receipts"
    for remove in (False, True):
        out.mkdir()
        script = f"echo ran > {s.marker}" + (f"; rmdir {out}" if remove else "")
        p = cli(["run", *EXECUTOR_ARGS, "--jail", str(s.jail), "--write-root", str(s.shared),
                 "--receipt", str(out / "r.json"), "--", "sh", "-c", script], s.env, s.work)
        if remove:
            line = one_error_line(p, EXIT_REFUSED)
            assert "receipt" in line and str(out) in line, line
            assert not out.exists()
        else:
            assert p.returncode == 0 and (out / "r.json").exists(), show(p)
            shutil.rmtree(out)
        assert s.marker.exists()
        s.marker.unlink()
    assert [n for n in os.listdir(s.shared)] == []


# --- the program itself: --version, a bare call, argparse's errors ----------------------------


@pytest.mark.parametrize("how", ["entry-point", "module"])
def test_version(s: Scratch, how: str) -> None:
    argv0 = [ENTRY_POINT] if how == "entry-point" else []
    if argv0 and not os.access(ENTRY_POINT, os.X_OK):
        pytest.skip(f"no entry point at {ENTRY_POINT}")
    p = cli(["--version"], s.env, s.work, argv0)
    assert (p.returncode, p.stderr) == (0, b""), show(p)
    assert p.stdout == f"hcp-linux {hcp_linux.__version__}\n".encode()
    assert hcp_linux.__version__ == importlib.metadata.version("hcp-linux")


@pytest.mark.parametrize("how", ["entry-point", "module"])
@pytest.mark.parametrize("columns", ["80", "20"])
def test_bare_command_prints_usage_and_a_hint(s: Scratch, how: str, columns: str) -> None:
    argv0 = [ENTRY_POINT] if how == "entry-point" else []
    if argv0 and not os.access(ENTRY_POINT, os.X_OK):
        pytest.skip(f"no entry point at {ENTRY_POINT}")
    p = cli([], {**s.env, "COLUMNS": columns}, s.work, argv0)
    assert p.returncode == EXIT_USAGE and p.stdout == b"", show(p)
    usage, hint = p.stderr.decode().splitlines()  # exactly two lines, whatever the width
    assert usage.startswith("usage: hcp-linux ") and "run" in usage, show(p)
    assert hint.startswith(PREFIX) and "--help" in hint and "run" in hint, show(p)
    # control: the same program with a command works
    assert cli(["--help"], s.env, s.work, argv0).returncode == 0


@pytest.mark.parametrize("args, fragment", [
    (["bogus"], "bogus"),
    (["bo\x1bgus"], "\\x1b"),
    (["probe", "extra"], "extra"),
    (["probe", "--bogus"], "--bogus"),
    (["gc", "--tmp-dir", "/tmp", "--tmp-dir", "/tmp"], "--tmp-dir"),
    (["serve"], "--socket"),
    (["serve", "--socket", "/tmp/a", "--socket", "/tmp/b"], "--socket"),
    (["conformance", "--junit", "a.xml", "--junit", "b.xml"], "--junit"),
], ids=["unknown-command", "command-with-escape", "probe-extra", "probe-unknown-option",
        "gc-tmp-dir-twice", "serve-without-socket", "serve-socket-twice", "junit-twice"])
def test_usage_errors_are_one_line(s: Scratch, args: list[str], fragment: str) -> None:
    before = tree(s.base)
    line = one_error_line(cli(args, s.env, s.work), EXIT_USAGE)
    assert fragment in line, line
    assert tree(s.base) == before


def test_probe_control(s: Scratch) -> None:
    """Control of the probe rows above: ``probe --json`` prints JSON and a status."""
    p = cli(["probe", "--json"], s.env, s.work)
    assert p.returncode in (0, 1), show(p)
    assert isinstance(json.loads(p.stdout), dict)


# --- gc and conformance: checked before anything is removed or run -----------------------------


def _dead_jail(tmp: Path) -> Path:
    """An ephemeral jail whose owner is certainly gone (a pid no process can have): what
    `gc` removes when it runs at all."""
    ns = os.stat("/proc/self/ns/pid").st_ino
    jail = tmp / f"hcp-linux-ephemeral-{NO_SUCH_PID}-1-{ns}-{'0' * 12}"
    (jail / "jail").mkdir(parents=True)
    return jail


@pytest.mark.parametrize("case", [
    "path-empty", "path-missing", "path-is-a-file", "tmp-dir-empty", "tmp-dir-missing",
    "tmp-dir-is-a-file", "state-dir-empty", "state-dir-under-a-file", "state-dir-is-a-file",
    "tmpdir-env-missing", "xdg-state-relative", "home-relative",
])
def test_bad_gc_input(s: Scratch, case: str) -> None:
    dead = _dead_jail(s.tmp)
    args, changes, fragment = {
        "path-empty": ([""], {}, "gc"),
        "path-missing": ([str(s.base / "nope")], {}, "nope"),
        "path-is-a-file": ([str(s.file)], {}, "file.txt"),
        "tmp-dir-empty": (["--tmp-dir", ""], {}, "--tmp-dir"),
        "tmp-dir-missing": (["--tmp-dir", str(s.base / "nope")], {}, "nope"),
        "tmp-dir-is-a-file": (["--tmp-dir", str(s.file)], {}, "file.txt"),
        "state-dir-empty": (["--state-dir", ""], {}, "--state-dir"),
        "state-dir-under-a-file": (["--state-dir", str(s.file / "state")], {}, "file.txt"),
        "state-dir-is-a-file": (["--state-dir", str(s.file)], {}, "file.txt"),
        "tmpdir-env-missing": ([], {"TMPDIR": str(s.base / "nope")}, "TMPDIR"),
        "xdg-state-relative": ([], {"XDG_STATE_HOME": "state"}, "XDG_STATE_HOME"),
        "home-relative": ([], {"XDG_STATE_HOME": None, "HOME": "home"}, "HOME"),
    }[case]
    before = tree(s.base)
    line = one_error_line(cli(["gc", *args], _env(s, changes), s.work), EXIT_REFUSED)
    assert fragment in line, line
    assert dead.exists() and tree(s.base) == before, "gc removed something"
    # control: with good input (a state dir where no workspace was ever made is one), gc
    # removes the dead jail
    p = cli(["gc", "--state-dir", str(s.base / "no-workspace-yet")], s.env, s.work)
    assert p.returncode == 0 and not dead.exists(), show(p)


def test_conformance_junit_checked_before_the_checks(s: Scratch) -> None:
    """A JUnit path that cannot be written is refused at once (the checks take a while and
    their report would be lost), as is a bad TMPDIR. (The control, a full conformance run
    writing its JUnit file, is tests/test_conformance.py's.)"""
    before = tree(s.base)
    for args, changes, fragment in [
            (["--junit", str(s.out / "nope" / "c.xml")], {}, "nope"),
            (["--junit", str(s.out)], {}, "directory"),
            (["--junit", str(s.link)], {}, "regular file"),
            ([], {"TMPDIR": str(s.file)}, "TMPDIR")]:
        line = one_error_line(cli(["conformance", *args], _env(s, changes), s.work),
                              EXIT_REFUSED)
        assert fragment in line, line
    assert tree(s.base) == before


# --- serve --socket: only a stale socket of ours is ever removed -------------------------------


def _serve(path: "str | Path", env: Mapping[str, str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "hcp_linux", "serve", "--socket", str(path)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=dict(env), cwd=cwd)


def _stop(proc: subprocess.Popen) -> None:
    try:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=TIMEOUT)
    finally:
        kill_by_pid(proc)
        if proc.stderr is not None:
            proc.stderr.close()


def _stale_socket(path: Path) -> None:
    """A socket inode of ours nobody listens on: what a server killed with SIGKILL leaves."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.close()
    assert stat.S_ISSOCK(os.lstat(path).st_mode)


@pytest.mark.parametrize("case", ["regular-file", "symlink-to-file", "directory", "empty",
                                  "missing-parent", "too-long", "parent-is-a-file", "fifo"])
def test_serve_leaves_what_is_not_a_stale_socket(s: Scratch, case: str) -> None:
    path = {"regular-file": s.file, "symlink-to-file": s.link, "directory": s.out,
            "empty": "", "missing-parent": s.base / "nope" / "sock",
            "too-long": s.base / ("s" * 120), "parent-is-a-file": s.file / "sock",
            "fifo": s.fifo}[case]
    before = tree(s.base)
    p = subprocess.run([sys.executable, "-m", "hcp_linux", "serve", "--socket", str(path)],
                       capture_output=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL,
                       env=s.env, cwd=s.work)
    one_error_line(p, EXIT_REFUSED)
    assert tree(s.base) == before, "serve changed what was there"
    assert s.file.read_text() == "precious\n"


def test_serve_replaces_a_stale_socket_of_ours(s: Scratch) -> None:
    """Control of the refusals above: a socket inode of ours that nobody answers on is
    replaced, and the new server answers there (a run through it is served)."""
    path = s.base / "serve.sock"
    _stale_socket(path)
    proc = _serve(path, s.env, s.work)
    try:
        line = proc.stderr.readline()
        assert line.startswith(b"hcp-linux serve: listening on"), line
        p = cli(["run", "--jail", str(s.jail), "--write-root", str(s.shared), "--receipt",
                 str(s.out / "r.json"), *s.command], {**s.env, "HCP_LINUX_SERVER": str(path)},
                s.work)
        assert p.returncode == 0 and s.marker.exists(), show(p)
        assert json.loads((s.out / "r.json").read_text())["served_by"]["pid"] == proc.pid
    finally:
        _stop(proc)
    assert not path.exists(), "the socket outlived its server"


def test_serve_leaves_what_replaced_its_socket(s: Scratch) -> None:
    """A server that stops removes its socket only if that is still what is at the path:
    a file put there meanwhile stays."""
    path = s.base / "serve.sock"
    proc = _serve(path, s.env, s.work)
    try:
        assert proc.stderr.readline().startswith(b"hcp-linux serve: listening on")
        path.unlink()
        path.write_text("not yours\n")
    finally:
        _stop(proc)
    assert path.read_text() == "not yours\n"


@pytest.mark.root_only
def test_serve_leaves_a_socket_of_another_user(s: Scratch) -> None:
    import pwd
    path = s.base / "theirs.sock"
    _stale_socket(path)
    nobody = pwd.getpwnam("nobody")
    os.chown(path, nobody.pw_uid, nobody.pw_gid, follow_symlinks=False)
    before = tree(s.base)
    p = subprocess.run([sys.executable, "-m", "hcp_linux", "serve", "--socket", str(path)],
                       capture_output=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL,
                       env=s.env, cwd=s.work)
    line = one_error_line(p, EXIT_REFUSED)
    assert f"uid {nobody.pw_uid}" in line, line
    assert tree(s.base) == before


def test_served_run_refuses_a_bad_receipt_up_front(s: Scratch) -> None:
    """Through a server, the same refusal before anything starts. Control: the same run
    with a good receipt path is served and writes it."""
    path = s.base / "serve.sock"
    proc = _serve(path, s.env, s.work)
    env = {**s.env, "HCP_LINUX_SERVER": str(path)}
    try:
        assert proc.stderr.readline().startswith(b"hcp-linux serve: listening on")
        before = tree(s.base)
        base = ["run", "--jail", str(s.jail), "--write-root", str(s.shared)]
        p = cli([*base, "--receipt", str(s.out / "nope" / "r.json"), *s.command], env, s.work)
        line = one_error_line(p, EXIT_REFUSED)
        assert "nope" in line and not s.marker.exists() and tree(s.base) == before, line
        p = cli([*base, "--receipt", str(s.out / "r.json"), *s.command], env, s.work)
        assert p.returncode == 0 and s.marker.exists(), show(p)
        assert json.loads((s.out / "r.json").read_text())["served_by"]["pid"] == proc.pid
    finally:
        _stop(proc)


# --- HCP_LINUX_SERVER: a bad value is named, and the run goes on in-process ------------------


@pytest.mark.parametrize("case", ["relative", "regular-file", "too-long", "parent-is-a-file",
                                  "with-escape"])
def test_bad_server_variable_is_named(s: Scratch, case: str) -> None:
    value = {"relative": "serve.sock", "regular-file": str(s.file),
             "too-long": "/tmp/" + "s" * 120, "parent-is-a-file": str(s.file / "sock"),
             "with-escape": "rel\x1b[2Jative"}[case]
    p = cli(["run", *EXECUTOR_ARGS, "--jail", str(s.jail), "--write-root", str(s.shared),
             *s.command], {**s.env, "HCP_LINUX_SERVER": value}, s.work)
    assert p.returncode == 0 and s.marker.exists(), show(p)  # the same run, in-process
    text = p.stderr.decode(errors="replace")
    assert text.count("\n") == 1 and text[:-1].isprintable(), show(p)
    assert text.startswith("hcp-linux: not using HCP_LINUX_SERVER="), show(p)
    assert s.file.read_text() == "precious\n"


def test_no_server_there_is_quiet(s: Scratch) -> None:
    """Control: an absolute path where no server is (not started yet) runs in-process
    without a word, as documented."""
    p = cli(["run", *EXECUTOR_ARGS, "--jail", str(s.jail), "--write-root", str(s.shared),
             *s.command], {**s.env, "HCP_LINUX_SERVER": str(s.base / "serve.sock")}, s.work)
    assert p.returncode == 0 and p.stderr == b"" and s.marker.exists(), show(p)


# --- as root: system directories named by the environment are never written -----------------


@pytest.mark.root_only
@pytest.mark.parametrize("changes, variable, made", [
    ({"XDG_STATE_HOME": "/etc"}, "XDG_STATE_HOME=/etc", "/etc/hcp-linux"),
    ({"XDG_STATE_HOME": None, "HOME": "/etc"}, "HOME=/etc", "/etc/.local"),
    ({"XDG_STATE_HOME": "/usr/local"}, "XDG_STATE_HOME=/usr/local", "/usr/local/hcp-linux"),
], ids=["xdg-state-etc", "home-etc", "xdg-state-usr-local"])
def test_root_never_makes_state_in_a_system_root(s: Scratch, changes: dict, variable: str,
                                                 made: str) -> None:
    """As root every directory is writable: only the system-root rule stands between
    XDG_STATE_HOME=/etc and a /etc/hcp-linux full of writable jails every sandbox sees."""
    if os.path.lexists(made):
        pytest.skip(f"{made} exists already on this host")
    try:
        p = cli(["run", *EXECUTOR_ARGS, "--pack", str(s.wpack_file), "--write-root",
                 str(s.shared), *s.command], _env(s, changes), s.work)
        assert not os.path.lexists(made), f"{made} was created"
        line = one_error_line(p, EXIT_REFUSED)
        assert line.startswith(f"{PREFIX}{variable}: "), line
        assert not s.marker.exists()
    finally:
        if os.path.lexists(made):  # the bug is back: leave the host as it was
            shutil.rmtree(made)


@pytest.mark.root_only
def test_root_never_makes_jails_in_etc(s: Scratch) -> None:
    before = set(os.listdir("/etc"))
    try:
        p = cli(["run", *EXECUTOR_ARGS, "--pack", str(s.pack_file), "--write-root",
                 str(s.shared), *s.command], {**s.env, "TMPDIR": "/etc"}, s.work)
        line = one_error_line(p, EXIT_REFUSED)
        assert line.startswith(f"{PREFIX}TMPDIR=/etc: ") and "overlapping" not in line, line
        assert set(os.listdir("/etc")) == before and not s.marker.exists()
    finally:
        for name in set(os.listdir("/etc")) - before:
            if name.startswith("hcp-linux-"):
                shutil.rmtree(os.path.join("/etc", name))
