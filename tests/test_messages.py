"""Realistic mistakes, each told in one line that names the fix (issue 32).

A held-out-style list: what a newcomer types wrong (a URL for a host, a JSON policy file, a
misspelt flag, key, layer or limit, a duration with a unit, a relative path, a feature this
version does not apply...). For each, the real CLI (``python -m hcp_linux``) must print
exactly one line on stderr, ``error: sandbox: ...``, exit with the status of the README's
table (2 usage, 125 refused, 127 not allow-listed or not found), run nothing, and name the
fix: the fragments of each case are what the user needs to read (the nearest flag, the host
to write, the unit syntax, the flag that goes with this one...).

Two refusals cannot say more than they do: `bin "<bin>" not allowlisted` is HCP §10.2.1's
exact text (a bare name never matches a path entry: docs/policy.md says so, and `run --help`
under ``--allow-bin``).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hcp_linux import Policy, Sandbox
from sandboxing import TIMEOUT, show

PREFIX = "error: sandbox: "
USAGE, REFUSED, NOT_FOUND = 2, 125, 127
#: The command of every `run` case: it must never run (the file `ran` stays absent).
MARKER_CMD = ["--", "sh", "-c", "echo ran > ran"]

#: id -> (argv after `hcp-linux` ({d}: the scratch directory), whether MARKER_CMD is added,
#: the exit status, fragments the line must contain: the fix).
CASES: dict[str, tuple[list[str], bool, int, list[str]]] = {
    # --timeout: the duration syntax of Policy and docs/policy.md
    "timeout-word": (["run", "--timeout", "soon"], True, USAGE, ["like 30s, 1.5m"]),
    "timeout-negative": (["run", "--timeout", "-5"], True, REFUSED, ["> 0", "'30s'"]),
    "timeout-zero": (["run", "--timeout", "0"], True, REFUSED, ["> 0"]),
    "timeout-twice": (["run", "--timeout", "5", "--timeout", "6"], True, USAGE,
                      ["--timeout: given more than once"]),
    # egress patterns
    "allow-host-url": (["run", "--network", "allow", "--allow-host", "http://example.com"],
                       True, REFUSED, ["give a host, not a URL: 'example.com'"]),
    "allow-host-url-port": (["run", "--network", "allow", "--allow-host",
                             "https://example.com:8443/x"], True, REFUSED,
                            ["not a URL: 'example.com:8443'"]),
    "allow-host-port-range": (["run", "--network", "allow", "--allow-host",
                               "example.com:99999"], True, REFUSED, ["1..65535"]),
    "allow-host-star": (["run", "--network", "allow", "--allow-host", "*"], True, REFUSED,
                        ["*.example.com", "list the hosts"]),
    "allow-host-without-allow": (["run", "--allow-host", "example.com"], True, REFUSED,
                                 ["(--network allow)"]),
    "deny-host-with-host": (["run", "--network", "host", "--deny-host", "example.com"], True,
                            REFUSED, ["(--network allow)"]),
    "allow-without-hosts": (["run", "--network", "allow"], True, REFUSED,
                            ["--allow-host HOST[:PORT]"]),
    "network-typo": (["run", "--network", "alow"], True, REFUSED, ["did you mean 'allow'?"]),
    # limits
    "limit-memory": (["run", "--limit", "memory=1g"], True, REFUSED,
                     ["not supported in this version", "as, nproc, fsize"]),
    "limit-typo": (["run", "--limit", "mem=1g"], True, REFUSED, ["did you mean 'memory'?"]),
    "limit-word": (["run", "--limit", "nproc=lots"], True, REFUSED,
                   ["a whole number", "'unlimited'"]),
    "limit-no-equals": (["run", "--limit", "nproc"], True, REFUSED, ["expected KEY=VALUE"]),
    "limit-negative": (["run", "--limit", "as=-1"], True, REFUSED, ["like '512m'"]),
    # flags and choices: the nearest one
    "flag-typo": (["run", "--netwrok", "none"], True, USAGE, ["did you mean --network?"]),
    "flag-transposed": (["run", "--jial", "."], True, USAGE, ["did you mean --jail?"]),
    "flag-plural": (["run", "--allow-hosts", "example.com"], True, USAGE,
                    ["did you mean --allow-host?"]),
    "flag-plural-root": (["run", "--write-roots", "/tmp"], True, USAGE,
                         ["did you mean --write-root?"]),
    "rung-typo": (["run", "--rung", "no-user"], True, USAGE, ["did you mean no-userns?"]),
    "on-exit-typo": (["run", "--on-exit", "wiat"], True, USAGE, ["did you mean wait?"]),
    "subcommand-typo": (["rn"], False, USAGE, ["did you mean run?"]),
    "probe-flag-typo": (["probe", "--jsn"], False, USAGE, ["did you mean --json?"]),
    "conformance-rung-typo": (["conformance", "--rung", "no-landlok"], False, USAGE,
                              ["did you mean no-landlock?"]),
    "serve-without-socket": (["serve"], False, USAGE, ["--socket"]),
    # policy files
    "policy-json": (["run", "--policy", "p.json"], True, REFUSED,
                    ["must be TOML", "key = value"]),
    "policy-key-singular": (["run", "--policy", "singular.toml"], True, REFUSED,
                            ["did you mean 'allow_hosts'?"]),
    "policy-key-typo": (["run", "--policy", "typo.toml"], True, REFUSED,
                        ["did you mean 'timeout'?"]),
    "policy-key-camel": (["run", "--policy", "camel.toml"], True, REFUSED,
                         ["did you mean 'allow_bins'?"]),
    "policy-missing": (["run", "--policy", "missing.toml"], True, REFUSED,
                       ["missing.toml: No such file"]),
    # layers, profiles, protected names
    "layer-typo": (["run", "--allow-degraded", "landlok"], True, REFUSED,
                   ["did you mean 'landlock'?"]),
    "seccomp-profile-unknown": (["run", "--seccomp-profile", "nosuch"], True, REFUSED,
                                ["available: baseline"]),
    "protected-typo": (["run", "--allow-write-protected", ".git/hookz"], True, REFUSED,
                       ["known: .git/hooks", "or an absolute path"]),
    "native-local-alone": (["run", "--native-local"], True, REFUSED,
                           ["--no-sandbox --native-local"]),
    # --env
    "env-no-equals": (["run", "--env", "FOO"], True, REFUSED, ["expected KEY=VALUE"]),
    "env-bad-name": (["run", "--env", "A B=1"], True, REFUSED,
                     ["letters, digits and _"]),
    "env-injection": (["run", "--env", "LD_PRELOAD=/x.so"], True, REFUSED,
                      ['"LD_PRELOAD" not allowed (injects code)']),
    # paths
    "jail-relative": (["run", "--jail", "jail"], True, REFUSED,
                      ["is not an absolute path", "$PWD/"]),
    "jail-a-file": (["run", "--jail", "{d}/p.json"], True, REFUSED,
                    ["is not an existing directory"]),
    "write-root-relative": (["run", "--write-root", "out"], True, REFUSED,
                            ["is not an absolute path"]),
    "system-root-relative": (["run", "--system-root", "usr"], True, REFUSED,
                             ["is not an absolute path"]),
    "receipt-in-a-missing-dir": (["run", "--receipt", "{d}/nope/r.json"], True, REFUSED,
                                 ["directory {d}/nope: No such file"]),
    "proxy-log-in-a-missing-dir": (["run", "--network", "allow", "--allow-host", "example.com",
                                    "--proxy-log", "{d}/nope/x.log"], True, REFUSED,
                                   ["directory {d}/nope: No such file"]),
    "hide-path-missing": (["run", "--hide-path", "{d}/nope"], True, REFUSED,
                          ["create it first"]),
    "read-only-path-missing": (["run", "--read-only-path", "{d}/nope"], True, REFUSED,
                               ["create it first"]),
    "socket-missing": (["run", "--allow-unix-socket", "{d}/nope.sock"], True, REFUSED,
                       ["start it first"]),
    "gc-missing-dir": (["gc", "{d}/nope"], False, REFUSED, ["{d}/nope: No such file"]),
    "pack-missing": (["run", "--pack", "{d}/nope/pack.toml"], True, REFUSED,
                     ["does not exist"]),
    # the command itself
    "no-command": (["run"], False, REFUSED, ["-- BIN [ARG...]"]),
    "command-not-found": (["run", "--", "no-such-binary-hcp"], False, NOT_FOUND,
                          ["not found on the sandbox PATH"]),
    "not-allowlisted": (["run", "--allow-bin", "ls", "--", "cat"], False, NOT_FOUND,
                        ['bin "cat" not allowlisted']),  # HCP §10.2.1's exact text
    "path-entry-bare-command": (["run", "--allow-bin", "/usr/bin/sh", "--", "sh", "-c",
                                 "echo ran > ran"], False, NOT_FOUND,
                                ['bin "sh" not allowlisted']),  # the same exact text
}


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("messages")
    (d / "p.json").write_text('{"allow_bins": ["sh"], "timeout": 30}\n')
    (d / "singular.toml").write_text('allow_host = ["example.com"]\n')
    (d / "typo.toml").write_text("timout = 5\n")
    (d / "camel.toml").write_text('allowBins = ["sh"]\n')
    return d


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    # not from the jail: `python -m` puts the cwd on sys.path (the refusals need no jail)
    return subprocess.run([sys.executable, "-m", "hcp_linux", *args], capture_output=True,
                          timeout=TIMEOUT, stdin=subprocess.DEVNULL, cwd=cwd,
                          env={**os.environ, "COLUMNS": "200"})


def test_at_least_forty_mistakes() -> None:
    assert len(CASES) >= 40, len(CASES)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_mistake_is_one_line_with_the_status_and_the_fix(scratch: Path, case: str) -> None:
    args, add_marker, status, fixes = CASES[case]
    argv = [a.replace("{d}", str(scratch)) for a in args] + (MARKER_CMD if add_marker else [])
    p = _cli(argv, scratch)
    text = p.stderr.decode(errors="replace")
    assert p.returncode == status, show(p)
    assert text.endswith("\n") and text.count("\n") == 1, f"not one line:\n{show(p)}"
    assert text.startswith(PREFIX), show(p)
    assert "Traceback" not in text and p.stdout == b"", show(p)
    for fix in fixes:
        assert fix.replace("{d}", str(scratch)) in text, show(p)
    assert not (scratch / "ran").exists(), "the command ran"


# --- what the mistakes above are mistakes against: the right spelling works -----------------

@pytest.mark.parametrize("timeout", ["30s", "1.5m", "500ms", "30"])
def test_timeout_takes_the_durations_the_docs_show(scratch: Path, timeout: str) -> None:
    jail = scratch / f"jail-{timeout}"
    jail.mkdir()
    p = _cli(["run", "--jail", str(jail), "--timeout", timeout, "--", "sh", "-c",
              "echo ran > ran"], scratch)
    assert p.returncode == 0, show(p)
    assert (jail / "ran").read_text() == "ran\n"


def test_sandbox_given_a_path_says_to_pass_a_policy(scratch: Path) -> None:
    with pytest.raises(TypeError, match=r"Sandbox\(Policy\(jail='/srv/agent/jail'\)\)"):
        Sandbox("/srv/agent/jail")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="takes a Policy, not dict"):
        Sandbox({"jail": "/srv"})  # type: ignore[arg-type]
    assert isinstance(Sandbox(Policy(jail=str(scratch))).policy, Policy)  # control


def test_run_help_has_help_for_every_option_and_the_exit_statuses(scratch: Path) -> None:
    p = _cli(["run", "--help"], scratch)
    assert p.returncode == 0, show(p)
    text = p.stdout.decode()
    import argparse
    from hcp_linux.cli.cli_args import build_parser
    parser = build_parser()
    run = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)) \
        .choices["run"]
    for action in run._actions:
        if action.option_strings and action.help != argparse.SUPPRESS:
            assert action.help, f"{action.option_strings} has no help"
            assert action.option_strings[-1] in text
    for status in ("124", "125", "126", "127", "128+N", "death by N"):
        assert status in text, text
