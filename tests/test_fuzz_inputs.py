"""Property-based fuzzing of what a caller hands `hcp-linux run` (issue #15, item 3).

Targets: the CLI's argv (in process, through ``hcp_linux.cli.cli.main``, and a few through the real
program), TOML policy files loaded as ``--policy FILE`` loads them, and pack manifests loaded
as ``--pack FILE`` loads them.

Invariants, for every input (README "Exit statuses"; docs/failure-paths.md):

* no exception escapes but the project's ``SandboxError`` subclasses, or ``SystemExit`` from
  argparse (2; 0 for ``--help``);
* the exit status is 0, 2, 124, 125, 126, 127, 128+N, or the marker command's own (42);
* a refusal (2, 125, 126, 127) prints exactly one stderr line, ``error: sandbox: ...``;
* on a refusal the marker command did not run and the scratch directory (which holds every
  path the inputs may name, the cwd, TMPDIR and XDG_STATE_HOME) is exactly as it was.

The command is always ``/bin/sh -c 'echo ran > marker; exit 42'``: status 42 means it ran.

Failure classes found here whose fix belongs to other files are listed in `KNOWN` with a
finding id: while a finding is open (`OPEN`), the fuzz targets tolerate its class (and count
it, see ``--hypothesis-show-statistics``) so that they keep looking for new ones, and
``test_known_finding[F...]`` replays its minimal example, marked xfail. Once a class is
fixed its replay XPASSes: remove its id from `OPEN`, and the replay becomes a plain
regression test. ``HCP_FUZZ_STRICT=1`` tolerates nothing.

Example counts: profile ``ci`` (default, derandomized) runs 200 examples per in-process
target and 12 through the real program; ``HYPOTHESIS_PROFILE=long`` 10,000 (200).
"""
from __future__ import annotations

import contextlib
import io
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import event, example, given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.control import currently_in_test_context  # noqa: E402

from hcp_linux.cli import cli  # noqa: E402
from hcp_linux.errors import SandboxError  # noqa: E402
from hcp_linux.policy.pack import Pack, PackError, load_pack  # noqa: E402

# -- profiles -------------------------------------------------------------------------------------

from fuzzing import fuzz  # noqa: E402  (the profiles)
STRICT = os.environ.get("HCP_FUZZ_STRICT") == "1"



# -- the scratch directory and one observed run ---------------------------------------------------

MARKER_CMD = ["/bin/sh", "-c", "echo ran > marker; exit 42"]
RAN = 42
REFUSALS = (2, 125, 126, 127)
#: A directory that must never come to exist: inputs name paths under it.
NOWHERE = "/nonexistent-hcp-fuzz"
PACK_TOML = '[wrap]\nbin = ["sh"]\n'


class Scratch:
    """Everything an input may name, in one temporary directory: {S} in a template."""

    def __init__(self) -> None:
        self.root = tempfile.mkdtemp(prefix="hcp-fuzz-")
        os.chmod(self.root, 0o755)
        for d in ("jail", "wr", "wr2", "ro", "cwd", "tmp", "state", "out", "pack", "ro/sub"):
            os.makedirs(os.path.join(self.root, d))
        Path(self.root, "file").write_text("a file, not a directory\n")
        Path(self.root, "pack", "pack.toml").write_text(PACK_TOML)
        Path(self.root, "pack", "pack.json").write_text(json.dumps({"wrap": {"bin": "sh"}}))
        Path(self.root, "pack", "bad.toml").write_text("[wrap\nbin = 1\n")
        Path(self.root, "policy.toml").write_text('on_exit = "kill"\n')
        Path(self.root, "bad-policy.toml").write_bytes(b"timeout = \xff\n")

    def fill(self, text: str) -> str:
        return text.replace("{S}", self.root)

    def fill_bytes(self, data: bytes) -> bytes:
        return data.replace(b"{S}", os.fsencode(self.root))

    def snapshot(self) -> dict[str, tuple]:
        out: dict[str, tuple] = {}
        for top, dirs, files in os.walk(self.root):
            for name in dirs + files + ["."]:
                path = os.path.normpath(os.path.join(top, name))
                st_ = os.lstat(path)
                out[os.path.relpath(path, self.root)] = (
                    st_.st_mode, st_.st_size, st_.st_mtime_ns, st_.st_uid, st_.st_nlink)
        return out

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def scratch_env(scratch: Scratch) -> Iterator[None]:
    """cwd, TMPDIR and XDG_STATE_HOME inside the scratch directory, for one in-process run."""
    saved_env = {k: os.environ.get(k) for k in ("TMPDIR", "XDG_STATE_HOME", "HCP_LINUX_SERVER")}
    saved_cwd, saved_tempdir = os.getcwd(), tempfile.tempdir
    os.environ["TMPDIR"] = os.path.join(scratch.root, "tmp")
    os.environ["XDG_STATE_HOME"] = os.path.join(scratch.root, "state")
    os.environ.pop("HCP_LINUX_SERVER", None)
    tempfile.tempdir = os.path.join(scratch.root, "tmp")
    os.chdir(os.path.join(scratch.root, "cwd"))
    try:
        yield
    finally:
        os.chdir(saved_cwd)
        tempfile.tempdir = saved_tempdir
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class Violation(AssertionError):
    """An invariant broke; ``key`` names its class (see `KNOWN`)."""

    def __init__(self, key: str, detail: str) -> None:
        super().__init__(f"[{key}] {detail}")
        self.key = key


def _where(exc: BaseException) -> str:
    """The innermost frame of the project's code an exception passed through."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if "/hcp_linux/" in f.filename] or frames
    f = ours[-1]
    return f"{os.path.basename(f.filename)}:{f.name}"


@dataclass
class Outcome:
    status: int
    stderr: str
    stdout: str


def run_main(argv: Sequence[str], scratch: Scratch) -> Outcome:
    """``cli.main(argv)`` in this process, checked against every invariant; `Violation` if not."""
    before = scratch.snapshot()
    err, out = io.StringIO(), io.StringIO()
    with scratch_env(scratch), contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            status = cli.main(list(argv))
        except SystemExit as e:
            status = e.code if isinstance(e.code, int) else 1
            if status not in (0, 2):
                raise Violation(f"SystemExit({e.code!r})", f"argv={argv!r}") from None
        except SandboxError:
            status = 125  # escaped main's own handler, but is one of ours: tolerated
        except Exception as e:  # noqa: BLE001 - the point of the fuzz
            raise Violation(f"exception:{type(e).__name__}@{_where(e)}",
                            f"{type(e).__name__}: {str(e)[:300]!r}\nargv={_short(argv)}\n"
                            + "".join(traceback.format_exception(e)[-6:])) from None
    outcome = Outcome(status, err.getvalue(), out.getvalue())
    if currently_in_test_context():
        event(f"exit {status}")
    check_outcome(outcome, before, scratch, argv)
    return outcome


def _short(argv: Sequence[Any]) -> str:
    text = repr(list(argv))
    return text if len(text) < 600 else text[:600] + "..."


def check_outcome(o: Outcome, before: dict, scratch: Scratch, argv: Sequence[Any]) -> None:
    status = o.status
    if not (status in (0, RAN, 124) + REFUSALS or 128 < status < 128 + 65):
        raise Violation("exit-status", f"status {status} not documented; argv={_short(argv)}"
                                       f"\nstderr={o.stderr[-400:]!r}")
    if os.path.exists(NOWHERE):
        raise Violation("wrote-outside", f"{NOWHERE} was created; argv={_short(argv)}")
    if status == 0:  # the command exits 42: 0 is only --help's
        if not o.stdout.startswith("usage:"):
            raise Violation("exit-0", f"status 0 without --help; argv={_short(argv)}")
        return
    if status in REFUSALS:
        lines = o.stderr.splitlines()
        if status == 2:  # argparse may show the usage (wrapped: indented lines) first
            while lines and lines[0].startswith(("usage: ", " ")):
                lines.pop(0)
        if len(lines) != 1 or not lines[0].startswith("error: sandbox: ") \
                or not o.stderr.endswith("\n"):
            raise Violation("stderr-not-one-line", f"status {status}, stderr={o.stderr[:600]!r}"
                                                   f"; argv={_short(argv)}")
        after = scratch.snapshot()
        if after != before:
            created = sorted({os.path.basename(p) for p in set(after) - set(before)})
            changed = sorted(p for p in set(after) & set(before) if after[p] != before[p])
            if "marker" in created:
                key = "refusal-ran-command"
            elif created:
                key = "refusal-created:" + ",".join(created)
            else:
                key = "refusal-changed:" + ",".join(os.path.basename(p) for p in changed)
            raise Violation(key, f"status {status}, {o.stderr.strip()[:300]!r}; created "
                                 f"{created}, changed {changed}; argv={_short(argv)}")


#: Classes found while fuzzing whose fix belongs to another file (see the module docstring):
#: violation key → finding id. The replays are `FINDINGS` below.
KNOWN: dict[str, str] = {
    "refusal-created:.gitignore,.hcp-tmp": "F1",
    "exception:ValueError@receipt.py:check_output_path": "F2",
    "exception:AttributeError@cli_args.py:policy_from_args": "F3",
    "exception:ValueError@cli_args.py:policy_from_args": "F4",
    "refusal-changed:tmp": "F5/F6",
}
#: The findings still open: their replays are marked xfail and the fuzz targets tolerate
#: their keys. Close one by removing its id here (its replay then must pass).
OPEN: set[str] = set()  # F1-F6 are fixed: their replays must pass


def _open(finding: str) -> bool:
    return any(f.split("-")[0] in OPEN for f in finding.split("/"))


def tolerate(fn: Callable[[], Any]) -> None:
    """Run one example; a known, still-open class is counted (``event``), not failed."""
    try:
        fn()
    except Violation as v:
        if STRICT or v.key not in KNOWN or not _open(KNOWN[v.key]):
            raise
        event(f"known finding {KNOWN[v.key]} ({v.key})")


@pytest.fixture(scope="module", autouse=True)
def _nowhere_stays_absent() -> Iterator[None]:
    if os.path.exists(NOWHERE):
        pytest.skip(f"{NOWHERE} exists on this host")
    yield
    assert not os.path.exists(NOWHERE)


def one_in(n: int, draw: st.DrawFn) -> bool:
    """True with probability about 1/n."""
    return draw(st.sampled_from(range(n))) == 0


# -- strategies: values, nasty and valid ----------------------------------------------------------

nasty = st.one_of(
    st.sampled_from(["", " ", "-", "--", "\n", "a\nb", "a\rb", "\x00", "a\x00b", "\x1b[2J",
                     "\t", "é", "\udcff", "a\udc80b", "\u202e", "x" * 5000, "9" * 5000]),
    st.text(max_size=20),
    st.text(st.characters(codec="latin-1"), max_size=20),
)
dirs = st.one_of(
    st.sampled_from(["{S}/jail", "{S}/wr", "{S}/wr2", "{S}/ro", "{S}/ro/sub", "{S}/jail/",
                     "{S}/jail/../wr", "{S}//wr", "{S}/file", "{S}/missing", "jail", "./wr",
                     "", ".", "..", "/", "/etc", "/usr", "/proc/self", NOWHERE + "/d",
                     "{S}/a\nb", "{S}/\udcff", "{S}/" + "a" * 300, "{S}" + "/a" * 2100, "~",
                     "$HOME", "{S}/jail\x00x", "-"]),
    nasty)
files_out = st.one_of(
    st.sampled_from(["{S}/out/r.json", "{S}/out/", "{S}/missing/r.json", "{S}/jail", "-",
                     "r.json", "", "{S}/out/\udcff", "{S}/out/" + "a" * 300,
                     NOWHERE + "/r.json", "{S}/file/x"]),
    nasty)
host_patterns = st.one_of(
    st.sampled_from(["127.0.0.1:9", "example.com", "*.example.com", "[::1]:443", "10.0.0.0/8",
                     "*", "example.com:" + "9" * 5000, "10.0.0.0/" + "9" * 5000, "a@b",
                     "аpple.com", "example.com:0", "::ffff:127.0.0.1", ""]),
    nasty)
numbers = st.one_of(
    st.sampled_from(["1", "0", "-1", "nan", "inf", "-inf", "1e309", "2147483", "2147484",
                     "0.000001", "1e-320", "１", "٣", "²", "1_0", "0x10", "", " 1 ", "10" * 20,
                     "9" * 5000, "5e-324"]),
    st.integers(-10, 10 ** 30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    nasty)
limit_keys = st.sampled_from(["nofile", "nproc", "fsize", "as", "cpu", "tmp_size", "shm_size",
                              "output", "memory", "pids", "cpu_quota", "core", "", "NOFILE"])
limit_values = st.one_of(
    numbers,
    st.sampled_from(["unlimited", "512m", "1k", "1g", "1t", "1p", "0", "1", "64", "4096",
                     "1kib", "1 m", "m", "-1k", "0.5", "1e3", "²", "1" + "0" * 4400]),
)
limits = st.one_of(st.builds("{}={}".format, limit_keys, limit_values), nasty,
                   limit_keys)
env_items = st.one_of(
    st.builds("{}={}".format,
              st.sampled_from(["A", "FOO_BAR", "LANG", "PATH", "HOME", "LD_PRELOAD", "BASH_ENV",
                               "HCP_SANDBOX", "PYTHONPATH", "BASH_FUNC_x%%", "", "A B", "A\nB",
                               "é", "\udcff", "A\x00"]),
              nasty),
    nasty)
layers = st.one_of(st.sampled_from(["landlock", "seccomp", "netns", "userns", "mountns",
                                    "ipcns", "pidns", "namespaces", "all", "", "LANDLOCK"]),
                   nasty)
bins = st.one_of(st.sampled_from(["sh", "/bin/sh", "/usr/bin/sh", "bash", "dash", "", "../sh",
                                  "./sh", "s h", "sh\x00", "/", "bin/", "*"]), nasty)
principals = st.one_of(st.sampled_from(["alice", "default", "", ".", "..", "a/b", "\\",
                                        "a\x00b", "a\nb", "\x1b", "a" * 129, "é", "\udcff",
                                        "-"]), nasty)
packs = st.one_of(st.sampled_from(["{S}/pack/pack.toml", "{S}/pack/pack.json",
                                   "{S}/pack/bad.toml", "{S}/pack", "{S}/pack/missing.toml",
                                   "{S}/pack/pack.yaml", "{S}/file", NOWHERE + "/pack.toml",
                                   "pack.toml", "", "{S}/pack/pack.toml\x00"]), nasty)
policies = st.one_of(st.sampled_from(["{S}/policy.toml", "{S}/bad-policy.toml", "{S}/jail",
                                      "{S}/missing.toml", "/dev/null", "/proc/self/status",
                                      "policy.toml", "", NOWHERE + "/p.toml"]), nasty)

#: option → (valid values, nasty values); most draws take a valid one, so that a nasty value
#: is judged after all the others passed instead of hiding behind an earlier refusal.
OPTIONS: dict[str, tuple[st.SearchStrategy[str], st.SearchStrategy[str]]] = {
    "--jail": (st.sampled_from(["{S}/jail", "{S}/wr"]), dirs),
    "--write-root": (st.sampled_from(["{S}/wr", "{S}/wr2"]), dirs),
    "--read-only-root": (st.sampled_from(["{S}/ro", "{S}/ro/sub"]), dirs),
    "--system-root": (st.sampled_from(["/usr", "/bin", "/lib", "/lib64", "/etc"]), dirs),
    "--seccomp-profile": (st.sampled_from(["baseline", "socket-families", "network-off"]),
                          st.one_of(st.sampled_from(["nonexistent", "", "../../etc/passwd"]),
                                    nasty)),
    "--network": (st.sampled_from(["none", "host", "allow"]),
                  st.one_of(st.sampled_from(["NONE", "allow\n", "all"]), nasty)),
    "--allow-host": (st.sampled_from(["127.0.0.1:9", "example.test", "*.example.test:*"]),
                     host_patterns),
    "--deny-host": (st.sampled_from(["10.0.0.0/8", "deny.example.test"]), host_patterns),
    "--proxy-log": (st.just("{S}/out/proxy.log"), files_out),
    "--allow-bin": (st.sampled_from(["sh", "/bin/sh"]), bins),
    "--policy": (st.just("{S}/policy.toml"), policies),
    "--env": (st.sampled_from(["A=b", "FOO_BAR=x y", "LANG=C", "E="]), env_items),
    "--timeout": (st.sampled_from(["30", "5.5", "1e3"]), numbers),
    "--allow-degraded": (st.sampled_from(["landlock", "seccomp", "netns"]), layers),
    "--limit": (st.sampled_from(["nofile=64", "nproc=64", "fsize=1m", "as=4g", "cpu=10",
                                 "tmp_size=64m", "shm_size=1m", "output=1k", "nofile=unlimited"]),
                limits),
    "--on-exit": (st.sampled_from(["kill", "wait"]),
                  st.one_of(st.sampled_from(["KILL", ""]), nasty)),
    "--receipt": (st.sampled_from(["-", "{S}/out/r.json"]), files_out),
    "--pack": (st.sampled_from(["{S}/pack/pack.toml", "{S}/pack/pack.json"]), packs),
    "--principal": (st.sampled_from(["alice", "default"]), principals),
}
REPEATABLE = {"--write-root", "--read-only-root", "--allow-host", "--deny-host", "--allow-bin",
              "--env", "--allow-degraded", "--limit", "--system-root", "--seccomp-profile"}
FLAGS = ["--no-sandbox", "--native-local", "--bogus", "-x", "--", "--jail", "--help"]


#: Commands other than the marker: the same by its bare name, and ones refused with 126/127.
OTHER_COMMANDS = [["sh", "-c", "echo ran > marker; exit 42"], ["{S}/file"], ["{S}/missing"],
                  ["{S}/jail"], ["relative/sh"], ["no-such-command-hcp"], [""], ["\x00"],
                  ["/bin/sh\udcff"]]


#: option → what it needs to be accepted (added, mostly, when missing).
NEEDS = {"--allow-host": ("--network", "allow"), "--deny-host": ("--network", "allow"),
         "--proxy-log": ("--network", "allow"), "--principal": ("--pack", "{S}/pack/pack.toml")}


@st.composite
def run_argvs(draw: st.DrawFn) -> list[str]:
    """``run`` with a mix of options: mostly valid values and coherent combinations, so that a
    nasty value is judged after the others passed; odd spellings and shapes now and then."""
    argv = ["run" if not one_in(20, draw) else
            draw(st.sampled_from(["", "RUN", "bogus", "-x", "--help"]))]
    options: list[tuple[str, str]] = []
    for _ in range(draw(st.integers(0, 6))):
        if one_in(20, draw):
            options.append((draw(st.sampled_from(FLAGS[:-1] if argv[0] != "run" else FLAGS)),
                            ""))
            continue
        name = draw(st.sampled_from(sorted(OPTIONS)))
        if any(n == name for n, _ in options) and name not in REPEATABLE \
                and not one_in(10, draw):
            continue  # mostly once each: argparse refuses a repeated single-valued option
        valid, bad = OPTIONS[name]
        options.append((name, draw(valid if not one_in(5, draw) else bad)))
    names = {n for n, _ in options}
    for name in sorted(names):
        need = NEEDS.get(name)
        if need and need[0] not in names and not one_in(6, draw):
            options.append(need)
            names.add(need[0])
    if ("--network", "allow") in options and "--allow-host" not in names \
            and not one_in(6, draw):
        options.append(("--allow-host", "127.0.0.1:9"))
    if "--pack" in names and "--jail" in names and not one_in(6, draw):
        options = [o for o in options if o[0] != "--jail"]  # refused with --pack
    for name, value in options:
        if not value and name in FLAGS:
            argv.append(name)
        elif one_in(5, draw):
            argv.append(f"{name}={value}")
        else:
            argv += [name, value]
    if one_in(6, draw):
        argv += draw(st.sampled_from([["--no-sandbox", "--native-local"]] * 4
                                     + [["--no-sandbox"], ["--native-local"]]))
    command = MARKER_CMD if not one_in(6, draw) else draw(st.sampled_from(OTHER_COMMANDS))
    shape = draw(st.sampled_from(["--"] * 14 + ["bare", "none", "dash-only"]))
    if shape == "--":
        argv += ["--"] + command
    elif shape == "bare":
        argv += command
    elif shape == "dash-only":
        argv += ["--"]
    if "--help" in argv:
        argv = [a for a in argv if a != "--help"]  # --help is checked in test_help
    return argv


# -- CLI argv, in process -------------------------------------------------------------------------

@fuzz()
@given(run_argvs())
def test_cli_argv(template: list[str]) -> None:
    scratch = Scratch()
    try:
        tolerate(lambda: run_main([scratch.fill(a) for a in template], scratch))
    finally:
        scratch.remove()


def test_help_exits_zero_with_one_usage() -> None:
    scratch = Scratch()
    try:
        o = run_main(["run", "--help"], scratch)
        assert o.status == 0 and o.stdout.startswith("usage: hcp-linux run")
    finally:
        scratch.remove()


# -- policy files ---------------------------------------------------------------------------------

def toml_key(key: str) -> str:
    return json.dumps(key, ensure_ascii=False)


def toml_value(value: Any) -> str:
    """TOML for a value (inline tables and arrays); strings as basic strings."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(type(value))


def toml_document(data: dict[str, Any], tables: bool) -> str:
    """A TOML document; with ``tables``, table values as [sections] after the plain keys."""
    plain = [f"{toml_key(k)} = {toml_value(v)}" for k, v in data.items()
             if not (tables and isinstance(v, dict))]
    sections = [f"[{toml_key(k)}]\n" + "".join(f"{toml_key(kk)} = {toml_value(vv)}\n"
                                               for kk, vv in v.items())
                for k, v in data.items() if tables and isinstance(v, dict)]
    return "\n".join(plain) + "\n" + "\n".join(sections)


scalars = st.one_of(st.booleans(), st.integers(-2 ** 63, 2 ** 63 - 1),
                    st.floats(allow_nan=True), nasty)
wrong = st.one_of(scalars, st.lists(scalars, max_size=3),
                  st.dictionaries(st.text(max_size=5), scalars, max_size=3))
path_values = dirs
path_lists = st.lists(st.one_of(path_values, wrong), max_size=3)
limit_tables = st.dictionaries(
    limit_keys,
    st.one_of(st.integers(-2 ** 63, 2 ** 63 - 1), st.sampled_from([0, 1, 64, 4096, 2 ** 62]),
              limit_values, st.floats(allow_nan=True), st.booleans(), st.lists(st.integers(),
                                                                                  max_size=2)),
    max_size=4)
#: key → (valid values, nasty values).
POLICY_KEYS: dict[str, tuple[st.SearchStrategy[Any], st.SearchStrategy[Any]]] = {
    "jail": (st.sampled_from(["{S}/jail", "{S}/wr"]), st.one_of(dirs, wrong)),
    "write_roots": (st.sampled_from([[], ["{S}/wr"], ["{S}/wr", "{S}/wr2"]]), path_lists),
    "read_only_roots": (st.sampled_from([[], ["{S}/ro"], ["{S}/ro/sub"]]), path_lists),
    "system_roots": (st.just(["/usr", "/bin", "/lib", "/lib64", "/etc"]), path_lists),
    "network": (st.sampled_from(["none", "host", "allow"]), wrong),
    "allow_bins": (st.sampled_from([["sh"], ["/bin/sh", "true"]]),
                   st.one_of(st.lists(bins, max_size=3), wrong)),
    "env": (st.sampled_from([{}, {"A": "b"}, {"GREETING": "hello there", "E": ""}]),
            st.one_of(st.dictionaries(st.one_of(st.sampled_from(["A", "LD_PRELOAD", "HOME",
                                                                 "PATH", ""]), nasty),
                                      st.one_of(nasty, wrong), max_size=3), wrong)),
    "allow_degraded": (st.sampled_from([[], ["landlock"], ["seccomp", "netns"]]),
                       st.one_of(st.lists(layers, max_size=3), wrong)),
    "sandbox": (st.just(True), wrong), "native_local": (st.just(False), wrong),
    "nativeLocal": (st.just(False), st.booleans()),
    "seccomp_profiles": (st.sampled_from([["baseline"], ["baseline", "socket-families"]]),
                         st.one_of(st.sampled_from([[], ["nonexistent"], ["../../etc/passwd"]]),
                                   st.lists(nasty, max_size=2), wrong)),
    "timeout": (st.sampled_from([30, 5.5, 2147483]),
                st.one_of(st.floats(allow_nan=True), st.integers(-2 ** 63, 2 ** 63 - 1),
                          st.sampled_from([0, 0.001, 2147484, 1e-300]), wrong)),
    "allow_hosts": (st.sampled_from([["127.0.0.1:9"], ["example.test", "*.example.test:8080"]]),
                    st.one_of(st.lists(host_patterns, max_size=3), wrong)),
    "deny_hosts": (st.sampled_from([[], ["10.0.0.0/8"]]),
                   st.one_of(st.lists(host_patterns, max_size=3), wrong)),
    "proxy_log": (st.just("{S}/out/proxy.log"), st.one_of(files_out, wrong)),
    "limits": (st.sampled_from([{}, {"nofile": 64}, {"nproc": 64, "fsize": "1m"},
                                {"as": "unlimited", "tmp_size": "64m", "output": 1024}]),
               st.one_of(limit_tables, wrong)),
    "on_exit": (st.sampled_from(["kill", "wait"]), wrong),
    "bogus": (wrong, wrong),
}


@st.composite
def policy_texts(draw: st.DrawFn) -> bytes:
    """Policy files: mostly valid keys and values with a nasty one or two; now and then raw
    text, bytes that are not UTF-8, or a valid document cut and spliced."""
    if one_in(10, draw):
        return draw(st.one_of(st.text(max_size=200).map(lambda t: t.encode("utf-8",
                                                                            "surrogatepass")),
                              st.binary(max_size=200)))
    keys = draw(st.lists(st.sampled_from(sorted(POLICY_KEYS)), max_size=6, unique=True))
    data = {}
    for k in keys:
        valid, bad = POLICY_KEYS[k]
        data[k] = draw(valid if not one_in(5, draw) else bad)
    if ("allow_hosts" in data or "deny_hosts" in data or "proxy_log" in data) \
            and "network" not in data and not one_in(6, draw):
        data["network"] = "allow"
    if data.get("network") == "allow" and "allow_hosts" not in data and not one_in(6, draw):
        data["allow_hosts"] = ["127.0.0.1:9"]
    text = toml_document(data, tables=draw(st.booleans()))
    if one_in(20, draw):  # near-valid text, cut or spliced
        cut = draw(st.integers(0, len(text)))
        text = text[:cut] + draw(st.text(max_size=5)) + text[cut:]
    return text.encode("utf-8", "surrogatepass")


def _policy_example(text: bytes, extra: Sequence[str]) -> None:
    scratch = Scratch()
    try:
        text = scratch.fill_bytes(text)
        Path(scratch.root, "fuzz-policy.toml").write_bytes(text)
        argv = ["run", "--policy", os.path.join(scratch.root, "fuzz-policy.toml"),
                *[scratch.fill(a) for a in extra], "--", *MARKER_CMD]
        tolerate(lambda: run_main(argv, scratch))
    finally:
        scratch.remove()


@fuzz()
@given(policy_texts(), st.sampled_from([[], [], ["--jail", "{S}/jail"], ["--network", "none"],
                                         ["--limit", "nofile=64"], ["--timeout", "5"]]))
@example(b'limits = { nofile = 9223372036854775807 }', [])
@example(b'timeout = 1e400', [])
def test_policy_file(text: bytes, extra: list[str]) -> None:
    _policy_example(text, extra)


# -- pack manifests -------------------------------------------------------------------------------

flag_names = st.one_of(st.sampled_from(["--file", "-o", "--output", "--x=y", "-", "--", "o",
                                        "---a", "-é", "--a b", ""]), nasty)
env_names = st.one_of(st.sampled_from(["HOME", "A", "_x", "PATH", "LD_PRELOAD", "HCP_SANDBOX",
                                       "1A", "A-B", "", "é"]), nasty)
WORKSPACE_KEYS: dict[str, tuple[st.SearchStrategy[Any], st.SearchStrategy[Any]]] = {
    "mode": (st.sampled_from(["none", "ephemeral", "workspace"]),
             st.one_of(st.sampled_from(["NONE", ""]), wrong)),
    "home_env": (st.sampled_from([["HOME"], ["MYHOME"], []]),
                 st.one_of(st.lists(env_names, max_size=3), wrong)),
    "file_flags": (st.sampled_from([["--file"], [], ["--output", "-o", "--in"]]),
                   st.one_of(st.lists(flag_names, max_size=3), wrong)),
    "driver": (st.just("linux"), st.just("linux")),
    "bogus": (wrong, wrong),
}
WRAP_KEYS: dict[str, tuple[st.SearchStrategy[Any], st.SearchStrategy[Any]]] = {
    "bin": (st.sampled_from(["sh", ["sh"], ["sh", "bin/tool"], ["/bin/sh"]]),
            st.one_of(st.lists(st.one_of(bins, st.sampled_from(
                ["bin/tool", "../outside", "bin/../../x", "/bin/sh", "sh"])), max_size=3),
                bins, wrong)),
    "agent_env": (st.sampled_from([{}, {"A": "b"}, {"GREETING": "hi there", "E": ""}]),
                  st.one_of(st.dictionaries(env_names, st.one_of(nasty, wrong), max_size=3),
                            wrong)),
    "agentEnv": (wrong, wrong),
}
RARE_KEYS = ("bogus", "agentEnv", "driver")


def _table(draw: st.DrawFn, keys: dict, required: Sequence[str] = ()) -> dict[str, Any]:
    """Mostly valid values; a key left out, a nasty value or an unknown key now and then."""
    out: dict[str, Any] = {}
    for key, (valid, bad) in keys.items():
        if key not in required and one_in(3, draw):
            continue
        if key in RARE_KEYS and not one_in(6, draw):
            continue
        out[key] = draw(valid if not one_in(5, draw) else bad)
    return out


@st.composite
def manifests(draw: st.DrawFn) -> tuple[str, bytes]:
    """(extension, bytes): near-valid manifests as TOML or JSON, now and then raw bytes."""
    ext = draw(st.sampled_from([".toml", ".json"]))
    if one_in(20, draw):
        return ext, draw(st.binary(max_size=200))
    wrap = _table(draw, WRAP_KEYS, required=("bin",) if not one_in(10, draw) else ())
    if draw(st.booleans()):
        wrap["workspace"] = (_table(draw, WORKSPACE_KEYS) if not one_in(10, draw)
                             else draw(wrong))
    doc: dict[str, Any] = {}
    if draw(st.booleans()):
        doc["name"] = draw(st.sampled_from(["hello", "my-pack"]) if not one_in(4, draw)
                           else st.one_of(st.sampled_from(["", " ", "a/b", "..", "\x00"]),
                                          nasty, wrong))
    if one_in(6, draw):
        doc["description"] = draw(nasty)
    if not one_in(20, draw):
        doc["wrap"] = wrap if not one_in(20, draw) else draw(wrong)
    if ext == ".json":
        text = json.dumps(doc, ensure_ascii=draw(st.booleans()), allow_nan=True)
    elif not isinstance(doc.get("wrap"), dict):
        text = toml_document(doc, tables=False)
    else:
        text = toml_document({k: v for k, v in doc.items() if k != "wrap"}, tables=False)
        text += toml_document({"wrap": {k: v for k, v in doc["wrap"].items()
                                        if not isinstance(v, dict)}}, tables=True)
        for k, v in doc["wrap"].items():
            if isinstance(v, dict):
                text += f"\n[wrap.{toml_key(k)}]\n" + "".join(
                    f"{toml_key(kk)} = {toml_value(vv)}\n" for kk, vv in v.items())
    return ext, text.encode("utf-8", "surrogatepass")


def _check_pack(pack: Pack) -> None:
    assert os.path.isabs(pack.root) and os.path.isdir(pack.root)
    assert pack.bins and all(isinstance(b, str) and b and "\0" not in b for b in pack.bins)
    for b in pack.bins:
        assert "/" not in b or os.path.isabs(b)
    for k, v in pack.agent_env.items():
        assert isinstance(k, str) and isinstance(v, str) and "\0" not in v
    assert pack.workspace.mode in ("none", "ephemeral", "workspace")


def _pack_example(ext: str, raw: bytes, principal: str | None, through_cli: bool) -> None:
    scratch = Scratch()
    try:
        raw = scratch.fill_bytes(raw)
        path = os.path.join(scratch.root, "pack", "fuzz" + ext)
        Path(path).write_bytes(raw)

        def load() -> None:
            before = scratch.snapshot()
            try:
                pack = load_pack(path)
            except PackError as e:
                if "\n" in str(e):
                    raise Violation("pack-error-multiline", f"{str(e)[:300]!r}") from None
            except Exception as e:  # noqa: BLE001
                raise Violation(f"exception:{type(e).__name__}@{_where(e)}",
                                f"{type(e).__name__}: {str(e)[:300]!r}; manifest={raw[:300]!r}"
                                ) from None
            else:
                _check_pack(pack)
            if scratch.snapshot() != before:
                raise Violation("load-pack-wrote", f"manifest={raw[:300]!r}")

        tolerate(load)
        if through_cli:
            argv = ["run", "--pack", path]
            if principal is not None:
                argv += ["--principal", scratch.fill(principal)]
            argv += ["--", *MARKER_CMD]
            tolerate(lambda: run_main(argv, scratch))
    finally:
        scratch.remove()


@fuzz()
@given(manifests(), st.one_of(st.none(), principals), st.sampled_from(range(4)))
def test_pack_manifest(manifest: tuple[str, bytes], principal: str | None, how: int) -> None:
    """Every manifest through load_pack; one in four also through ``run --pack``."""
    _pack_example(manifest[0], manifest[1], principal, through_cli=how == 0)


# -- the real program, a few examples -------------------------------------------------------------

def _real_cli(argv: list[bytes], scratch: Scratch) -> Outcome:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
           "TMPDIR": os.path.join(scratch.root, "tmp"),
           "XDG_STATE_HOME": os.path.join(scratch.root, "state")}
    before = scratch.snapshot()
    proc = subprocess.run([sys.executable.encode(), b"-m", b"hcp_linux", *argv],
                          cwd=os.path.join(scratch.root, "cwd"), env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, timeout=120)
    stderr = proc.stderr.decode("utf-8", "backslashreplace")
    if "Traceback (most recent call last)" in stderr:
        last = stderr.strip().splitlines()[-1]
        raise Violation(f"traceback:{last.split(':', 1)[0]}", f"{stderr[-1500:]}\nargv={argv!r}")
    o = Outcome(proc.returncode, stderr, proc.stdout.decode("utf-8", "backslashreplace"))
    check_outcome(o, before, scratch, argv)
    return o


@fuzz(ci=12, long=200)
@given(run_argvs(), st.booleans())
def test_real_cli(template: list[str], raw_bytes: bool) -> None:
    """The program itself, with argv as bytes (not always UTF-8)."""
    scratch = Scratch()
    try:
        argv = [os.fsencode(scratch.fill(a)) for a in template if "\x00" not in a]
        if raw_bytes:
            argv = [a.replace(b"\xc3\xa9", b"\xe9\xff") for a in argv]
        tolerate(lambda: _real_cli(argv, scratch))
    finally:
        scratch.remove()


# -- the classes found, replayed ------------------------------------------------------------------

@dataclass(frozen=True)
class Finding:
    id: str
    kind: str            # argv | policy | pack
    data: Any            # argv template, policy text, or (ext, manifest bytes)
    reason: str


FINDINGS: list[Finding] = [
    Finding("F1", "argv", ["run", "--env=LD_PRELOAD=", "--no-sandbox", "--native-local", "--",
                           *MARKER_CMD],
            "F1: refused env key, but <jail>/.hcp-tmp was created first (plan.py makes it "
            "before build_env's check; Policy does not refuse injection keys)"),
    Finding("F2", "argv", ["run", "--network", "allow", "--allow-host", "127.0.0.1:9",
                           "--proxy-log=\x00", "--", *MARKER_CMD],
            "F2: ValueError 'embedded null byte' from receipt.check_output_path (cli.py)"),
    Finding("F3-env", "argv", ["run", "--env=--", "--", *MARKER_CMD],
            "F3: AttributeError in cli.policy_from_args: argparse turns the value '--' of an "
            "append option into []"),
    Finding("F3-limit", "argv", ["run", "--limit=--", "--", *MARKER_CMD],
            "F3: AttributeError in cli.policy_from_args (--limit=--)"),
    Finding("F4-superscript", "argv", ["run", "--limit=nofile=\u00b2", "--", *MARKER_CMD],
            "F4: ValueError from int('²') in cli.policy_from_args (str.isdigit)"),
    Finding("F4-digits", "argv", ["run", "--limit", "nofile=" + "9" * 5000, "--", *MARKER_CMD],
            "F4: ValueError from int() of 5000 digits in cli.policy_from_args"),
    Finding("F5", "argv", ["run", "--pack={S}/pack/pack.toml", "--env=LD_PRELOAD=", "--",
                           *MARKER_CMD],
            "F5: with --pack, a refused env key is found after the ephemeral jail was made "
            "(TMPDIR changed): the driver's checks do not cover the policy's env"),
    Finding("F6", "argv", ["run", "--pack={S}/pack/pack.toml", "--", "relative/sh"],
            "F6: with --pack, a pack-relative bin that does not exist is found (127) after "
            "the ephemeral jail was made (TMPDIR changed): check() does not resolve the bin"),
]


def _replay(f: Finding) -> None:
    scratch = Scratch()
    try:
        if f.kind == "argv":
            run_main([scratch.fill(a) for a in f.data], scratch)
        elif f.kind == "policy":
            Path(scratch.root, "fuzz-policy.toml").write_bytes(scratch.fill_bytes(f.data))
            run_main(["run", "--policy", os.path.join(scratch.root, "fuzz-policy.toml"), "--",
                      *MARKER_CMD], scratch)
        else:
            ext, raw = f.data
            path = os.path.join(scratch.root, "pack", "fuzz" + ext)
            Path(path).write_bytes(scratch.fill_bytes(raw))
            run_main(["run", "--pack", path, "--", *MARKER_CMD], scratch)
    finally:
        scratch.remove()


@pytest.mark.parametrize("finding", [
    pytest.param(f, id=f.id, marks=[pytest.mark.xfail(strict=False, reason=f.reason)]
                 if _open(f.id) else [])
    for f in FINDINGS])
def test_known_finding(finding: Finding) -> None:
    _replay(finding)
