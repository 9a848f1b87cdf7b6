"""The public API: ``Sandbox(policy).run(argv)`` and friends.

A Sandbox compiles a plan per command, spawns it, and, when a layer turns out to be missing
on this host, either refuses (strict, the default) or, for a layer the policy allows to
degrade, runs again without it and says so in the receipt. It never runs less confined than
the receipt says.
"""
from __future__ import annotations

import errno
import functools
import os
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, Mapping, Sequence

from . import executor, native
from .errors import (BinNotExecutableError, BinNotFoundError, ChildSetupError,
                     LayerUnavailableError, PolicyError, SandboxError)
from .executor import DEVNULL, PIPE, SandboxProcess
from .plan import REMEDIES, Plan, clear_cache, compile_plan
from .policy import LAYERS, NATIVE_LOCAL, Policy
from .receipt import build_receipt

__all__ = ["Sandbox", "CompletedRun", "SandboxProcess", "confine", "release_resources", "PIPE",
           "DEVNULL"]

#: Steps whose failure means "this host cannot provide that layer".
STEP_LAYER = {
    "unshare-user": "userns", "uid-map": "userns", "unshare-mount": "mountns",
    "unshare-net": "netns", "unshare-ipc": "ipcns", "unshare-pid": "pidns",
    "landlock-restrict": "landlock", "seccomp": "seccomp",
}

# Layers found missing on this host, learned once per process: later runs skip straight to
# the plan without them (when the policy allows it) instead of failing again.
_missing: dict[str, str] = {}
_missing_lock = threading.Lock()


@dataclass
class CompletedRun:
    """The result of :meth:`Sandbox.run`, shaped like :class:`subprocess.CompletedProcess`."""

    args: list[str]
    returncode: int
    stdout: bytes | None = None
    stderr: bytes | None = None
    receipt: dict[str, Any] = field(default_factory=dict)
    timed_out: bool = False
    truncated: frozenset[str] = frozenset()  # captured streams cut at limits.output

    def check_returncode(self) -> None:
        if self.returncode:
            raise subprocess.CalledProcessError(self.returncode, self.args, self.stdout,
                                                self.stderr)


def _terminals(*stdio: Any) -> list[str]:
    """Device paths of the terminals among the command's standard streams."""
    out = []
    for i, spec in enumerate(stdio):
        fd = i if spec is None else spec if isinstance(spec, int) and spec >= 0 else (
            spec.fileno() if hasattr(spec, "fileno") else -1)
        try:
            if fd >= 0 and os.isatty(fd):
                out.append(os.ttyname(fd))
        except OSError:
            pass  # a terminal without a name (another mount namespace): nothing to grant
    return out


def _exec_error(bin_: str, e: ChildSetupError) -> SandboxError:
    """execve failed inside the sandbox: 127 when nothing was there, else 126."""
    why = os.strerror(e.errno)
    if e.errno == errno.ENOENT:
        return BinNotFoundError(f'bin "{bin_}" not found in the sandbox ({e.detail}: {why}; '
                                f"a script's interpreter must be inside the granted roots)")
    return BinNotExecutableError(f'bin "{bin_}" cannot be executed ({e.detail}: {why})')


class Sandbox:
    """Runs commands under one :class:`Policy`. Safe to share between threads."""

    def __init__(self, policy: Policy | None = None, *, executor: str | None = None,
                 **policy_fields: Any) -> None:
        if policy is not None and policy_fields:
            raise TypeError("give a Policy or policy fields, not both")
        self.policy = policy if policy is not None else Policy(**policy_fields)
        # "native" (hcp-exec), "ctypes" (fork), "auto" (native when built); None: the
        # process default (hcp_linux.native.set_default)
        self.executor = None if executor is None else native.check(executor)

    def _wanted_layers(self) -> frozenset[str]:
        wanted = set(LAYERS)
        if self.policy.network == "host":
            wanted.discard("netns")
        return frozenset(wanted)

    def spawn(self, argv: Sequence[str], *, stdin: Any = None, stdout: Any = None,
              stderr: Any = None, env: Mapping[str, str] | None = None) -> SandboxProcess:
        """Start ``argv`` confined; a Popen-like handle. ``env`` is the caller environment
        the allowlist draws from (default: ``os.environ``)."""
        attempts = self.attempts(argv, env=env, terminals=_terminals(stdin, stdout, stderr))
        try:
            plan, receipt = next(attempts)  # receipt: made by spawn while hcp-exec sets up
            while True:
                try:
                    return executor.spawn(plan, stdin=stdin, stdout=stdout, stderr=stderr,
                                          receipt=receipt, executor=self.executor)
                except ChildSetupError as e:
                    plan, receipt = attempts.throw(e)
        finally:
            attempts.close()  # closes the last plan

    def attempts(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                 terminals: Sequence[str] = (), only_with: frozenset[str] = frozenset()
                 ) -> Generator[tuple[Plan, Callable[[], dict[str, Any]]], None, None]:
        """The plans to try for ``argv``, each with what makes its receipt (a function of the
        plan alone, so a caller may make it while the command is being set up): the first with
        every layer the policy wants; throw a setup failure (ChildSetupError) into it and it
        raises the error that failure means, or, when a layer the policy lets degrade turned
        out to be missing, yields the plan without it. Each plan is closed when the next is asked for.
        ``only_with``: stop (StopIteration), before compiling, when a plan would lack one of
        these layers."""
        policy = self.policy
        wanted = self._wanted_layers()
        degraded: dict[str, str] = {}
        with _missing_lock:
            known_missing = dict(_missing)
        for layer, reason in known_missing.items():
            if layer in wanted:
                self._give_up(layer, reason, degraded)
                wanted -= {layer}
        while True:
            if not only_with <= wanted:
                return
            try:
                plan = compile_plan(policy, argv, layers=wanted, caller_env=env,
                                    terminals=terminals)
            except LayerUnavailableError as e:
                if e.layer not in wanted:  # already gone, and the policy cannot do without it
                    raise
                self._give_up(e.layer, e.reason, degraded)
                wanted -= {e.layer}
                continue
            try:
                yield plan, functools.partial(build_receipt, plan, self._wanted_layers(),
                                              dict(degraded))
                raise SandboxError("attempts: the plan was not run")  # next() without a failure
            except ChildSetupError as e:
                if e.step == "execve":
                    raise _exec_error(argv[0], e) from None
                failed = STEP_LAYER.get(e.step)
                if failed is None:
                    raise
                reason = f"{e.step}: {os.strerror(e.errno)}"
                with _missing_lock:
                    _missing[failed] = reason
                self._give_up(failed, reason, degraded)
                wanted -= {failed}
            finally:
                plan.close()

    def _give_up(self, layer: str, reason: str, degraded: dict[str, str]) -> None:
        if layer not in self.policy.allow_degraded:
            raise LayerUnavailableError(layer, reason, REMEDIES[layer])
        degraded[layer] = reason

    def run(self, argv: Sequence[str], *, input: bytes | None = None,
            capture_output: bool = False, timeout: float | None = None,
            stdin: Any = None, stdout: Any = None, stderr: Any = None,
            env: Mapping[str, str] | None = None) -> CompletedRun:
        """Run ``argv`` to completion. On timeout the whole sandbox is killed and
        ``timed_out`` is set."""
        if capture_output:
            stdout = stderr = PIPE
        if input is not None:
            stdin = PIPE
        timeout = self.policy.timeout if timeout is None else timeout
        proc = self.spawn(argv, stdin=stdin, stdout=stdout, stderr=stderr, env=env)
        out, err, timed_out = proc.finish(input, timeout, self.policy.limits.output)
        return CompletedRun(list(argv), proc.wait(), out, err, proc.receipt, timed_out,
                            frozenset(proc.truncated))


def confine(argv: Sequence[str], policy: Policy) -> list[str]:
    """The argv that runs ``argv`` confined under ``policy`` through the CLI (for callers in
    other languages)."""
    default = Policy(jail=policy.jail)
    if policy.system_roots != default.system_roots or \
            policy.seccomp_profiles != default.seccomp_profiles:
        raise PolicyError("confine: system_roots and seccomp_profiles have no CLI flags; "
                          "use a --policy file")
    out = [sys.executable, "-m", "hcp_linux", "run", "--jail", str(policy.jail),
           "--network", policy.network]
    for root in policy.write_roots:
        out += ["--write-root", root]
    for root in policy.read_only_roots:
        out += ["--read-only-root", root]
    for b in policy.allow_bins:
        out += ["--allow-bin", b]
    for k, v in policy.env.items():
        out += ["--env", f"{k}={v}"]
    for layer in sorted(policy.allow_degraded):
        out += ["--allow-degraded", layer]
    if policy.timeout is not None:
        out += ["--timeout", str(policy.timeout)]
    if policy.mode == NATIVE_LOCAL:
        out += ["--no-sandbox", "--native-local"]
    return out + ["--", *argv]


def release_resources(timeout: float = 5.0) -> bool:
    """Let go of everything this process keeps between runs that holds a granted root's file
    system: forget the confinement cache and retire the native executor's idle spares.

    Why: a spare is an hcp-exec started ahead of the next run, waiting in its own mount
    namespace with the mount view already built (clones of the jail's and every granted
    root's mounts) or, not yet knowing the view, a private copy of the host's whole mount
    tree. Either keeps the file systems it holds alive: ``umount`` of the jail's file system
    succeeds, but the file system is not released (a loop device stays claimed, the
    superblock lives on) until the spare goes, which it does by itself within
    ``native.KIND_IDLE + native.SPARE_MAX_AGE`` seconds of the last run. Call this before
    unmounting or detaching a jail's file system, and after mounting one at a jail (a spare
    made before the mount sees the old directory there, and refuses the run). The cache
    holds no fd and no mount; it is forgotten too, so the next run checks every path afresh.

    Runs in progress keep what they use until they end; a run's helpers, and a spare the pool
    retired just before (by age), finish exiting in the background, within moments. Later
    runs work as ever: the cache is rebuilt, and spares come back once a kind of run repeats.
    Bounded: waits up to ``timeout`` seconds for the idle spares (and one being made at this
    moment) to exit; one still there then is killed. True when every one was seen to exit,
    False otherwise.
    """
    if (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
            or not 0 <= timeout < float("inf")):
        raise PolicyError(f"release_resources: timeout: expected a finite number of seconds "
                          f">= 0, got {timeout!r}")
    clear_cache()
    return native._pool().clear(float(timeout))
