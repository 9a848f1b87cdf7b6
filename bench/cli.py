"""Every way a user starts a confined /bin/true, beside the alternatives, in one interleaved run.

    python bench/cli.py [--runs N] [--json FILE] [--plain-install]

``--plain-install``: the CLI rows (and ``python -c pass``) from a fresh virtual environment
with this checkout installed as a user installs it (``pip install .``, not editable), made
for this run and removed after it. The dev venv's editable install adds a finder to every
start-up (~9 ms: pathlib, re...), which ``python -c pass`` pays too: its ratios flatter.

Rows (each in four passes over all rows, so that the host's drift falls on every row alike):
this venv's `python -c pass` (the interpreter's own start-up: the unit of issue #35's goal),
util-linux `unshare -Urnmpi --fork --mount-proc` (the namespaces alone), bubblewrap with
isolation equivalent to the default policy (bench/spawn.py's), then hcp-linux:

- ``in-process``: ``Sandbox(policy).run([...])`` from this (warm) process;
- ``session``: ``Session.run`` in one long-lived session (the confinement made once);
- ``CLI, cold caches``: `hcp-linux run -- /bin/true`, a fresh process with an empty
  ``HCP_LINUX_SECCOMP_CACHE`` (its seccomp programs compiled by libseccomp, then cached);
- ``CLI``: the same with that cache filled, as every run after a user's first;
- ``CLI, served``: with ``HCP_LINUX_SERVER`` naming a warm `hcp-linux serve`;
- ``CLI, auto``: with ``HCP_LINUX_SERVER=auto``, once the first run has started the user's
  own server (hcp_linux.cli.auto_server): every run after a user's first;
- the served and auto rows again through ``hcp-linux-py``, the Python command, when
  ``hcp-linux`` is the native client (a wheel's install, hcp_linux/native/hcp_client.c).

When present, the peers' own command lines run the same /bin/true in the same rounds:
Codex's ``codex sandbox -- /bin/true`` (``codex sandbox linux --`` before codex-cli 0.171;
``HCP_BENCH_CODEX`` names the binary, else
``codex`` on PATH) and Anthropic's sandbox-runtime, ``srt /bin/true`` (``HCP_BENCH_SRT``,
else ``srt``). Each is tried once first; one that fails here is left out, with why.

There is no plan cache on disk (docs/changelog.md: issue #35's measurements): what a
fresh CLI process can find warm is the seccomp program cache and the auto server. Reports medians and p95 (ms) and the ratios
the goals are stated in. Timing only: nothing here asserts a limit.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Callable, Iterator

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from hcp_linux import Policy, Sandbox  # noqa: E402
from hcp_linux.session import Session  # noqa: E402
from spawn import NAMESPACES_ALONE, PY, TRUE, _server, bwrap, checked  # noqa: E402
from timing import measure_rows, summary  # noqa: E402

PASS = "python -c pass (same venv)"
BWRAP = "bubblewrap (equivalent isolation + seccomp)"
COLD = "hcp-linux run, CLI, cold caches"
CLI = "hcp-linux run, CLI (seccomp cache warm)"
SERVED = "hcp-linux run, CLI, served"
AUTO = "hcp-linux run, CLI, HCP_LINUX_SERVER=auto (started)"
SERVED_PY = "hcp-linux-py run (the Python command), served"
AUTO_PY = "hcp-linux-py run (the Python command), auto (started)"
IN_PROCESS = "hcp-linux in-process (Sandbox.run)"
SESSION = "hcp-linux session (Session.run)"


def cold_cli(argv: list[str], where: str) -> Callable[[], None]:
    """The CLI with an empty cache directory of its own, each time."""
    def run() -> None:
        cache = tempfile.mkdtemp(prefix="cache-", dir=where)
        try:
            subprocess.run(argv, check=True, stdout=subprocess.DEVNULL,
                           env=dict(os.environ, HCP_LINUX_SECCOMP_CACHE=cache))
        finally:
            shutil.rmtree(cache)
    return run


@contextlib.contextmanager
def auto_server(argv: list[str], where: str) -> Iterator[dict[str, str]]:
    """The environment of an ``auto`` run whose server the first run started (in a runtime
    directory of this bench's own); that server is ended, by its pid, afterwards."""
    runtime = tempfile.mkdtemp(prefix="run-user-", dir=where)
    env = dict(os.environ, HCP_LINUX_SERVER="auto", XDG_RUNTIME_DIR=runtime)
    where = os.path.join(runtime, "hcp-linux")
    try:
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=env)
        deadline = time.monotonic() + 30
        while not any(_answers(os.path.join(where, name)) for name in
                      (os.listdir(where) if os.path.isdir(where) else ())
                      if name.endswith(".sock")):
            if time.monotonic() > deadline:
                raise RuntimeError("the auto server did not start")
            time.sleep(0.01)
        yield env
    finally:
        for pid in _auto_servers(runtime):
            os.kill(pid, signal.SIGTERM)


def _answers(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(path)
            return True
        except OSError:
            return False


def _auto_servers(runtime: str) -> list[int]:
    want = b"XDG_RUNTIME_DIR=" + os.fsencode(runtime)
    out = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if not f.read().endswith(b"\0serve\0--auto\0"):
                    continue
            with open(f"/proc/{name}/environ", "rb") as f:
                if want in f.read().split(b"\0"):
                    out.append(int(name))
        except OSError:
            continue
    return out


def _native(command: str) -> bool:
    """Whether ``command`` is the native client (an ELF), not the Python command."""
    try:
        with open(command, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


@contextlib.contextmanager
def plain_install() -> Iterator[str]:
    """A fresh virtual environment with this checkout installed by pip (its python)."""
    where = tempfile.mkdtemp(prefix="hcp-bench-venv-")
    try:
        subprocess.run([sys.executable, "-m", "venv", where], check=True)
        py = os.path.join(where, "bin", "python")
        subprocess.run([py, "-m", "pip", "install", "-q", os.path.dirname(HERE)], check=True,
                       stdout=subprocess.DEVNULL)
        yield py
    finally:
        shutil.rmtree(where, ignore_errors=True)


def peers() -> list[tuple[str, list[str]]]:
    """The peers' sandbox command lines found here that run /bin/true (tried once)."""
    out = []
    for label, env, name, argvs in (
            # `codex sandbox -- CMD` (codex-cli 0.171), `codex sandbox linux -- CMD` before
            ("codex sandbox (Codex CLI)", "HCP_BENCH_CODEX", "codex",
             (["sandbox", "--", TRUE], ["sandbox", "linux", "--", TRUE])),
            ("srt (Anthropic sandbox-runtime)", "HCP_BENCH_SRT", "srt", ([TRUE],))):
        binary = os.environ.get(env) or shutil.which(name)
        if not binary:
            continue
        why = None
        for argv in argvs:
            try:
                subprocess.run([binary, *argv], check=True, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, timeout=60)
            except (OSError, subprocess.SubprocessError) as e:
                why = e
                continue
            out.append((label, [binary, *argv]))
            break
        else:
            print(f"left out: {label} ({binary}): {why}", file=sys.stderr)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=60, help="samples per row")
    ap.add_argument("--json", default=os.path.join(HERE, "results", "cli.json"))
    ap.add_argument("--plain-install", action="store_true",
                    help="the CLI rows from a fresh `pip install .` (not editable)")
    args = ap.parse_args()
    with contextlib.ExitStack() as stack:
        py = stack.enter_context(plain_install()) if args.plain_install else PY
        return bench(args, py)


def bench(args: argparse.Namespace, py: str) -> int:
    n = args.runs
    jail = tempfile.mkdtemp(prefix="hcp-bench-cli-")
    caches = tempfile.mkdtemp(prefix="hcp-bench-caches-")
    cli = os.path.join(os.path.dirname(py), "hcp-linux")
    try:
        sandbox = Sandbox(Policy(jail=jail))
        run_true = [cli, "run", "--jail", jail, "--", TRUE]
        rows: list[tuple[str, Callable[[], object], int]] = [(PASS, checked([py, "-c", "pass"]), n)]
        if shutil.which("unshare"):
            rows.append((NAMESPACES_ALONE, checked(["unshare", "-Urnmpi", "--fork",
                                                    "--kill-child", "--mount-proc", TRUE]), n))
        if shutil.which("bwrap"):
            from hcp_linux import seccomp_profiles
            rows.append((BWRAP, bwrap(jail, seccomp_profiles.compile_profiles(("baseline",)),
                                      [TRUE]), n))
        rows += [(name, checked(argv), n) for name, argv in peers()]
        rows += [(IN_PROCESS, lambda: sandbox.run([TRUE], stdout=subprocess.DEVNULL), n),
                 (COLD, cold_cli(run_true, caches), max(10, n // 2)),
                 (CLI, checked(run_true), n)]
        python = cli + "-py"  # the Python command, when `hcp-linux` is the native client
        with _server(jail, py) as served_env, Session(sandbox) as session, \
                auto_server(run_true, caches) as auto_env:
            rows += [(SERVED, checked(run_true, env=served_env), n),
                     (AUTO, checked(run_true, env=auto_env), n),
                     (SESSION, lambda: session.run([TRUE]), n)]
            if _native(cli) and os.path.exists(python):
                run_py = [python, *run_true[1:]]
                rows += [(SERVED_PY, checked(run_py, env=served_env), n),
                         (AUTO_PY, checked(run_py, env=auto_env), n)]
            samples = measure_rows(rows)
        results = {name: summary(s) for name, s in samples.items()}
    finally:
        shutil.rmtree(jail, ignore_errors=True)
        shutil.rmtree(caches, ignore_errors=True)
    med = {name: r["median_ms"] for name, r in results.items()}
    ratios = {f"{name} / python -c pass": round(med[name] / med[PASS], 3)
              for name in (COLD, CLI, SERVED, AUTO, SERVED_PY, AUTO_PY) if name in med}
    if BWRAP in med:
        ratios.update({f"{name} / bubblewrap": round(med[name] / med[BWRAP], 3)
                       for name in (CLI, SERVED, AUTO, IN_PROCESS, SESSION)
                       if name in med})
    w = max(len(name) for name in results) + 2
    print(f"{'/bin/true':<{w}}  {'median ms':>9}  {'p95 ms':>8}  runs")
    for name, r in results.items():
        print(f"{name:<{w}}  {r['median_ms']:>9.3f}  {r['p95_ms']:>8.3f}  {r['runs']}")
    print()
    for k, v in ratios.items():
        print(f"{k}: {v}")
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"results": results, "ratios": ratios, "uname": os.uname().release,
                   "euid": os.geteuid(), "cpus": os.cpu_count(),
                   "install": "plain" if args.plain_install else "dev venv"}, f, indent=2)
    print(f"(json: {args.json})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
