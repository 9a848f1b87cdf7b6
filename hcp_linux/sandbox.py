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

from . import native
from .run import executor, popen
from .errors import (BinNotExecutableError, BinNotFoundError, ChildSetupError, HelperLostError,
                     LayerUnavailableError, PolicyError, SandboxError, SetupTimeoutError)
from .run.executor import DEVNULL, PIPE, STDOUT, SandboxProcess
from .plan.plan import Plan, clear_cache, compile_plan
from .policy.policy import LAYERS, Policy
from .policy.resolve import resolve
from .policy.policy_flags import flags_of
from .run.receipt import build_receipt
from .host.remedies import remedy

__all__ = ["Sandbox", "CompletedRun", "SandboxProcess", "confine", "release_resources", "PIPE",
           "DEVNULL", "STDOUT", "CalledProcessError", "TimeoutExpired"]

#: Steps whose failure means "this host cannot provide that layer". "proc": the fresh procfs
#: only a pid namespace asks for; the kernel refuses it where parts of the outer /proc are
#: covered (a container's masked /proc/kcore, read-only /proc/sys...), and without the pid
#: namespace the view binds the outer /proc instead (fenced). "pivot-root": the step that
#: makes the mount view the root.
STEP_LAYER = {
    "unshare-user": "userns", "uid-map": "userns", "unshare-mount": "mountns",
    "unshare-net": "netns", "unshare-ipc": "ipcns", "unshare-pid": "pidns",
    "proc": "pidns", "pivot-root": "mountns",
    "landlock-restrict": "landlock", "seccomp": "seccomp",
}

#: The errnos by which the kernel itself refuses a layer's step (no such feature, not
#: permitted here, a namespace limit reached). Any other (EPROTO, EPIPE, ESRCH, EINTR,
#: EAGAIN, ENOMEM, ETIMEDOUT...) is what a killed, stopped or starved helper leaves: the run
#: fails alone and nothing is learned (DESIGN.md §8).
REFUSAL_ERRNOS = frozenset({errno.EPERM, errno.EACCES, errno.EINVAL, errno.ENOSYS,
                            errno.EOPNOTSUPP, errno.ENOSPC, errno.EUSERS})

# Layers found missing on this host, learned once per process: later runs skip straight to
# the plan without them (when the policy allows it) instead of failing again. Learned only
# when the kernel refused the same step twice, the same way, in two separate attempts of one
# call: one failure may be a helper that died; two fresh attempts refused alike are the
# host's answer, the probe's kind of evidence.
_missing: dict[str, str] = {}
_missing_lock = threading.Lock()


@dataclass
class CompletedRun:
    """The result of :meth:`Sandbox.run`, shaped like :class:`subprocess.CompletedProcess`
    (``args`` as given; ``stdout``/``stderr`` str in text mode)."""

    args: Any
    returncode: int
    stdout: Any = None
    stderr: Any = None
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
        if policy is not None and not isinstance(policy, Policy):
            shown = repr(policy) if isinstance(policy, (str, os.PathLike)) else "..."
            raise TypeError(f"Sandbox() takes a Policy, not {type(policy).__name__}: "
                            f"Sandbox(Policy(jail={shown})) or Sandbox(jail={shown})")
        # checked against this host once, here: a Sandbox keeps what its paths meant then
        self.policy = resolve(policy if policy is not None else Policy(**policy_fields))
        # "native" (hcp-exec), "ctypes" (the fallback), "auto" (native when built); None: the
        # process default (hcp_linux.native.set_default)
        self.executor = None if executor is None else native.check(executor)

    def _wanted_layers(self) -> frozenset[str]:
        wanted = set(LAYERS)
        if self.policy.network == "host":
            wanted.discard("netns")
        return frozenset(wanted)

    def spawn(self, args: Any, bufsize: int = -1, executable: Any = None, stdin: Any = None,
              stdout: Any = None, stderr: Any = None, preexec_fn: Any = None,
              close_fds: bool = True, shell: bool = False, cwd: Any = None,
              env: Mapping[Any, Any] | None = None, universal_newlines: bool | None = None,
              startupinfo: Any = None, creationflags: int = 0, restore_signals: bool = True,
              start_new_session: bool = False, pass_fds: Any = (), *, user: Any = None,
              group: Any = None, extra_groups: Any = None, encoding: str | None = None,
              errors: str | None = None, text: bool | None = None, umask: int = -1,
              pipesize: int = -1, process_group: int | None = None) -> SandboxProcess:
        """Start ``args`` confined: :class:`subprocess.Popen`'s signature and meaning, except
        where docs/popen.md says otherwise. In short: ``args`` is a sequence (a lone str is
        one program name, as without a shell; ``shell=True`` runs it with ``/bin/sh -c``,
        under the allow-list); ``cwd`` must be a directory of the sandbox's view (relative:
        to the jail); ``env`` grants these variables to the command, over the policy's
        ``env``, and nothing is drawn from this process's environment (None, or
        ``os.environ`` itself: the allow-list draws locale and terminal variables from
        ``os.environ``, as ever); the run always has a session of its own and no fd above 2.
        ``preexec_fn``, ``pass_fds``, ``close_fds=False``, ``restore_signals=False``,
        ``user``, ``group``, ``extra_groups``, ``umask`` and ``process_group`` are refused
        (PolicyError, naming the argument and why)."""
        popen.refuse_unsupported({
            "preexec_fn": preexec_fn, "close_fds": close_fds, "pass_fds": pass_fds,
            "restore_signals": restore_signals, "user": user, "group": group,
            "extra_groups": extra_groups, "umask": umask, "process_group": process_group,
            "startupinfo": startupinfo, "creationflags": creationflags})
        del start_new_session  # always a new session (setsid): True or False, the same run
        stdio = popen.Stdio.of(bufsize, text, universal_newlines, encoding, errors, pipesize)
        popen.stdio_checks(stdin, stdout, stderr)
        argv, exe = popen.command(args, bool(shell), executable)
        grants = popen.granted_env(env)
        workdir = popen.working_dir(cwd)
        attempts = self.attempts(argv, env=grants, cwd=workdir, executable=exe,
                                 terminals=_terminals(stdin, stdout, stderr))
        try:
            plan, receipt = next(attempts)  # receipt: made by spawn while hcp-exec sets up
            while True:
                try:
                    return executor.spawn(plan, stdin=stdin, stdout=stdout, stderr=stderr,
                                          receipt=receipt, executor=self.executor,
                                          stdio=stdio, args=args)
                except ChildSetupError as e:
                    plan, receipt = attempts.throw(e)
        finally:
            attempts.close()  # closes the last plan

    def attempts(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                 terminals: Sequence[str] = (), only_with: frozenset[str] = frozenset(),
                 cwd: str | None = None, executable: str | None = None,
                 allowed: Callable[[frozenset[str]], None] | None = None
                 ) -> Generator[tuple[Plan, Callable[[], dict[str, Any]]], None, None]:
        """The plans to try for ``argv``, each with what makes its receipt (a function of the
        plan alone, so a caller may make it while the command is being set up): the first with
        every layer the policy wants; throw a setup failure (ChildSetupError) into it and it
        raises the error that failure means, or, when a layer the policy lets degrade turned
        out to be missing, yields the plan without it. Each plan is closed when the next is asked for.
        ``only_with``: stop (StopIteration), before compiling, when a plan would lack one of
        these layers. ``env`` (variables granted by the call, checked), ``cwd``,
        ``executable`` and ``allowed``: as :func:`~hcp_linux.plan.plan.compile_plan` takes
        them."""
        policy = self.policy
        wanted = self._wanted_layers()
        degraded: dict[str, str] = {}
        refused_once: dict[str, tuple[str, int]] = {}  # layer -> (step, errno) seen once
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
                plan = compile_plan(policy, argv, layers=wanted, env=env, cwd=cwd,
                                    executable=executable, terminals=terminals,
                                    allowed=allowed)
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
                    raise _exec_error(argv[0] if executable is None else executable,
                                      e) from None
                lost = STEP_LAYER.get(e.step)
                if lost is None or isinstance(e, (HelperLostError, SetupTimeoutError)) \
                        or e.errno not in REFUSAL_ERRNOS:
                    raise  # this run's failure alone: a helper died, was stopped, starved
                if refused_once.get(lost) != (e.step, e.errno):
                    refused_once[lost] = (e.step, e.errno)
                    continue  # once is not yet the host's answer: a fresh attempt decides
                reason = f"{e.step}: {os.strerror(e.errno)}"
                with _missing_lock:
                    _missing[lost] = reason
                self._give_up(lost, reason, degraded)
                wanted -= {lost}
            finally:
                plan.close()

    def _give_up(self, layer: str, reason: str, degraded: dict[str, str]) -> None:
        if layer not in self.policy.allow_degraded:
            raise LayerUnavailableError(layer, reason, remedy(
                layer, exec_dir=native.BUILD_DIR, reason=reason,
                userns_reason=degraded.get("userns")))
        degraded[layer] = reason

    def run(self, args: Any, bufsize: int = -1, executable: Any = None, stdin: Any = None,
            stdout: Any = None, stderr: Any = None, preexec_fn: Any = None,
            close_fds: bool = True, shell: bool = False, cwd: Any = None,
            env: Mapping[Any, Any] | None = None, universal_newlines: bool | None = None,
            startupinfo: Any = None, creationflags: int = 0, restore_signals: bool = True,
            start_new_session: bool = False, pass_fds: Any = (), *, input: Any = None,
            capture_output: bool = False, timeout: float | None = None, check: bool = False,
            user: Any = None, group: Any = None, extra_groups: Any = None,
            encoding: str | None = None, errors: str | None = None, text: bool | None = None,
            umask: int = -1, pipesize: int = -1, process_group: int | None = None
            ) -> CompletedRun:
        """Run ``args`` to completion: :func:`subprocess.run`'s signature and meaning (the
        arguments of :meth:`spawn`, with ``input``, ``capture_output``, ``timeout`` and
        ``check``), except: on timeout (``timeout``, else the policy's) the whole sandbox is
        killed and the result says ``timed_out``, its ``returncode`` the kill's; with
        ``check=True`` a timeout raises :class:`TimeoutExpired` instead, as subprocess does,
        and a non-zero exit :class:`CalledProcessError` (subclasses of subprocess's, with
        the run's ``receipt``)."""
        if input is not None:
            if stdin is not None:
                raise ValueError("stdin and input arguments may not both be used.")
            stdin = PIPE
        if capture_output:
            if stdout is not None or stderr is not None:
                raise ValueError("stdout and stderr arguments may not be used with "
                                 "capture_output.")
            stdout = stderr = PIPE
        timeout = self.policy.timeout if timeout is None else timeout
        proc = self.spawn(args, bufsize, executable, stdin, stdout, stderr, preexec_fn,
                          close_fds, shell, cwd, env, universal_newlines, startupinfo,
                          creationflags, restore_signals, start_new_session, pass_fds,
                          user=user, group=group, extra_groups=extra_groups,
                          encoding=encoding, errors=errors, text=text, umask=umask,
                          pipesize=pipesize, process_group=process_group)
        with proc:  # as subprocess.run: whatever happens, the pipes are closed
            out, err, timed_out = proc.finish(input, timeout, self.policy.limits.output)
        returncode = proc.wait()
        if check and timed_out:
            raw_out, raw_err = proc._collected()
            raise TimeoutExpired(args, timeout or 0, raw_out, raw_err, receipt=proc.receipt)
        if check and returncode:
            raise CalledProcessError(returncode, args, out, err, receipt=proc.receipt)
        return CompletedRun(args, returncode, out, err, proc.receipt, timed_out,
                            frozenset(proc.truncated))


class CalledProcessError(subprocess.CalledProcessError):
    """``Sandbox.run(check=True)``: the command exited non-zero (or by a signal). A
    :class:`subprocess.CalledProcessError`, with the run's ``receipt``."""

    def __init__(self, returncode: int, cmd: Any, output: Any = None, stderr: Any = None, *,
                 receipt: dict[str, Any] | None = None) -> None:
        super().__init__(returncode, cmd, output, stderr)
        self.receipt = receipt or {}


class TimeoutExpired(subprocess.TimeoutExpired):
    """``Sandbox.run(check=True)``: the run timed out, and the whole sandbox was killed. A
    :class:`subprocess.TimeoutExpired` (``output``/``stderr``: the bytes read, as
    subprocess gives them), with the run's ``receipt``."""

    def __init__(self, cmd: Any, timeout: float, output: Any = None, stderr: Any = None, *,
                 receipt: dict[str, Any] | None = None) -> None:
        super().__init__(cmd, timeout, output, stderr)
        self.receipt = receipt or {}


def confine(argv: Any, policy: Policy) -> list[str]:
    """The argv that runs ``argv`` confined under ``policy`` through the CLI (for callers in
    other languages): every field of the policy as its flag (``--flag=VALUE``, so that no
    value is taken for an option), so that the CLI builds this very policy. A policy the
    CLI cannot express is refused (PolicyError naming the field), never run with less.
    Writes nothing. ``argv`` as :meth:`Sandbox.spawn` takes it (a str is one program).
    The policy is resolved first (its jail, when not given, is the current directory now),
    so that a path error is raised here, and the flags name what was checked."""
    command, _ = popen.command(argv, False, None)
    return [sys.executable, "-m", "hcp_linux", "run", *flags_of(resolve(policy)), "--",
            *command]


def release_resources(timeout: float = 5.0) -> bool:
    """Let go of everything this process keeps between runs that holds a granted root's file
    system: forget the confinement cache and retire the native executor's idle spares.

    Why: a spare is an hcp-exec started ahead of the next run, waiting in its own mount
    namespace with the mount view already built (clones of the jail's and every granted
    root's mounts) or, not yet knowing the view, a private copy of the host's whole mount
    tree. Either keeps the file systems it holds alive: ``umount`` of the jail's file system
    succeeds, but the file system is not released (a loop device stays claimed, the
    superblock lives on) until the spare goes, which it does by itself within
    ``spares.KIND_IDLE + spares.SPARE_MAX_AGE`` seconds (:mod:`hcp_linux.native.spares`)
    of the last run. Call this before unmounting or detaching a jail's file system, and
    after mounting one at a jail (a spare made before the mount sees the old directory
    there, and refuses the run). The cache
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
    return native.spares.clear(float(timeout))
