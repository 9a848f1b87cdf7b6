"""The command line of `hcp-linux`: its parser, and what `run`'s options mean (the policy,
the command, the output files), for the CLI, the driver's `run --pack` and `hcp-linux serve`.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
from typing import Any, NoReturn

from . import __version__
from .environment import is_injection_key
from .errors import EXIT_USAGE, PolicyError, SandboxError, printable
from .policy import DEFAULT_SECCOMP_PROFILES, DEFAULT_SYSTEM_ROOTS, NETWORK_MODES, Policy

#: What `--env` accepts as a name: the portable shell name, as a pack's wrap.agent_env
#: (anything else cannot be read by a shell and is most likely a mistake: "A B=1").
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class _Formatter(argparse.HelpFormatter):
    """argparse's formatter, told the width: left to itself it imports shutil (2 ms, with
    bz2 and lzma) at every add_argument, on the start-up path of every `hcp-linux run`."""

    def __init__(self, prog: str, **kwargs: Any) -> None:
        if kwargs.get("width") is None:
            kwargs["width"] = _columns() - 2
        super().__init__(prog, **kwargs)


def _columns() -> int:
    """The terminal's width: ``COLUMNS`` when it is a sensible number (as shutil reads it,
    a hint, so a bad value is ignored, not refused), else the terminal's, else 80."""
    try:
        columns = int(os.environ.get("COLUMNS", ""))
        if 10 <= columns <= 1000:
            return columns
    except ValueError:
        pass
    try:
        columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        if 10 <= columns <= 1000:
            return columns
    except (AttributeError, ValueError, OSError):
        pass
    return 80


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        """A usage error is one line, with the prefix of every refusal, and exit 2 (the
        README's table); argparse's own form is two (usage, then "prog: error: ...") and shows what the
        user typed raw: a control character in argv could add lines or move the cursor."""
        print(f"error: sandbox: {printable(message)} (see '{self.prog} --help')",
              file=sys.stderr)
        sys.exit(EXIT_USAGE)


class _Once(argparse.Action):
    """An option that takes one value and may be given once: argparse keeps the last of
    ``--timeout 5 --timeout 500`` without a word; which one the caller meant is unknown, so
    the command line is refused (exit 2). Repeatable options are ``action="append"``."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        given = namespace.__dict__.setdefault("_given", set())
        if self.dest in given:
            parser.error(f"{option_string or self.dest}: given more than once")
        given.add(self.dest)
        setattr(namespace, self.dest, values)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="hcp-linux", description="Linux confinement backend for HCP §10 Sandbox.")
    p.add_argument("--version", action="version", version=f"hcp-linux {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    pr = sub.add_parser("probe", help="which confinement layers this host can enforce")
    pr.add_argument("--json", action="store_true", help="machine-readable output")
    c = sub.add_parser("conformance", help="check the HCP §10 rules on this host, with evidence")
    c.add_argument("--json", action="store_true", help="machine-readable output")
    c.add_argument("--junit", action=_Once, metavar="FILE",
                   help="also write a JUnit XML report to FILE")
    c.add_argument("--allow-degraded", action="append", default=[], metavar="LAYER",
                   help="let LAYER degrade in every run the checks make (repeatable)")
    r = sub.add_parser("run", help="run one command confined",
                       usage="hcp-linux run [OPTIONS] -- BIN [ARG...]")
    r.add_argument("--jail", action=_Once,
                   help="working directory and first writable root (default: cwd)")
    r.add_argument("--read-only-jail", action="store_true",
                   help="the jail is the working directory only, read-only (writes go to "
                        "the private /tmp and the write roots)")
    r.add_argument("--write-root", action="append", default=[], metavar="DIR")
    r.add_argument("--read-only-root", action="append", default=[], metavar="DIR")
    r.add_argument("--system-root", action="append", default=[], metavar="DIR",
                   help="a read-only system root; given, these replace the default set "
                        f"({' '.join(DEFAULT_SYSTEM_ROOTS)}) (repeatable)")
    r.add_argument("--network", action=_Once,
                   help=f"one of {', '.join(NETWORK_MODES)} (default none)")
    r.add_argument("--allow-host", action="append", default=[], metavar="HOST[:PORT]",
                   help="with --network allow: egress allowed to HOST (repeatable; *.example.com, "
                        "IP literals, CIDRs)")
    r.add_argument("--deny-host", action="append", default=[], metavar="HOST[:PORT]",
                   help="with --network allow: refused even when an allow entry matches")
    r.add_argument("--proxy-log", action=_Once, metavar="FILE",
                   help="append each egress decision as JSON")
    r.add_argument("--allow-bin", action="append", default=[], metavar="BIN")
    r.add_argument("--policy", action=_Once, metavar="FILE",
                   help="TOML policy file (keys as in Policy)")
    r.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    r.add_argument("--timeout", action=_Once, type=float, metavar="SECONDS")
    r.add_argument("--allow-degraded", action="append", default=[], metavar="LAYER")
    r.add_argument("--seccomp-profile", action="append", default=[], metavar="NAME",
                   help="a seccomp profile to apply; given, these replace the default set "
                        f"({' '.join(DEFAULT_SECCOMP_PROFILES)}) (repeatable)")
    r.add_argument("--no-sandbox", action="store_true")
    r.add_argument("--native-local", action="store_true")
    r.add_argument("--limit", action="append", default=[], metavar="KEY=VALUE",
                   help="resource limit, e.g. nproc=256 fsize=1g as=4g tmp_size=512m "
                        "(repeatable; 'unlimited' lifts one)")
    r.add_argument("--on-exit", action=_Once, choices=("kill", "wait"),
                   help="when the command exits: kill what it left running (default) or wait")
    r.add_argument("--receipt", action=_Once, metavar="FILE|-",
                   help="write the receipt as JSON ('-': stderr)")
    r.add_argument("--pack", action=_Once, metavar="FILE",
                   help="HCP pack manifest: run via the driver")
    r.add_argument("--principal", action=_Once, metavar="NAME",
                   help="whose workspace (with --pack)")
    r.add_argument("--executor", action=_Once, choices=("auto", "native", "ctypes"),
                   help=argparse.SUPPRESS)
    r.add_argument("command", nargs=argparse.REMAINDER)
    g = sub.add_parser("gc", help="remove what runs that died left: ephemeral jails, "
                                  "staging in idle workspaces, temp files beside outputs")
    g.add_argument("--dry-run", action="store_true", help="list, remove nothing")
    g.add_argument("--tmp-dir", action=_Once, metavar="DIR",
                   help="where ephemeral jails live (default: the system temp dir)")
    g.add_argument("--state-dir", action=_Once, metavar="DIR",
                   help="where workspaces live (default: $XDG_STATE_HOME/hcp-linux)")
    g.add_argument("paths", nargs="*", metavar="PATH",
                   help="a directory that outputs were written back to: its temp files")
    sv = sub.add_parser("serve", help="compile plans for `hcp-linux run` in a warm process "
                                      "(clients: HCP_LINUX_SERVER=SOCKET)")
    sv.add_argument("--socket", action=_Once, required=True, metavar="PATH",
                    help="the unix socket to listen on (made mode 0600)")
    return p


def policy_from_args(a: argparse.Namespace) -> Policy:
    """The policy of `run`'s flags (over a ``--policy`` file's), validated (PolicyError)."""
    if a.jail is None:
        check_cwd(" (give --jail DIR)")
    if a.policy == "":
        raise PolicyError("--policy: empty path")
    env: dict[str, str] = {}
    for item in a.env:
        if not isinstance(item, str):  # argparse makes the value `--` of an append flag []
            raise PolicyError("--env: expected KEY=VALUE, got '--'")
        key, sep, value = item.partition("=")
        if not sep:
            raise PolicyError(f"--env {item!r}: expected KEY=VALUE")
        if not ENV_NAME.match(key) and not is_injection_key(key):  # that one has its message
            raise PolicyError(f"--env: invalid variable name {key!r} (letters, digits and "
                              f"_, not starting with a digit)")  # not the value: a secret?
        env[key] = value
    base: dict = {}
    if a.policy:
        # a file without a jail takes --jail's, not the cwd's (which may not be a valid one);
        # a file's own jail is checked, then --jail replaces it
        fallback = {"jail": a.jail} if a.jail is not None else None
        from_file = Policy.from_toml(a.policy, fallback=fallback)
        base = {f.name: getattr(from_file, f.name) for f in dataclasses.fields(Policy)}
    fields = dict(base)
    if a.jail is not None:
        fields["jail"] = a.jail
    if a.read_only_jail:
        fields["read_only_jail"] = True
    fields["write_roots"] = tuple(base.get("write_roots", ())) + tuple(a.write_root)
    fields["read_only_roots"] = tuple(base.get("read_only_roots", ())) + tuple(a.read_only_root)
    fields["allow_bins"] = tuple(base.get("allow_bins", ())) + tuple(a.allow_bin)
    for name, given in (("system_roots", a.system_root), ("seccomp_profiles", a.seccomp_profile)):
        if given:  # sets with a default: given, they replace it (and a file's)
            fields[name] = tuple(given)
    fields["allow_hosts"] = tuple(base.get("allow_hosts", ())) + tuple(a.allow_host)
    fields["deny_hosts"] = tuple(base.get("deny_hosts", ())) + tuple(a.deny_host)
    if a.proxy_log is not None:
        fields["proxy_log"] = a.proxy_log
    fields["allow_degraded"] = tuple(base.get("allow_degraded", ())) + tuple(a.allow_degraded)
    fields["env"] = {**dict(base.get("env", {})), **env}
    limits = dict(base["limits"].as_dict()) if "limits" in base else {}
    for item in a.limit:
        if not isinstance(item, str):  # argparse makes the value `--` of an append flag []
            raise PolicyError("--limit: expected KEY=VALUE, got '--'")
        key, sep, value = item.partition("=")
        if not sep:
            raise SandboxError(f"--limit {item!r}: expected KEY=VALUE")
        limits[key] = value  # Limits parses the text itself (hcp_linux.values)
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


def check_cwd(hint: str = "") -> None:
    """The jail defaults to the current directory, and relative paths start there: one that
    was removed is refused here, by name, rather than as a traceback from deep inside."""
    try:
        os.getcwd()
    except OSError as e:
        raise PolicyError(f"run: the current directory: {e.strerror}{hint}") from None


def check_outputs(a: argparse.Namespace, policy: Policy | None = None) -> None:
    """`run`'s output files, checked before anything starts (receipt.check_output_path):
    ``--receipt`` (``-``: standard error) and the proxy log, of the flag or of the policy
    file. Found after the run, a bad one would cost the command's exit status."""
    from .receipt import check_output_path
    if a.receipt is not None and a.receipt != "-":
        check_output_path(a.receipt, "--receipt", hint="; '-' writes it to standard error")
    if a.proxy_log is not None:
        check_output_path(a.proxy_log, "--proxy-log", replace=False)
    if policy is not None and policy.proxy_log and policy.proxy_log != a.proxy_log:
        check_output_path(policy.proxy_log, "proxy_log", replace=False)


def command_of(a: argparse.Namespace) -> list[str]:
    """The command `run` was given (after ``--``); refused when there is none."""
    argv = list(a.command)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        raise SandboxError("run: no command given (hcp-linux run [OPTIONS] -- BIN [ARG...])")
    return argv

