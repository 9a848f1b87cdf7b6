"""`hcp-linux` / `python -m hcp_linux`: run a command confined, probe the host, reclaim leftovers.

Every refusal is one line on stderr, ``error: sandbox: <what>``, with the exit status of
DESIGN §5 (the README's table), and nothing spawned or written.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from typing import Any, NoReturn, Sequence

from .errors import EXIT_USAGE, SandboxError, printable
from .policy import NETWORK_MODES, Policy


class _Formatter(argparse.HelpFormatter):
    """argparse's formatter, told the width: left to itself it imports shutil (2 ms, with
    bz2 and lzma) at every add_argument, on the start-up path of every `hcp-linux run`."""

    def __init__(self, prog: str, **kwargs: Any) -> None:
        if kwargs.get("width") is None:
            try:
                kwargs["width"] = int(os.environ.get("COLUMNS", "")) - 2
            except ValueError:
                try:
                    kwargs["width"] = os.get_terminal_size(sys.__stdout__.fileno()).columns - 2
                except (AttributeError, ValueError, OSError):
                    kwargs["width"] = 78
        super().__init__(prog, **kwargs)


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:  # one line, our prefix, exit 2
        print(f"error: sandbox: {message} (see '{self.prog} --help')", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="hcp-linux", description="Linux confinement backend for HCP §10 Sandbox.")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    pr = sub.add_parser("probe", help="which confinement layers this host can enforce")
    pr.add_argument("--json", action="store_true", help="machine-readable output")
    c = sub.add_parser("conformance", help="check the HCP §10 rules on this host, with evidence")
    c.add_argument("--json", action="store_true", help="machine-readable output")
    c.add_argument("--junit", metavar="FILE", help="also write a JUnit XML report to FILE")
    c.add_argument("--allow-degraded", action="append", default=[], metavar="LAYER",
                   help="let LAYER degrade in every run the checks make (repeatable)")
    r = sub.add_parser("run", help="run one command confined",
                       usage="hcp-linux run [OPTIONS] -- BIN [ARG...]")
    r.add_argument("--jail", help="working directory and first writable root (default: cwd)")
    r.add_argument("--write-root", action="append", default=[], metavar="DIR")
    r.add_argument("--read-only-root", action="append", default=[], metavar="DIR")
    r.add_argument("--network", help=f"one of {', '.join(NETWORK_MODES)} (default none)")
    r.add_argument("--allow-host", action="append", default=[], metavar="HOST[:PORT]",
                   help="with --network allow: egress allowed to HOST (repeatable; *.example.com, "
                        "IP literals, CIDRs)")
    r.add_argument("--deny-host", action="append", default=[], metavar="HOST[:PORT]",
                   help="with --network allow: refused even when an allow entry matches")
    r.add_argument("--proxy-log", metavar="FILE", help="append each egress decision as JSON")
    r.add_argument("--allow-bin", action="append", default=[], metavar="BIN")
    r.add_argument("--policy", metavar="FILE", help="TOML policy file (keys as in Policy)")
    r.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    r.add_argument("--timeout", type=float, metavar="SECONDS")
    r.add_argument("--allow-degraded", action="append", default=[], metavar="LAYER")
    r.add_argument("--no-sandbox", action="store_true")
    r.add_argument("--native-local", action="store_true")
    r.add_argument("--limit", action="append", default=[], metavar="KEY=VALUE",
                   help="resource limit, e.g. nproc=256 fsize=1g as=4g tmp_size=512m "
                        "(repeatable; 'unlimited' lifts one)")
    r.add_argument("--on-exit", choices=("kill", "wait"),
                   help="when the command exits: kill what it left running (default) or wait")
    r.add_argument("--receipt", metavar="FILE|-", help="write the receipt as JSON ('-': stderr)")
    r.add_argument("--pack", metavar="FILE", help="HCP pack manifest: run via the driver")
    r.add_argument("--principal", metavar="NAME", help="whose workspace (with --pack)")
    r.add_argument("--executor", choices=("auto", "native", "ctypes"), help=argparse.SUPPRESS)
    r.add_argument("command", nargs=argparse.REMAINDER)
    g = sub.add_parser("gc", help="remove what runs that died left: ephemeral jails, "
                                  "staging in idle workspaces, temp files beside outputs")
    g.add_argument("--dry-run", action="store_true", help="list, remove nothing")
    g.add_argument("--tmp-dir", metavar="DIR",
                   help="where ephemeral jails live (default: the system temp dir)")
    g.add_argument("--state-dir", metavar="DIR",
                   help="where workspaces live (default: $XDG_STATE_HOME/hcp-linux)")
    g.add_argument("paths", nargs="*", metavar="PATH",
                   help="a directory that outputs were written back to: its temp files")
    sv = sub.add_parser("serve", help="compile plans for `hcp-linux run` in a warm process "
                                      "(clients: HCP_LINUX_SERVER=SOCKET)")
    sv.add_argument("--socket", required=True, metavar="PATH",
                    help="the unix socket to listen on (made mode 0600)")
    return p


def policy_from_args(a: argparse.Namespace) -> Policy:
    env: dict[str, str] = {}
    for item in a.env:
        key, sep, value = item.partition("=")
        if not sep:
            raise SandboxError(f"--env {item!r}: expected KEY=VALUE")
        env[key] = value
    base: dict = {}
    if a.policy:
        base = {f: getattr(p, f) for p in [Policy.from_toml(a.policy)]
                for f in ("jail", "write_roots", "read_only_roots", "system_roots", "network",
                          "allow_bins", "env", "allow_degraded", "sandbox", "native_local",
                          "seccomp_profiles", "timeout", "limits", "on_exit", "allow_hosts",
                          "deny_hosts", "proxy_log")}
    fields = dict(base)
    if a.jail is not None:
        fields["jail"] = a.jail
    fields["write_roots"] = tuple(base.get("write_roots", ())) + tuple(a.write_root)
    fields["read_only_roots"] = tuple(base.get("read_only_roots", ())) + tuple(a.read_only_root)
    fields["allow_bins"] = tuple(base.get("allow_bins", ())) + tuple(a.allow_bin)
    fields["allow_hosts"] = tuple(base.get("allow_hosts", ())) + tuple(a.allow_host)
    fields["deny_hosts"] = tuple(base.get("deny_hosts", ())) + tuple(a.deny_host)
    if a.proxy_log is not None:
        fields["proxy_log"] = a.proxy_log
    fields["allow_degraded"] = tuple(base.get("allow_degraded", ())) + tuple(a.allow_degraded)
    fields["env"] = {**dict(base.get("env", {})), **env}
    limits = dict(base["limits"].as_dict()) if "limits" in base else {}
    for item in a.limit:
        key, sep, value = item.partition("=")
        if not sep:
            raise SandboxError(f"--limit {item!r}: expected KEY=VALUE")
        limits[key] = int(value) if value.isdigit() else value
    fields["limits"] = limits
    if a.on_exit is not None:
        fields["on_exit"] = a.on_exit
    if a.network is not None:
        fields["network"] = a.network
    if a.timeout is not None:
        fields["timeout"] = a.timeout
    if a.no_sandbox or a.native_local:
        fields["sandbox"] = not a.no_sandbox
        fields["native_local"] = a.native_local
    return Policy(**fields)


def command_of(a: argparse.Namespace) -> list[str]:
    """The command `run` was given (after ``--``); refused when there is none."""
    argv = list(a.command)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        raise SandboxError("run: no command given (hcp-linux run [OPTIONS] -- BIN [ARG...])")
    return argv


def _run(a: argparse.Namespace) -> int:
    from .interrupt import EndOnSignal, end_by_signal
    from .launch import end_of_run
    from .sandbox import Sandbox

    argv = command_of(a)
    if a.executor is not None:  # hidden: the test suite runs once per executor
        from .native import set_default
        set_default(a.executor)
    if a.pack is not None or a.principal is not None:  # HCP pack: docs/driver.md
        from .driver_cli import run_pack
        return run_pack(a, argv)
    policy = policy_from_args(a)
    # The CLI's own job control: ^C, TERM or HUP kill the whole sandbox, and then the CLI
    # dies by that signal, as a shell expects (hcp_linux.interrupt).
    end = EndOnSignal()
    proc = None
    timed_out = False
    status = None
    with end:
        try:
            with end.deferred(then_raise=True):
                proc = Sandbox(policy).spawn(argv)
            status = proc.wait(policy.timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            with end.deferred():
                if proc is not None:
                    if proc.returncode is None:
                        proc.kill()
                    status = proc.wait()
    receipt = dict(proc.receipt) if proc is not None else None
    if end.signum is not None:
        end_by_signal(end.signum, receipt, a.receipt, status)
    assert receipt is not None and status is not None
    return end_of_run(receipt, a.receipt, status, timed_out, policy.timeout)


def _probe(a: argparse.Namespace) -> int:
    from .probe import format_table, probe

    report = probe()
    if a.json:
        print(json.dumps(report.as_dict(), indent=2, sort_keys=True))
    else:
        print(format_table(report))
    return 0 if report.fully_enforceable else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.cmd == "conformance":
            from .conformance import main as conformance
            return conformance(args.allow_degraded, json_out=args.json, junit=args.junit)
        if args.cmd == "serve":
            from .serve import serve
            return serve(args.socket)
        if args.cmd == "gc":
            from .gc import gc
            return gc(args.paths, tmp_dir=args.tmp_dir, state_dir=args.state_dir,
                      dry_run=args.dry_run)
        return _run(args) if args.cmd == "run" else _probe(args)
    except SandboxError as e:
        print(f"error: sandbox: {printable(str(e))}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:  # ^C before (or after) a run: end by it, as a shell expects
        from .interrupt import die_by
        die_by(signal.SIGINT)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
