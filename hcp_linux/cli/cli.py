"""`hcp-linux` / `python -m hcp_linux`: run a command confined, probe the host, reclaim leftovers.

Every refusal is one line on stderr, ``error: sandbox: <what>``, with the exit status of
the README's table of exit statuses, and nothing spawned or written.
"""
from __future__ import annotations

import argparse
import os
import signal
import stat
import subprocess
import sys
from typing import Sequence

from .cli_args import build_parser, check_outputs, command_of, policy_and_layers
from ..errors import (EXIT_REFUSED, EXIT_USAGE, PolicyError, SandboxError, limit_hint,
                      printable)

#: The subcommands, for the hint a bare `hcp-linux` prints.
COMMANDS = ("probe", "conformance", "run", "policy", "gc", "serve")


def _run(a: argparse.Namespace) -> int:
    from .interrupt import EndOnSignal, end_by_signal
    from .run_end import end_of_run, open_receipt_dir
    from ..sandbox import Sandbox

    argv = command_of(a)
    check_outputs(a)
    if a.executor is not None:  # hidden: the test suite runs once per executor
        from ..native import set_default
        set_default(a.executor)
    if a.pack is not None or a.principal is not None:  # HCP pack: docs/driver.md
        from .driver_cli import run_pack
        return run_pack(a, argv)
    policy, layers = policy_and_layers(a)
    check_outputs(a, policy)
    try:  # where the receipt goes, fixed before the command can change the path
        receipt_dir = open_receipt_dir(a.receipt)
    except OSError as e:
        raise SandboxError(f"receipt {printable(a.receipt)}: {e.strerror or e}") from None
    # The CLI's own job control: ^C, TERM or HUP kill the whole sandbox, and then the CLI
    # dies by that signal, as a shell expects (hcp_linux.cli.interrupt).
    end = EndOnSignal()
    proc = None
    timed_out = False
    status = None
    winch = _WinchForwarder() if policy.pty and os.isatty(0) else None
    with end:
        try:
            with end.deferred(then_raise=True):
                proc = Sandbox(policy).spawn(argv)
            if winch is not None:
                winch.attach(proc.pid)
            status = proc.wait(policy.timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            with end.deferred():
                if proc is not None:
                    if proc.returncode is None:
                        proc.kill()
                    status = proc.wait()
    if winch is not None:
        signal.signal(signal.SIGWINCH, signal.SIG_DFL)  # reaped: its pid may be reused
    receipt = dict(proc.receipt) if proc is not None else None
    if receipt is not None and layers:
        from ..receipt_keys import set_policy_layers
        set_policy_layers(receipt, layers)
    if end.signum is not None:
        end_by_signal(end.signum, receipt, a.receipt, status, receipt_dir)
    assert receipt is not None and status is not None
    code = end_of_run(receipt, a.receipt, status, timed_out, policy.timeout, a.explain,
                      receipt_dir)
    global run_over
    run_over = True
    return code


def os_refusal(e: OSError) -> str:
    """What the host refused, in one line: the path if there is one, the reason, and for
    running out of fds or processes (EAGAIN here is a fork, a spawn or a thread) the limit
    that may have done it."""
    what = f"{printable(os.fsdecode(e.filename))}: " if e.filename is not None else ""
    return f"{what}{e.strerror or e}{limit_hint(e.errno, making_a_process=True)}"


#: Set once a plain `run` has ended: its command and every process of it are gone (the
#: init said), the receipt is written, the proxy's log closed. The program then ends at once
#: (hcp_linux.cli.launch.entry): the interpreter's finalisation of the engine's ~200 modules
#: costs the caller 10 ms or more and does nothing for it (no atexit hook, no non-daemon
#: thread, no file left open to flush).
run_over = False


class _WinchForwarder:
    """--tty on a terminal: the command runs in a session of its own, so the terminal's
    SIGWINCH reaches only this process; pass it on to the command's process group (the
    sandbox's session leader's, which the command and its children inherit). Installed before
    the spawn: a resize meanwhile is passed on once the group is known."""

    def __init__(self) -> None:
        self.pgid: int | None = None
        self.pending = False
        signal.signal(signal.SIGWINCH, self._on_winch)

    def attach(self, pgid: int) -> None:
        self.pgid = pgid
        if self.pending:
            self._on_winch(signal.SIGWINCH, None)

    def _on_winch(self, signum: int, frame: object) -> None:
        if self.pgid is None:
            self.pending = True
            return
        try:
            os.killpg(self.pgid, signal.SIGWINCH)
        except OSError:
            pass  # the sandbox is gone (not yet reaped: the group is still its own)


def _probe(a: argparse.Namespace) -> int:
    from ..probe import format_table, probe

    if a.executor is not None:  # hidden: the test suite runs once per executor
        from ..native import set_default
        set_default(a.executor)
    report = probe()
    from .config import describe
    configs = describe()
    if a.json:
        import json
        print(json.dumps({**report.as_dict(), "configs": configs}, indent=2, sort_keys=True))
    else:
        print(format_table(report))
        for c in configs:
            print(f"{c['kind']}: {c['path']}: {c['status']}")
    return 0 if report.fully_enforceable else 1


def _profile(a: argparse.Namespace) -> int:
    """`profile seccomp|apparmor`: the shipped file on stdout. Why: in a container the file
    lives at a path inside the image, and the runtime needs it on the host before the
    container starts (`docker run --rm IMAGE hcp-linux profile seccomp > hcp-linux.json`)."""
    from ..host.remedies import APPARMOR_PROFILE, SECCOMP_PROFILE
    from ..native import BUILD_DIR
    with open(SECCOMP_PROFILE if a.kind == "seccomp" else APPARMOR_PROFILE) as f:
        text = f.read()
    if a.kind == "apparmor":
        text = text.replace("HCP_EXEC_DIR", BUILD_DIR)
    sys.stdout.write(text)
    return 0


def _gc(a: argparse.Namespace) -> int:
    """`gc`, its directories checked before anything is removed: each PATH and ``--tmp-dir``
    must be an existing directory, ``--state-dir`` a directory or absent (no workspace was
    ever made: nothing to reclaim), none of them "" (which is not "the default"), and the
    defaults' variables (TMPDIR, XDG_STATE_HOME, HOME) valid, as for a run."""
    from ..jails.gc import gc
    from ..jails.workspace import default_state_dir, default_tmp_dir
    for flag, value in (("--tmp-dir", a.tmp_dir), *(("PATH", p) for p in a.paths)):
        if value is not None:
            _check_dir(value, flag, missing_ok=False)
    if a.state_dir is not None:
        _check_dir(a.state_dir, "--state-dir", missing_ok=True)
    tmp_dir = a.tmp_dir if a.tmp_dir is not None else default_tmp_dir()
    state_dir: str | None = a.state_dir
    if state_dir is None:
        home = os.environ.get("HOME", "")
        if not os.environ.get("XDG_STATE_HOME") and os.path.isabs(home) \
                and not os.path.lexists(home):
            # a service user's home that does not exist (nobody: /nonexistent): no workspace
            # was ever made under the default state dir, so there is none to sweep
            return gc(a.paths, tmp_dir=tmp_dir, state_dir=None, workspaces=False,
                      dry_run=a.dry_run)
        state_dir = default_state_dir()
    return gc(a.paths, tmp_dir=tmp_dir, state_dir=state_dir, dry_run=a.dry_run)


def _check_dir(path: str, what: str, *, missing_ok: bool) -> None:
    shown = f"gc {what}" if what != "PATH" else "gc"
    if not path:
        raise PolicyError(f"{shown}: empty path")
    shown += f" {printable(path)}"
    try:
        st = os.stat(path)
    except FileNotFoundError as e:
        if missing_ok:
            return
        raise PolicyError(f"{shown}: {e.strerror}") from None
    except OSError as e:
        raise PolicyError(f"{shown}: {e.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise PolicyError(f"{shown}: not a directory")


def _conformance(a: argparse.Namespace) -> int:
    """`conformance`: the JUnit file checked, and the temp dir its runs use, before the
    checks run (they take a while; a bad path found after them loses the report)."""
    from ..conformance import main as conformance
    from ..jails.workspace import default_tmp_dir
    if a.junit is not None:
        from ..run.receipt import check_output_path
        check_output_path(a.junit, "--junit")
    preset = None
    codex_hosts = a.policy_from == "codex"
    if a.policy_from is not None and a.policy is None:
        raise PolicyError(f"conformance: --from {a.policy_from} goes with --policy FILE "
                          f"(the {a.policy_from} settings to import and check)")
    if a.preset is not None or (a.allow_host and not codex_hosts):
        from ..policy import presets
        if a.preset is None:
            raise PolicyError("conformance: --allow-host goes with --preset "
                              "workspace-write-net or --from codex")
        preset = (a.preset, presets.table_with_hosts(
            presets.get(a.preset), () if codex_hosts else a.allow_host))
    policy_file = None
    if a.policy is not None:
        from ..conformance.harness import base_parent
        from ..conformance.policy_base import load
        policy_file = load(a.policy, base_parent(), source_kind=a.policy_from,
                           hosts=tuple(a.allow_host) if codex_hosts else ())
    if a.executor is not None:  # hidden: the test suite runs once per executor
        from ..native import set_default
        set_default(a.executor)
    default_tmp_dir()
    return conformance(a.allow_degraded, json_out=a.json, junit=a.junit, rung=a.rung,
                       preset=preset, policy_file=policy_file, executor=a.executor)


def bare_usage(parser: argparse.ArgumentParser) -> int:
    """`hcp-linux` alone: the usage, on one line whatever the terminal's width, and a hint
    (argparse would say "the following arguments are required: cmd"); exit 2."""
    usage = " ".join(parser.format_usage().split())
    print(usage, file=sys.stderr)
    print(f"error: sandbox: no command given: {', '.join(COMMANDS)} (see 'hcp-linux --help')",
          file=sys.stderr)
    return EXIT_USAGE


def main(argv: Sequence[str] | None = None) -> int:
    global run_over
    run_over = False
    args_list = list(sys.argv[1:] if argv is None else argv)
    # `run` parses the same with its own subparser alone, and a run pays for the rest
    parser = build_parser("run" if args_list[:1] == ["run"] else None)
    if not args_list:
        return bare_usage(parser)
    args = parser.parse_args(args_list)
    try:
        if args.cmd == "conformance":
            return _conformance(args)
        if args.cmd == "serve":
            from .serve import serve
            return serve(args.socket, args.idle_exit, args.auto)
        if args.cmd == "gc":
            return _gc(args)
        if args.cmd == "profile":
            return _profile(args)
        if args.cmd == "policy":
            from .policy_cmd import policy_command
            return policy_command(args)
        return _run(args) if args.cmd == "run" else _probe(args)
    except SandboxError as e:
        print(f"error: sandbox: {printable(str(e))}", file=sys.stderr)
        return e.exit_code
    except OSError as e:  # the host refused us something (fds, memory): one line, no trace
        print(f"error: sandbox: {os_refusal(e)}", file=sys.stderr)
        return EXIT_REFUSED
    except RuntimeError as e:
        if str(e) != "can't start new thread":  # threading's words for EAGAIN from clone
            raise
        import errno
        print(f"error: sandbox: cannot start a thread{limit_hint(errno.EAGAIN, True)}",
              file=sys.stderr)
        return EXIT_REFUSED
    except KeyboardInterrupt:  # ^C before (or after) a run: end by it, as a shell expects
        from .interrupt import die_by
        die_by(signal.SIGINT)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
