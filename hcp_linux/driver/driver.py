"""The HCP driver: ``prepare → rewrite_argv → spawn → writeback → cleanup`` (HCP §10.6).

A core runtime finds it under the ``hcp.drivers`` entry point as ``linux``::

    from hcp_linux.driver import LinuxDriver
    driver = LinuxDriver()
    result = driver.run("packs/gh/pack.toml", ["gh", "api", "-o", "/srv/out/user.json", "user"],
                        principal="alice", credentials={"GH_TOKEN": minted})

The five stages are public so a runtime can interleave its own steps (confirmations, receipts)
between them; :meth:`LinuxDriver.run` and :meth:`LinuxDriver.run_async` do all five and run
``cleanup`` on every path: exception, timeout, ``KeyboardInterrupt``, ``asyncio`` cancellation.

One driver serves any number of runs at once from threads or ``asyncio`` tasks: it holds only
immutable configuration, and each exec's state lives in its own :class:`Execution`.
"""
from __future__ import annotations

import asyncio
import os
import threading
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from .. import receipt_keys as keys
from ..policy.allowlist import is_allowlisted
from .async_pipes import communicate
from ..policy.environment import check_explicit
from ..errors import (BinNotFoundError, NotAllowlistedError, PolicyError, WritebackError,
                     printable)
from .fileref import FileRef, OffLimits, scan
from ..jails.locations import PLACEHOLDER_JAIL, default_tmp_dir, state_dir_path
from ..policy.pack import WORKSPACE, Pack, load_pack
from ..policy.protected import protect_directory
from ..policy.policy import Policy, check_env_text
from ..policy.resolve import resolve
from .results import DriverResult, WritebackReport
from ..sandbox import PIPE, Sandbox, SandboxProcess
from .staging import Staging
from ..jails.workspace import (DEFAULT_PRINCIPAL, Workspace, _Cancelled, check_principal,
                        diff_snapshots, open_workspace, snapshot, sweep_jails)

__all__ = ["LinuxDriver", "Execution", "DriverResult", "WritebackReport"]


@dataclass(eq=False)
class Execution:
    """The state of one exec between ``prepare`` and ``cleanup`` (one per run, never shared
    between runs). ``stage`` is the last stage completed."""

    pack: Pack
    principal: str
    mode: str
    jail: str
    policy: Policy
    cwd: str
    stage: str = "prepared"
    #: mode none's writable scratch (staging, home_env); None: the jail is writable, holds them
    scratch: str | None = None
    argv: list[str] | None = None
    process: SandboxProcess | None = None
    refs: list[FileRef] = field(default_factory=list)
    _workspace: Workspace | None = field(default=None, repr=False)
    _staging: Staging | None = field(default=None, repr=False)
    _before: dict | None = field(default=None, repr=False)
    _mutex: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def cleaned(self) -> bool:
        return self.stage == "cleaned"


class LinuxDriver:
    """The HCP local driver for Linux, backed by :class:`hcp_linux.Sandbox`.

    ``policy`` is the runtime's base policy: network, extra roots, layers allowed to degrade,
    default timeout, sandbox/native-local mode. Its ``jail`` is ignored (the pack's workspace
    mode chooses it). Its ``allow_bins``, when not empty, is the runtime's allow-list: a bin
    must be both declared in the pack's ``wrap.bin`` and on that list (HCP §10.2.1); when
    empty, the allow-list is seeded with the pack's ``wrap.bin`` (the HCP SHOULD).
    ``state_dir`` holds persistent workspaces (default ``$XDG_STATE_HOME/hcp-linux``);
    ``tmp_dir`` the ephemeral jails (default: the system temp dir). ``lock_timeout`` bounds
    the wait for a busy workspace (default: wait).
    """

    name = "linux"

    def __init__(self, policy: Policy | None = None, *,
                 state_dir: str | os.PathLike[str] | None = None,
                 tmp_dir: str | os.PathLike[str] | None = None,
                 lock_timeout: float | None = None) -> None:
        # The base policy's jail is replaced per exec: a stand-in only makes it valid.
        # checked on this host now, before any jail is made (resolved again per exec)
        self.policy = resolve(policy if policy is not None else Policy(jail=PLACEHOLDER_JAIL))
        self.state_dir = os.fspath(state_dir) if state_dir is not None else None
        if self.state_dir is not None:
            # every principal's workspace: no run of this process may write there (the
            # default one is protected in every process: hcp_linux.runtime_files)
            protect_directory(self.state_dir)
        self.tmp_dir = os.fspath(tmp_dir) if tmp_dir is not None else None
        if lock_timeout is not None and not lock_timeout >= 0:
            raise PolicyError(f"lock_timeout: expected seconds >= 0, got {lock_timeout!r}")
        self.lock_timeout = lock_timeout

    # --- helpers -------------------------------------------------------------------------

    @staticmethod
    def load_pack(pack: Pack | str | os.PathLike[str]) -> Pack:
        """A :class:`Pack` as is, or the manifest at a path, validated."""
        return pack if isinstance(pack, Pack) else load_pack(pack)

    def _bin(self, pack: Pack, argv: Sequence[str]) -> list[str]:
        """``argv`` with a pack-relative bin made absolute; refused unless the bin is in
        ``wrap.bin`` and on the runtime's allow-list (exit 127, the exact HCP message)."""
        if isinstance(argv, (str, bytes)) or not argv:
            raise PolicyError("argv: expected a non-empty list of strings (HCP: argv is "
                              "always an array)")
        argv = list(argv)
        for i, a in enumerate(argv):
            if not isinstance(a, str):
                raise PolicyError(f"argv[{i}]: expected a string, got {type(a).__name__}")
        bin_ = argv[0]
        if "/" in bin_ and not os.path.isabs(bin_):
            argv[0] = os.path.normpath(os.path.join(pack.root, bin_))
        if not is_allowlisted(argv[0], pack.bins):
            raise NotAllowlistedError(bin_)
        runtime = self.policy.allow_bins
        if runtime and not is_allowlisted(argv[0], runtime):
            raise NotAllowlistedError(bin_)
        if "/" in argv[0] and not os.path.isfile(argv[0]):
            # a path names a host file the view shows as it is: absent here, absent there;
            # refused now, before a jail is made for it (the engine would say so after)
            raise BinNotFoundError(f'bin "{printable(bin_)}" not found ({printable(argv[0])})')
        return argv

    def check(self, pack: Pack | str | os.PathLike[str], argv: Sequence[str], *,
              principal: str = DEFAULT_PRINCIPAL, credentials: Mapping[str, str] | None = None,
              cwd: str | None = None) -> list[FileRef]:
        """Every check that needs no jail: bin allow-list, principal, credentials, file
        references (host paths, ``..``, outputs that are symlinks or directories). Creates
        nothing; :meth:`run` calls it before :meth:`prepare`."""
        pack = self.load_pack(pack)
        check_principal(principal)
        self._child_env(pack, credentials, jail="/")
        argv = self._bin(pack, argv)
        return scan(argv, pack.workspace.file_flags, cwd=cwd or os.getcwd(),
                    off_limits=self._off_limits(pack))

    def _off_limits(self, pack: Pack) -> OffLimits:
        """The driver's own places, which no file reference may name: the pack root, the
        state directory (every principal's workspace) and the temp dir's jails."""
        state = self.state_dir if self.state_dir is not None else state_dir_path()
        tmp = self.tmp_dir if self.tmp_dir is not None else default_tmp_dir()
        roots = ((os.path.realpath(pack.root), "the pack root"),
                 (os.path.realpath(state), "the driver's state directory (workspaces)"))
        return OffLimits(roots, os.path.realpath(tmp))

    def _child_env(self, pack: Pack, credentials: Mapping[str, str] | None, *,
                   jail: str) -> dict[str, str]:
        """HCP §10.2.3: the runtime's base env, the pack's ``wrap.agent_env``, the credentials
        minted for this call, and the ``home_env`` keys pointed at the jail. Nothing else
        (the engine adds only locale/terminal keys, PATH, TMPDIR and HCP_SANDBOX). In mode
        ``none`` ``jail`` is the run's writable scratch: the real jail, the pack root, is
        read-only."""
        creds = dict(credentials or {})
        check_explicit(creds, "credentials")
        for key, value in creds.items():
            check_env_text(key, value)
        for key in creds:
            if key in pack.workspace.home_env:
                raise PolicyError(f"credentials: {key} is in wrap.workspace.home_env "
                                  f"(the runtime points it at the jail)")
        env = {**dict(self.policy.env), **dict(pack.agent_env), **creds}
        env.update({key: jail for key in pack.workspace.home_env})
        return env

    # --- the five stages -----------------------------------------------------------------

    def prepare(self, pack: Pack | str | os.PathLike[str], *,
                principal: str = DEFAULT_PRINCIPAL,
                credentials: Mapping[str, str] | None = None,
                cwd: str | None = None) -> Execution:
        """Stage 1: allocate the jail of the pack's workspace mode and build the policy.

        ``workspace`` mode takes the workspace's lock here and holds it until cleanup, so
        concurrent execs for one (pack, principal) run one after the other. ``cwd`` is where
        relative host file references are resolved (default: the current directory).
        """
        return self._prepare(self.load_pack(pack), principal, credentials, cwd, None)

    def _prepare(self, pack: Pack, principal: str, credentials: Mapping[str, str] | None,
                 cwd: str | None, cancel: threading.Event | None) -> Execution:
        check_principal(principal)
        if not os.path.isdir(pack.root):
            raise PolicyError(f"pack root {pack.root} does not exist")
        self._child_env(pack, credentials, jail="/")  # refuse bad credentials before any I/O
        # Jails of runtimes that died (SIGKILL, OOM) are reclaimed here: one scandir of the
        # temp dir when there is nothing to do. Never another live run's (hcp_linux.jails.reclaim).
        sweep_jails(self.tmp_dir)
        ws = open_workspace(pack, principal, state_dir=self.state_dir, tmp_dir=self.tmp_dir,
                            lock_timeout=self.lock_timeout, cancel=cancel)
        try:
            env = self._child_env(pack, credentials, jail=ws.scratch)
            base = self.policy
            if ws.read_only:
                # mode none: cwd = the pack root, read-only (the jail's own grant); the run
                # writes its private /tmp and the scratch (staging, home_env), nothing else
                policy = resolve(base.replace(jail=ws.jail, read_only_jail=True, env=env,
                                              write_roots=(ws.scratch, *base.write_roots),
                                              allow_bins=base.allow_bins or pack.bins))
            else:
                ro = tuple(base.read_only_roots) + (() if pack.root in base.read_only_roots
                                                    else (pack.root,))
                policy = resolve(base.replace(jail=ws.jail, read_only_jail=False, env=env,
                                              read_only_roots=ro,
                                              allow_bins=base.allow_bins or pack.bins))
        except BaseException:
            ws.release()
            raise
        return Execution(pack=pack, principal=principal, mode=ws.mode, jail=ws.jail,
                         policy=policy, cwd=os.path.abspath(cwd or os.getcwd()),
                         scratch=ws.scratch if ws.read_only else None, _workspace=ws)

    def rewrite_argv(self, ex: Execution, argv: Sequence[str]) -> list[str]:
        """Stage 2: the argv to spawn. ``workspace:`` references and file-flag values point
        into the jail; host inputs are copied in; outputs are staged for writeback."""
        self._expect(ex, "prepared")
        argv = self._bin(ex.pack, argv)
        refs = scan(argv, ex.pack.workspace.file_flags, cwd=ex.cwd,
                    off_limits=self._off_limits(ex.pack))
        staging = Staging(ex.jail, io_root=ex.scratch)
        ex._staging = staging
        if ex.mode == WORKSPACE:
            staging.clear()
        ex.refs = refs
        ex.argv = staging.rewrite(argv, refs)
        if ex.mode == WORKSPACE:
            ex._before = snapshot(ex.jail)
        ex.stage = "rewritten"
        return list(ex.argv)

    def spawn(self, ex: Execution, argv: Sequence[str] | None = None, *, stdin: Any = None,
              stdout: Any = None, stderr: Any = None) -> SandboxProcess:
        """Stage 3: start the rewritten argv confined; a Popen-like handle.

        The engine sets PDEATHSIG in the child, and Linux delivers it when the *thread* that
        forked exits. So call this from a thread that outlives the child: the thread that
        waits for it (as :meth:`run` does), or the event-loop thread (as :meth:`run_async`
        does) -- never from a worker thread that finishes before the child does.
        """
        self._expect(ex, "rewritten")
        if argv is None:
            argv = ex.argv
        assert argv is not None
        ex.process = Sandbox(ex.policy).spawn(list(argv), stdin=stdin, stdout=stdout,
                                               stderr=stderr)
        ex.stage = "spawned"
        return ex.process

    def writeback(self, ex: Execution, returncode: int | None = None, *,
                  timed_out: bool = False) -> WritebackReport:
        """Stage 4: after a successful run (exit 0), write each staged output to its host
        destination atomically; in workspace mode, list the files the run created.

        Outputs of a run that failed, timed out or was killed are not written back: a
        killed tool may have written half a file, and a failing one is not trusted to have
        produced its output. Their destinations keep their old content.

        All outputs are written or none: a failure raises :class:`WritebackError` (exit 125)
        naming the destination and the cause, with every destination as it was; its
        ``report`` is the :class:`WritebackReport` (``failed``, ``error``).
        """
        self._expect(ex, "spawned")
        ex.stage = "written-back"  # one attempt: a failed writeback is not retried
        if returncode is None:
            assert ex.process is not None
            returncode = ex.process.returncode
        files = None
        if ex.mode == WORKSPACE:
            files = diff_snapshots(ex._before, snapshot(ex.jail))
        new, modified = files if files is not None else (None, None)
        if timed_out:
            skipped: str | None = "timed out"
        elif returncode is None:
            skipped = "still running"
        elif returncode < 0:
            skipped = f"killed by signal {-returncode}"
        elif returncode != 0:
            skipped = f"exit status {returncode}"
        else:
            skipped = None
        written: list[str] = []
        missing: list[str] = []
        if skipped is None and ex._staging is not None:
            try:
                written, missing = ex._staging.writeback()
            except WritebackError as e:
                e.report = WritebackReport((), (), None, new, modified, e.path, e.cause)
                raise
        return WritebackReport(tuple(written), tuple(missing), skipped, new, modified)

    def cleanup(self, ex: Execution) -> None:
        """Stage 5, on every path and idempotent: kill the sandbox if it still runs, reap it,
        close the staging fds, remove ``.hcp-io`` (workspace), the whole jail (ephemeral) or
        the scratch (none; its jail, the pack root, is never touched), release the workspace
        lock."""
        with ex._mutex:
            if ex.stage == "cleaned":
                return
            try:
                proc = ex.process
                if proc is not None and proc.returncode is None:
                    proc.kill()
                    proc.wait()
                if proc is not None:
                    for stream in (proc.stdin, proc.stdout, proc.stderr):
                        if stream is not None and not stream.closed:
                            stream.close()
            finally:
                try:
                    if ex._staging is not None:
                        ex._staging.close(remove=ex.mode == WORKSPACE)
                finally:
                    if ex._workspace is not None:
                        ex._workspace.release()
                    ex.stage = "cleaned"

    @staticmethod
    def _expect(ex: Execution, stage: str) -> None:
        if ex.stage != stage:
            raise PolicyError(f"driver: expected an execution at stage {stage!r}, "
                              f"it is at {ex.stage!r}")

    # --- all five ------------------------------------------------------------------------

    def run(self, pack: Pack | str | os.PathLike[str], argv: Sequence[str], *,
            principal: str = DEFAULT_PRINCIPAL, credentials: Mapping[str, str] | None = None,
            input: bytes | None = None, capture_output: bool = False,
            stdin: Any = None, stdout: Any = None, stderr: Any = None,
            timeout: float | None = None, cwd: str | None = None) -> DriverResult:
        """Run ``argv`` for ``pack`` through all five stages; cleanup on every path.

        On timeout (``timeout``, else the policy's) the whole sandbox is killed, nothing is
        written back, and ``timed_out`` is set. Refusals raise a
        :class:`~hcp_linux.errors.SandboxError` (``HostPathError``, ``NotAllowlistedError``,
        ``PackError``...) before anything is created or spawned.
        """
        pack = self.load_pack(pack)
        self.check(pack, argv, principal=principal, credentials=credentials, cwd=cwd)
        ex = self.prepare(pack, principal=principal, credentials=credentials, cwd=cwd)
        try:
            return self._execute(ex, argv, input=input, capture_output=capture_output,
                                 stdin=stdin, stdout=stdout, stderr=stderr, timeout=timeout)
        finally:
            self.cleanup(ex)

    def _execute(self, ex: Execution, argv: Sequence[str], *, input: bytes | None = None,
                 capture_output: bool = False, stdin: Any = None, stdout: Any = None,
                 stderr: Any = None, timeout: float | None = None,
                 spawn_guard: AbstractContextManager[Any] | None = None) -> DriverResult:
        """rewrite_argv, spawn, wait, writeback: :meth:`run` between prepare and cleanup.
        The CLI calls it too, holding ``ex`` so that it can write the receipt of a run a
        signal ended, and with a ``spawn_guard`` that holds such a signal until ``spawn``
        has returned (``ex.process`` set)."""
        if capture_output:
            stdout = stderr = PIPE
        if input is not None:
            stdin = PIPE
        self.rewrite_argv(ex, argv)
        timeout = ex.policy.timeout if timeout is None else timeout
        with spawn_guard if spawn_guard is not None else nullcontext():
            proc = self.spawn(ex, stdin=stdin, stdout=stdout, stderr=stderr)
        out, err, timed_out = proc.finish(input, timeout, ex.policy.limits.output)
        return self._finish(ex, proc.wait(), out, err, timed_out, frozenset(proc.truncated))

    def _receipt(self, ex: Execution, report: WritebackReport | None = None) -> dict[str, Any]:
        """The engine's receipt of a spawned exec plus a ``driver`` section (and its
        ``writeback`` entry when ``report`` is given)."""
        assert ex.process is not None
        receipt = dict(ex.process.receipt)
        section: dict[str, Any] = {
            "name": self.name, "mode": ex.mode, "jail": ex.jail, "scratch": ex.scratch,
            "principal": ex.principal, "pack_root": ex.pack.root,
            "ignored_keys": list(ex.pack.ignored_keys),
            "written_back": list(report.written) if report else []}
        if report is not None:
            section["writeback"] = report.as_receipt()
        keys.set_driver(receipt, section)
        return receipt

    def _finish(self, ex: Execution, returncode: int, out: bytes | None, err: bytes | None,
                timed_out: bool, truncated: frozenset[str]) -> DriverResult:
        """The DriverResult after writeback. When the writeback fails, the WritebackError
        carries this result (the command's status, output and receipt are not lost)."""
        assert ex.process is not None and ex.argv is not None
        try:
            report = self.writeback(ex, returncode, timed_out=timed_out)
        except WritebackError as e:
            assert isinstance(e.report, WritebackReport)
            e.result = DriverResult(list(ex.argv), returncode, out, err,
                                    self._receipt(ex, e.report), timed_out, e.report, ex.jail,
                                    ex.mode, truncated)
            raise
        return DriverResult(list(ex.argv), returncode, out, err, self._receipt(ex, report),
                            timed_out, report, ex.jail, ex.mode, truncated)

    async def run_async(self, pack: Pack | str | os.PathLike[str], argv: Sequence[str], *,
                        principal: str = DEFAULT_PRINCIPAL,
                        credentials: Mapping[str, str] | None = None,
                        input: bytes | None = None, capture_output: bool = False,
                        timeout: float | None = None, cwd: str | None = None) -> DriverResult:
        """:meth:`run` for asyncio: many at once on one loop, cancellable.

        Blocking stages (waiting for a workspace lock, copying inputs, writeback, removing a
        jail) run in the default executor. The fork itself happens on the event-loop thread:
        the engine's PDEATHSIG fires when the forking thread exits, and an executor thread
        is not guaranteed to outlive the child, while the loop thread is. The run's end is
        awaited through an fd registered with the loop (SandboxProcess.end_fd: no thread
        parked in waitpid).
        On cancellation the sandbox is killed and the jail cleaned up before
        ``CancelledError`` propagates.
        """
        loop = asyncio.get_running_loop()
        pack = self.load_pack(pack)
        self.check(pack, argv, principal=principal, credentials=credentials, cwd=cwd)
        cancel = threading.Event()
        prep = loop.run_in_executor(None, self._prepare_and_rewrite, pack, argv, principal,
                                    credentials, cwd, cancel)
        try:
            ex = await asyncio.shield(prep)
        except asyncio.CancelledError:
            # The thread goes on: stop its wait for a lock, and undo whatever it prepared.
            cancel.set()
            prep.add_done_callback(
                lambda f: None if f.cancelled() or f.exception() is not None
                else loop.run_in_executor(None, self.cleanup, f.result()))
            raise
        try:
            timeout = ex.policy.timeout if timeout is None else timeout
            proc = self.spawn(ex, stdin=PIPE if input is not None else None,
                              stdout=PIPE if capture_output else None,
                              stderr=PIPE if capture_output else None)
            out, err, timed_out = await communicate(loop, proc, input, timeout,
                                                    ex.policy.limits.output)
        except BaseException:
            # Shielded: a second cancellation cannot stop the cleanup thread half-way.
            await asyncio.shield(loop.run_in_executor(None, self.cleanup, ex))
            raise
        assert proc.returncode is not None
        return await asyncio.shield(loop.run_in_executor(
            None, self._finish_and_cleanup, ex, proc.returncode, out, err, timed_out,
            frozenset(proc.truncated)))

    def _prepare_and_rewrite(self, pack: Pack, argv: Sequence[str], principal: str,
                             credentials: Mapping[str, str] | None, cwd: str | None,
                             cancel: threading.Event) -> Execution:
        ex = self._prepare(pack, principal, credentials, cwd, cancel)
        try:
            self.rewrite_argv(ex, argv)
            if cancel.is_set():  # cancelled while we worked: nobody will take the result
                raise _Cancelled()
        except BaseException:
            self.cleanup(ex)
            raise
        return ex

    def _finish_and_cleanup(self, ex: Execution, returncode: int, out: bytes | None,
                            err: bytes | None, timed_out: bool,
                            truncated: frozenset[str]) -> DriverResult:
        try:
            return self._finish(ex, returncode, out, err, timed_out, truncated)
        finally:
            self.cleanup(ex)
