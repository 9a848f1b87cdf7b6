"""The command line of `hcp-linux`: its parser, and what `run`'s options mean (the policy,
the command, the output files), for the CLI, the driver's `run --pack` and `hcp-linux serve`.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
from typing import Any, NoReturn, Sequence

from .._version import __version__
from ..policy import ladder, policy_flags, protected
from ..errors import EXIT_USAGE, PolicyError, SandboxError, printable
from ..policy.policy import Policy
from ..policy.resolve import resolve
from ..policy.policy_flags import FIELDS


class _Formatter(argparse.RawDescriptionHelpFormatter):
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
        user typed raw: a control character in argv could add lines or move the cursor.
        A mistyped choice gets the nearest one."""
        choice = _INVALID_CHOICE.fullmatch(message)
        if choice is not None:
            options = _QUOTED.findall(choice.group(3))
            message += _did_you_mean(choice.group(2), options)
        print(f"error: sandbox: {printable(message)} (see '{self.prog} --help')",
              file=sys.stderr)
        sys.exit(EXIT_USAGE)


class _SubParser(_Parser):
    """A subcommand's parser: an option it does not know is refused here, with the nearest
    of its own options (argparse would report it from the top-level parser, which knows
    neither the subcommand nor its options)."""

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        namespace, extras = super().parse_known_args(args, namespace)
        unknown = [x for x in extras if isinstance(x, str) and x.startswith("-")]
        if unknown:
            word = unknown[0].split("=", 1)[0]
            known = [o for a in self._actions for o in a.option_strings if o.startswith("--")]
            self.error(f"unrecognized option {unknown[0]}{_did_you_mean(word, known)}")
        return namespace, extras


#: argparse's message for a value outside ``choices`` (3.11 and 3.12 spellings).
_INVALID_CHOICE = re.compile(r"argument (\S+): invalid choice: '(.*)' \(choose from (.*)\)",
                             re.S)
_QUOTED = re.compile(r"'([^']*)'")


def _did_you_mean(word: str, known: Sequence[str]) -> str:
    """`` (did you mean --network?)`` for a near miss (difflib, as packs' keys), else ""."""
    import difflib
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


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


#: The end of `run --help`: the exit statuses (the README's table) and where the rest is.
RUN_EPILOG = """exit status:
  the command's own   it ran and exited
  128+N               it died of signal N
  2                   command-line usage error
  124                 --timeout expired; the whole sandbox was killed
  125                 refused (bad policy, missing layer, code-injection variable) or failed
                      before exec; with --pack, also a failed writeback
  126                 the binary was found but is not executable
  127                 not allow-listed, or not found
  death by N          run got SIGINT, SIGTERM or SIGHUP: the sandbox was killed and
                      cleaned up, then run died by N (a shell shows 128+N)
Every refusal is one line on stderr, 'error: sandbox: ...'. Every flag and policy key:
docs/policy.md."""


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of `hcp-linux` and its subcommands; it holds no state between parses.
    ``only``: that subcommand's alone (the CLI given ``run`` builds no other: ~1 ms of
    every run's start-up); what it parses is the same."""
    p = _Parser(prog="hcp-linux", description="Linux confinement backend for HCP §10 Sandbox.")
    p.add_argument("--version", action="version", version=f"hcp-linux {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_SubParser)
    if only in (None, "probe"):
        pr = sub.add_parser("probe", help="which confinement layers this host can enforce")
        pr.add_argument("--json", action="store_true", help="machine-readable output")
        pr.add_argument("--executor", action=_Once, choices=("auto", "native", "ctypes"),
                        help=argparse.SUPPRESS)
    if only in (None, "conformance"):
        c = sub.add_parser("conformance", help="check the HCP §10 rules on this host, with evidence")
        c.add_argument("--json", action="store_true", help="machine-readable output")
        c.add_argument("--junit", action=_Once, metavar="FILE",
                       help="also write a JUnit XML report to FILE")
        c.add_argument("--allow-degraded", action="append", default=[], metavar="LAYER",
                       help="let LAYER degrade in every run the checks make (repeatable)")
        c.add_argument("--rung", action=_Once, default="full", choices=ladder.NAMES,
                       help="the weakest fallback rung the checks' runs may fall to "
                            "(default full: strict)")
        c.add_argument("--preset", action=_Once, metavar="NAME",
                       help="check under a named policy: each check's runs start from it "
                            "(hcp-linux policy list)")
        c.add_argument("--allow-host", action="append", default=[], metavar="HOST[:PORT]",
                       help="the hosts of a preset that takes them (workspace-write-net), "
                            "or of an imported Codex config (--from codex)")
        c.add_argument("--policy", action=_Once, metavar="FILE",
                       help="check under a TOML policy file (over --preset): each check's runs "
                            "start from it, its project's paths fitted to the checks' own "
                            "jails (the report lists what changed)")
        c.add_argument("--from", dest="policy_from", action=_Once, choices=("srt", "codex"),
                       help="--policy FILE is an srt settings.json or a Codex config.toml: "
                            "imported first, as 'hcp-linux policy import' does")
        c.add_argument("--executor", action=_Once, choices=("auto", "native", "ctypes"),
                       help=argparse.SUPPRESS)
    if only in (None, "run"):
        r = sub.add_parser("run", help="run one command confined",
                           usage="hcp-linux run [OPTIONS] -- BIN [ARG...]", epilog=RUN_EPILOG)
        for f in FIELDS:  # the Policy fields' options (hcp_linux.policy.policy_flags)
            _add_field(r, f)
            if f.name == "allow_bins":  # where --policy has always stood in the help
                r.add_argument("--policy", action=_Once, metavar="FILE",
                               help="TOML policy file (keys as in Policy)")
                r.add_argument("--preset", action=_Once, metavar="NAME",
                               help="a named policy under the configs, the file and the "
                                    "flags (hcp-linux policy list)")
                r.add_argument("--no-config", action="store_true",
                               help="read no config (/etc/hcp-linux/policy.toml, "
                                    "$XDG_CONFIG_HOME/hcp-linux/policy.toml); also "
                                    "HCP_LINUX_NO_CONFIG=1")
        r.add_argument("--receipt", action=_Once, metavar="FILE|-",
                       help="write the receipt as JSON ('-': stderr)")
        r.add_argument("--explain", action="store_true",
                       help="after the run, print one line per denial on stderr (what was "
                            "blocked, by which layer, and what to change)")
        r.add_argument("--pack", action=_Once, metavar="FILE",
                       help="HCP pack manifest: run via the driver")
        r.add_argument("--principal", action=_Once, metavar="NAME",
                       help="whose workspace (with --pack)")
        r.add_argument("--executor", action=_Once, choices=("auto", "native", "ctypes"),
                       help=argparse.SUPPRESS)
        r.add_argument("command", nargs=argparse.REMAINDER)
    if only in (None, "policy"):
        _add_policy_parser(sub)
    if only in (None, "gc"):
        g = sub.add_parser("gc", help="remove what runs that died left: ephemeral jails, "
                                      "staging in idle workspaces, temp files beside outputs")
        g.add_argument("--dry-run", action="store_true", help="list, remove nothing")
        g.add_argument("--tmp-dir", action=_Once, metavar="DIR",
                       help="where ephemeral jails live (default: the system temp dir)")
        g.add_argument("--state-dir", action=_Once, metavar="DIR",
                       help="where workspaces live (default: $XDG_STATE_HOME/hcp-linux)")
        g.add_argument("paths", nargs="*", metavar="PATH",
                       help="a directory that outputs were written back to: its temp files")
    if only in (None, "profile"):
        pf = sub.add_parser("profile", help="print a profile shipped with the package (the "
                                            "container runtime's seccomp profile, the AppArmor "
                                            "profile for hcp-exec), to copy it out of an image")
        pf.add_argument("kind", choices=("seccomp", "apparmor"),
                        help="seccomp: Docker's default profile plus the calls hcp-linux needs "
                             "(docker/podman --security-opt seccomp=FILE, a Kubernetes "
                             "Localhost profile); apparmor: the profile giving hcp-exec the "
                             "userns rule (Ubuntu 23.10+), its build directory filled in")
    if only in (None, "serve"):
        sv = sub.add_parser("serve", help="compile plans for `hcp-linux run` in a warm process "
                                          "(clients: HCP_LINUX_SERVER=SOCKET)")
        where = sv.add_mutually_exclusive_group(required=True)
        where.add_argument("--socket", action=_Once, metavar="PATH",
                           help="the unix socket to listen on (made mode 0600)")
        where.add_argument("--auto", action="store_true",
                           help="the user's own server, as HCP_LINUX_SERVER=auto starts it: "
                                "its socket in $XDG_RUNTIME_DIR/hcp-linux (else "
                                "$TMPDIR/hcp-linux-UID), exits after 300 s idle; quiet when "
                                "one is there already")
        sv.add_argument("--idle-exit", type=_positive_seconds, metavar="SECONDS",
                        help="exit after this long without a request (default: never; "
                             "--auto: 300)")
    return p


def _add_policy_parser(sub: Any) -> None:
    """`policy list|show|import` (run by hcp_linux.cli.policy_cmd)."""
    pol = sub.add_parser("policy", help="named presets, and policies imported from srt and "
                                        "Codex, as TOML for --policy")
    psub = pol.add_subparsers(dest="policy_cmd", required=True)
    psub.add_parser("list", help="the presets, one a line, with what each is")
    show = psub.add_parser("show", help="a preset as TOML (run --policy takes it)")
    show.add_argument("name", metavar="NAME")
    show.add_argument("--allow-host", action="append", default=[], metavar="HOST[:PORT]",
                      help="the hosts of workspace-write-net (repeatable)")
    imp = psub.add_parser("import", help="an srt settings.json or a Codex config.toml as a "
                                         "policy on stdout; what could not be carried over, "
                                         "and why, on stderr")
    imp.add_argument("--from", dest="source", required=True, choices=("srt", "codex"))
    imp.add_argument("file", metavar="FILE")
    imp.add_argument("--allow-host", action="append", default=[], metavar="HOST[:PORT]",
                     help="codex: where network_access = true may connect (repeatable)")


def policy_from_args(a: argparse.Namespace, *, configs: bool = True) -> Policy:
    """The policy of `run`'s flags (over a ``--policy`` file's, the configs' and a
    ``--preset``'s), validated (PolicyError). ``configs=False``: read none (the server)."""
    return policy_and_layers(a, configs=configs)[0]


def policy_and_layers(a: argparse.Namespace, *, configs: bool = True
                      ) -> tuple[Policy, list[str]]:
    """:func:`policy_from_args`, and the layers it composed (for the receipt's
    ``policy_layers``): empty when neither a preset nor a config was in play."""
    if a.jail is None:
        check_cwd(" (give --jail DIR)")
    if a.policy == "":
        raise PolicyError("--policy: empty path")
    policy_flags.check_args(a)
    found: list[tuple[str, str]] = []
    if configs:
        from . import config
        found = config.present(a.no_config)
    if a.preset is not None or found:  # the layers' code only then: a plain run pays nothing
        from .compose import composed_policy
        return composed_policy(a, found)
    return _file_and_flags(a), []


def _file_and_flags(a: argparse.Namespace) -> Policy:
    """The policy of the flags over a ``--policy`` file, with no other layer: the file is
    checked alone, as it always was, then the flags are applied."""
    base: dict = {}
    if a.policy:
        # a file without a jail takes --jail's, not the cwd's (which may not be a valid one);
        # a file's own jail is checked, then --jail replaces it
        fallback = {"jail": a.jail} if a.jail is not None else None
        from_file = resolve(Policy.from_toml(a.policy, fallback=fallback))
        # it would widen the next run: protected in this process's runs (hcp_linux.policy.protected)
        protected.protect_file(a.policy)
        base = {f.name: getattr(from_file, f.name) for f in dataclasses.fields(Policy)}
    return resolve(Policy(**policy_flags.merge(a, base)))


def _add_field(parser: argparse.ArgumentParser, f: policy_flags.Field) -> None:
    """A Policy field's option of `run`, as policy_flags describes it."""
    kwargs: dict[str, Any] = {"help": f.help, "metavar": f.metavar}
    if f.takes == policy_flags.SWITCH:
        kwargs = {"action": "store_true", "help": f.help}
    elif f.takes == policy_flags.APPEND:
        kwargs.update(action="append", default=[])
    else:
        kwargs.update(action=_Once, type=_typed(f.type) if f.type else None,
                      choices=f.choices)
    parser.add_argument(f.flag, **kwargs)


def _positive_seconds(text: str) -> float:
    """``serve --idle-exit``: a number of seconds, finite and above zero."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"invalid number of seconds {text!r}: give a "
                                         f"number above 0, like 300 or 0.5")
    return value


def _typed(convert: Any) -> Any:
    """A field's value parser for argparse: its ValueError's message is the usage error
    (argparse's own would be "invalid duration_text value: ...", naming no fix)."""
    def parse(text: str) -> Any:
        try:
            return convert(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return parse


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
    from ..run.receipt import check_output_path
    if a.receipt is not None and a.receipt != "-":
        check_output_path(a.receipt, "--receipt", hint="; '-' writes it to standard error")
    if a.proxy_log is not None:
        check_output_path(a.proxy_log, "--proxy-log", replace=False)
    if policy is not None and policy.proxy_log and policy.proxy_log != a.proxy_log:
        check_output_path(policy.proxy_log, "proxy_log", replace=False)
    if policy is not None and a.receipt not in (None, "-"):
        # the receipt is written by the runtime, outside the sandbox: never into a directory
        # a link left in a writable root by an earlier command names (docs/policy.md)
        from ..policy.values import unpinned_link
        found = unpinned_link(os.path.normpath(os.path.abspath(a.receipt)),
                              policy.writable_roots)
        if found is not None:
            raise PolicyError(f"--receipt {printable(a.receipt)}: passes through the symlink "
                              f"{printable(found[0])} inside writable root "
                              f"{printable(found[1])}, which a command can re-point; name "
                              f"a path with no symlink inside a writable root")


def command_of(a: argparse.Namespace) -> list[str]:
    """The command `run` was given (after ``--``); refused when there is none."""
    argv = list(a.command)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        raise SandboxError("run: no command given (hcp-linux run [OPTIONS] -- BIN [ARG...])")
    return argv

