"""What every conformance check needs: scratch directories, bounded runs of the sandbox through
its public surfaces (Python API, the `hcp-linux` CLI, the HCP driver), unconfined controls,
loopback listeners, and clean-up of everything a check started.

Nothing here is mocked: every "run" is a real process on the real kernel. Every wait is bounded
by :attr:`Harness.timeout`. Processes a check starts are ended by their pid when it finishes.
What watches those processes from outside (/proc, listeners) is in :mod:`.observers`.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ..policy.allowlist import SANDBOX_PATH
from ..policy.layers import POLICY_FILE, PRESET, Layer, combine
from ..policy.policy import Policy, expand_layers
from .observers import Listener
from .policy_base import PolicyBase

#: Seconds any single run, control or wait of a check may take.
DEFAULT_TIMEOUT = 30.0
#: How much of a process's output an evidence line keeps.
SHOW_LIMIT = 600

PASS, FAIL, NOT_APPLICABLE = "pass", "fail", "not-applicable"


class Fail(Exception):
    """The rule is violated here (the evidence says how)."""


class NotApplicable(Exception):
    """The rule cannot be judged on this host (the evidence says why)."""


@dataclass
class Evidence:
    """What a check tried, what happened, and what the unconfined control did.

    ``require`` records a violation (the check fails); ``control_ok`` records a control that
    did not behave (the check cannot be judged: not applicable, never pass). A violation
    observed in the sandbox fails the check whatever the control did: it is proven.
    """

    tried: list[str] = field(default_factory=list)
    observed: list[str] = field(default_factory=list)
    control: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    control_failures: list[str] = field(default_factory=list)

    def try_(self, text: str) -> None:
        self.tried.append(text)

    def saw(self, text: str) -> None:
        self.observed.append(text)

    def ctl(self, text: str) -> None:
        self.control.append(text)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def require(self, ok: bool, problem: str) -> bool:
        if not ok:
            self.problems.append(problem)
        return ok

    def control_ok(self, ok: bool, problem: str) -> bool:
        if not ok:
            self.control_failures.append(problem)
        return ok

    def as_dict(self) -> dict[str, list[str]]:
        return {"tried": list(self.tried), "observed": list(self.observed),
                "control": list(self.control), "notes": list(self.notes)}


def shown(data: bytes | str | None, limit: int = SHOW_LIMIT) -> str:
    """Process output for an evidence line: decoded, one line, bounded."""
    if data is None:
        return ""
    text = data.decode(errors="replace") if isinstance(data, bytes) else data
    text = text.replace("\n", "\\n")
    return text if len(text) <= limit else text[:limit] + f"...(+{len(text) - limit} chars)"


def proc_summary(p: Any) -> str:
    """``rc=.. stdout=.. stderr=..`` of a CompletedProcess or CompletedRun."""
    return f"rc={p.returncode} stdout={shown(p.stdout)!r} stderr={shown(p.stderr)!r}"


def layer_refusal(stderr: bytes | str | None) -> str | None:
    """The CLI's one-line refusal for a layer this host cannot provide, if that is what
    ``stderr`` holds (exit 125): the check cannot be judged then."""
    text = stderr.decode(errors="replace") if isinstance(stderr, bytes) else (stderr or "")
    for line in text.splitlines():
        if line.startswith("error: sandbox: ") and " unavailable: " in line \
                and "--allow-degraded" in line:
            return line
    return None


def _fitted(table: Mapping[str, Any], own_network: bool, native: bool) -> dict[str, Any]:
    """A base layer's table for one of a check's runs: for a check that sets its own
    network, the hosts go with it; for a native-local run, the carve-outs (no mount view)."""
    drop = (("allow_hosts", "deny_hosts") if own_network else ()) \
        + (("read_only_paths", "hidden_paths") if native else ())
    return {k: v for k, v in table.items() if k not in drop}


def base_parent() -> str:
    """Scratch space outside /tmp when possible: the sandbox's /tmp is a private tmpfs, so a
    jail under /tmp has a parent that exists (empty) inside the sandbox; one under /var/tmp
    has a parent on the view's read-only root, the stricter and more telling case."""
    for d in ("/var/tmp", tempfile.gettempdir()):
        if os.path.isdir(d) and os.access(d, os.W_OK | os.X_OK):
            return d
    return tempfile.gettempdir()


#: The CLI's runs of a check read no config (hcp_linux.cli.config): the checks measure the
#: engine under the configuration given on their own command lines, never under the caller's
#: ~/.config/hcp-linux/policy.toml (a read-only jail there would fail every check that writes).
_NO_CONFIG = {"HCP_LINUX_NO_CONFIG": "1"}


def _package_parent() -> str:
    """The directory hcp_linux is in (this file is hcp_linux/conformance/harness.py)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def system_python() -> str:
    """The interpreter the checks' probe programs run under, inside and outside the sandbox:
    the system's python3 on the sandbox's fixed PATH (readable by every user, inside the
    read-only system roots), else this interpreter."""
    for d in SANDBOX_PATH:
        candidate = os.path.join(d, "python3")
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return sys.executable


def _rm_tree(path: str) -> None:
    """Remove a scratch tree even where a check (or a sandboxed command) left a directory
    without write or search permission."""
    def onerror(_fn: Any, p: str, _exc: Any) -> None:
        try:
            parent = os.path.dirname(p)
            os.chmod(parent, stat.S_IRWXU)
            if os.path.isdir(p) and not os.path.islink(p):
                os.chmod(p, stat.S_IRWXU)
                shutil.rmtree(p, ignore_errors=True)
            else:
                os.unlink(p)
        except OSError:
            pass
    if os.path.lexists(path):
        shutil.rmtree(path, onerror=onerror)


class Harness:
    """Shared state of one conformance run. Use as a context manager; call :meth:`begin` and
    :meth:`end` around each check (the runner does).

    ``allow_degraded`` is the configuration under test: it goes into every Policy the checks
    build, every CLI invocation (``--allow-degraded``) and every driver.
    """

    def __init__(self, allow_degraded: Iterable[str] = (), *, timeout: float = DEFAULT_TIMEOUT,
                 base_dir: str | None = None,
                 preset: tuple[str, Mapping[str, Any]] | None = None,
                 policy_file: PolicyBase | None = None, executor: str | None = None) -> None:
        self.allow_degraded: tuple[str, ...] = tuple(allow_degraded)
        #: (name, table): the named policy each check's runs start from, or None
        self.preset = preset
        #: a user's policy file, fitted to the checks' jails (.policy_base), over the preset
        self.policy_file = policy_file
        #: the executor every run uses (the CLI's hidden --executor), None: the default
        self.executor = executor
        expand_layers(self.allow_degraded)  # unknown layer names: PolicyError, here
        self.timeout = float(timeout)
        self.python = system_python()
        self.base = Path(tempfile.mkdtemp(prefix="hcp-conformance-",
                                          dir=base_dir or base_parent()))
        os.chmod(self.base, 0o755)
        self._layers: list[Layer] = []
        if preset is not None:
            self._layers.append(Layer(PRESET, preset[0], preset[1]))
        #: (own network, native-local) -> the fitted file a CLI run of that kind reads
        self._policy_files: dict[tuple[bool, bool], str] = {}
        if policy_file is not None:
            self._layers.append(Layer(POLICY_FILE, policy_file.path, policy_file.table))
            for own_network in (False, True):
                for native in (False, True):
                    self._policy_files[own_network, native] = self._write_policy(
                        _fitted(policy_file.table, own_network, native),
                        f"policy-{int(own_network)}{int(native)}.toml")
        self.dir = self.base
        self.ev = Evidence()
        self._procs: list[subprocess.Popen] = []
        self._fds: list[int] = []
        self._sockets: list[socket.socket] = []
        self._cache: dict[str, Any] = {}
        self.degraded_seen: dict[str, str] = {}

    # --- lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> "Harness":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def begin(self, check_id: str) -> Evidence:
        self.dir = self.base / check_id
        self.dir.mkdir(mode=0o755)
        self.ev = Evidence()
        return self.ev

    def end(self) -> None:
        """End what the check started (by pid), close its fds and sockets, remove its files."""
        for proc in self._procs:
            self.stop(proc)
        self._procs.clear()
        for s in self._sockets:
            s.close()
        self._sockets.clear()
        for fd in self._fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds.clear()
        _rm_tree(str(self.dir))
        self.dir = self.base

    def close(self) -> None:
        self.end()
        _rm_tree(str(self.base))

    # --- scratch space --------------------------------------------------------------------

    def mkdir(self, name: str, mode: int = 0o755) -> Path:
        d = self.dir / name
        d.mkdir(parents=True, mode=mode)
        os.chmod(d, mode)
        return d

    def write(self, path: Path, text: str, mode: int | None = None) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if mode is not None:
            os.chmod(path, mode)
        return path

    def fd(self, fd: int) -> int:
        """Close ``fd`` when the check ends."""
        self._fds.append(fd)
        return fd

    # --- the configuration under test -----------------------------------------------------

    def _write_policy(self, table: Mapping[str, Any], name: str) -> str:
        """The fitted policy file's table as a file the checks' CLI runs read (--policy)."""
        from ..policy import toml_text
        assert self.policy_file is not None
        path = self.base / name
        path.write_text(toml_text.dump(table, [f"{self.policy_file.path}, fitted to the "
                                               "conformance checks' jails"]))
        os.chmod(path, 0o644)
        return str(path)

    def base_fields(self, own_network: bool = False, native: bool = False) -> dict[str, Any]:
        """Policy's keyword arguments of the preset and the policy file (composed as `run`
        composes them: hcp_linux.policy.layers): without their hosts for a check that sets its
        own network, without their carve-outs for a check's native-local run (native-local
        has no mount view to enforce them, and refuses a policy that has some)."""
        return combine([Layer(x.kind, x.name, _fitted(x.table, own_network, native))
                        for x in self._layers])

    @property
    def read_only_jail(self) -> bool:
        """The configuration keeps the jail read-only (preset read-only, or a policy file
        saying so): the checks take their evidence out through :meth:`outbox`."""
        return bool(self.base_fields().get("read_only_jail"))

    def outbox(self, jail: "str | os.PathLike[str]") -> tuple[Path, list[str]]:
        """Where a sandboxed command leaves what it found or did, and the `run` flags that
        let it: the jail itself when the configuration leaves it writable (the checks' runs
        are exactly as without a preset); under a read-only jail, a separate directory of the
        check, beside the jail, granted to that run alone as a write root
        (``--write-root``; for the API, ``write_roots``). The jail stays read-only."""
        if not self.read_only_jail:
            return Path(jail), []
        box = self.dir / "outbox"
        if not box.exists():
            self.mkdir("outbox")
        return box, ["--write-root", str(box)]

    def policy(self, **fields: Any) -> Policy:
        """The check's fields over the preset's and the policy file's (if any), composed as
        layers compose (a list adds, a scalar replaces), with the configuration's degraded
        layers. A check that sets its own network drops the base's hosts with it."""
        if self._layers:
            native = fields.get("sandbox") is False or fields.get("native_local") is True
            fields = combine([Layer(PRESET, "", self.base_fields("network" in fields, native)),
                              Layer("conformance check", "", fields)])
        fields["allow_degraded"] = tuple(fields.get("allow_degraded", ())) + self.allow_degraded
        return Policy(**fields)

    def run_flags(self, args: Sequence[str]) -> list[str]:
        """The flags this configuration adds to a check's `run ARGS`: ``--executor``, ``--allow-degraded``
        for each layer, ``--preset`` (with its hosts, unless the check names its own
        network) and ``--policy`` (the fitted file; without its hosts likewise)."""
        out = self.degraded_flags()
        if self.executor is not None:
            out += ["--executor", self.executor]
        own_network = any(a == "--network" or a.startswith("--network=") for a in args)
        if self.preset is not None:
            out += ["--preset", self.preset[0]]
            if not own_network:
                for host in self.preset[1].get("allow_hosts", ()):
                    out += ["--allow-host", host]
        if self._policy_files:
            native = "--native-local" in args or "--no-sandbox" in args
            out += ["--policy", self._policy_files[own_network, native]]
        return out

    def degraded_flags(self) -> list[str]:
        out: list[str] = []
        for layer in self.allow_degraded:
            out += ["--allow-degraded", layer]
        return out

    def _note_receipt(self, receipt: Mapping[str, Any] | None) -> None:
        if not receipt:
            return
        for name, entry in (receipt.get("layers") or {}).items():
            if isinstance(entry, Mapping) and entry.get("status") == "degraded":
                reason = str(entry.get("reason", ""))
                self.degraded_seen[name] = reason
                self.ev.note(f"ran with layer {name} degraded ({reason})")

    # --- running the sandbox --------------------------------------------------------------

    def run(self, argv: Sequence[str], *, jail: "str | os.PathLike[str]",
            env: Mapping[str, str] | None = None, stdin: Any = None,
            timeout: float | None = None, **policy_fields: Any) -> Any:
        """``Sandbox(policy).run(argv)`` through the Python API, output captured, bounded."""
        from ..sandbox import DEVNULL, Sandbox
        policy = self.policy(jail=os.fspath(jail), **policy_fields)
        r = Sandbox(policy).run(list(argv), capture_output=True, env=env,
                                stdin=DEVNULL if stdin is None else stdin,
                                timeout=self.timeout if timeout is None else timeout)
        self._note_receipt(r.receipt)
        if r.timed_out and timeout is None:
            raise Fail(f"{argv[0]}: the sandboxed command did not finish within "
                       f"{self.timeout:g}s: {proc_summary(r)}")
        return r

    def cli(self, args: Sequence[Any], *, env: Mapping[str, str] | None = None,
            cwd: str = "/", stdin: Any = subprocess.DEVNULL,
            expect_run: bool = False) -> subprocess.CompletedProcess:
        """``python -m hcp_linux ARGS`` as a separate process (the README's CLI), with the
        configuration's ``--allow-degraded`` flags added to ``run``. ``cwd`` is ``/`` by
        default: ``python -m`` puts the cwd first on sys.path. With ``expect_run``, a refusal
        for a missing layer makes the check not applicable."""
        args = [os.fspath(a) if isinstance(a, os.PathLike) else str(a) for a in args]
        if args and args[0] == "run":
            args = ["run"] + self.run_flags(args[1:]) + args[1:]
        argv = [sys.executable, "-m", "hcp_linux"] + args
        full_env = dict(os.environ if env is None else env)
        full_env.update(_NO_CONFIG)
        parent = _package_parent()
        full_env["PYTHONPATH"] = parent + (os.pathsep + full_env["PYTHONPATH"]
                                           if full_env.get("PYTHONPATH") else "")
        p = subprocess.run(argv, capture_output=True, timeout=self.timeout, env=full_env,
                           cwd=cwd, stdin=stdin)
        if expect_run and p.returncode == 125:
            refusal = layer_refusal(p.stderr)
            if refusal:
                raise NotApplicable(f"the sandbox refuses to run on this host: {refusal}")
        return p

    def cli_argv(self, args: Sequence[Any]) -> tuple[list[str], dict[str, str]]:
        """argv and env of a CLI run, for a check that starts it itself (Popen)."""
        args = [os.fspath(a) if isinstance(a, os.PathLike) else str(a) for a in args]
        if args and args[0] == "run":
            args = ["run"] + self.run_flags(args[1:]) + args[1:]
        env = dict(os.environ)
        env.update(_NO_CONFIG)
        parent = _package_parent()
        env["PYTHONPATH"] = parent + (os.pathsep + env["PYTHONPATH"]
                                      if env.get("PYTHONPATH") else "")
        return [sys.executable, "-m", "hcp_linux"] + args, env

    def driver(self, **policy_fields: Any) -> Any:
        """A LinuxDriver whose base policy is the configuration under test; its ephemeral
        jails and persistent workspaces live in this check's directory."""
        from ..driver.driver import LinuxDriver
        state, tmp = self.dir / "state", self.dir / "tmp"
        state.mkdir(exist_ok=True)
        tmp.mkdir(exist_ok=True)
        policy_fields.setdefault("jail", str(self.dir))
        return LinuxDriver(self.policy(**policy_fields), state_dir=str(state), tmp_dir=str(tmp))

    def drive(self, driver: Any, pack: Any, argv: Sequence[str], **kw: Any) -> Any:
        """``driver.run(pack, argv)`` with output captured, bounded."""
        kw.setdefault("capture_output", True)
        kw.setdefault("timeout", self.timeout)
        r = driver.run(pack, list(argv), **kw)
        self._note_receipt(r.receipt)
        if r.timed_out and kw["timeout"] == self.timeout:
            raise Fail(f"the driver's run did not finish within {self.timeout:g}s")
        return r

    def pack(self, name: str, bins: Sequence[str], *, mode: str | None = None,
             files: Mapping[str, str] | None = None, extra: str = "") -> Path:
        """Write a pack (manifest + files) in this check's directory; the manifest's path."""
        root = self.dir / name
        root.mkdir(exist_ok=True)
        os.chmod(root, 0o755)
        for rel, text in (files or {}).items():
            p = root / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
            os.chmod(p, 0o755 if rel.startswith("bin/") else 0o644)
        bin_list = ", ".join(f'"{b}"' for b in bins)
        text = f'name = "{name}"\n[wrap]\nbin = [{bin_list}]\n{extra}\n'
        if mode is not None:
            text += f'[wrap.workspace]\nmode = "{mode}"\n'
        manifest = root / "pack.toml"
        manifest.write_text(text)
        return manifest

    # --- unconfined controls and outside processes ----------------------------------------

    def unconfined(self, argv: Sequence[Any], **kw: Any) -> subprocess.CompletedProcess:
        kw.setdefault("stdin", subprocess.DEVNULL)
        kw.setdefault("capture_output", True)
        kw.setdefault("timeout", self.timeout)
        return subprocess.run([os.fspath(a) if isinstance(a, os.PathLike) else a for a in argv],
                              **kw)

    def start(self, argv: Sequence[str], **kw: Any) -> subprocess.Popen:
        """Start an outside process; it is ended by its pid when the check finishes."""
        kw.setdefault("stdin", subprocess.DEVNULL)
        kw.setdefault("stdout", subprocess.DEVNULL)
        kw.setdefault("stderr", subprocess.DEVNULL)
        proc = subprocess.Popen(list(argv), **kw)
        self._procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            proc.wait(timeout=self.timeout)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL'd processes exit
            pass
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()

    def listener(self, host: str) -> "Listener":
        lst = Listener(host)
        self._sockets.append(lst.sock)
        return lst

    # --- compiled probes ------------------------------------------------------------------

    def c_program(self, name: str, source: str) -> str:
        """Compile ``source`` with gcc into a directory every user can read; the binary's
        path. Not applicable when there is no gcc or it cannot build the program."""
        key = f"c:{name}"
        if key in self._cache:
            return self._cache[key]
        gcc = shutil.which("gcc")
        if gcc is None:
            raise NotApplicable("gcc is not installed: cannot build the probe program "
                                f"{name} (install gcc and libc6-dev)")
        d = self.base / "cbin"
        d.mkdir(exist_ok=True)
        os.chmod(d, 0o755)
        src = d / f"{name}.c"
        src.write_text(source)
        exe = d / name
        p = subprocess.run([gcc, "-O1", "-Wall", "-o", str(exe), str(src)], capture_output=True,
                           timeout=max(self.timeout, 120), stdin=subprocess.DEVNULL)
        if p.returncode != 0:
            raise NotApplicable(f"gcc could not build the probe program {name}: "
                                f"{shown(p.stderr, 300)}")
        os.chmod(exe, 0o755)
        self._cache[key] = str(exe)
        return str(exe)


__all__ = ["Harness", "Evidence", "Fail", "NotApplicable", "PASS", "FAIL", "NOT_APPLICABLE",
           "DEFAULT_TIMEOUT", "shown", "proc_summary", "layer_refusal", "system_python"]
