"""HCP §10 conformance suite: which rules of §10 this driver upholds on this host, with evidence.

    python -m hcp_linux conformance [--json] [--junit FILE] [--rung RUNG]
                                    [--allow-degraded LAYER]...

or from Python::

    from hcp_linux.conformance import run_conformance, format_text
    report = run_conformance()
    print(format_text(report)); assert report.ok

One check per normative rule of HCP §10 (default mode, allow-list, cwd jail, credentials,
marker, env mocks, native-local, isolation as a runtime property, the workspace/exec plane),
plus hardening canaries. Each check does the thing for real and judges its effect on the host;
every denial has an unconfined negative control, and a control that does not behave makes the
check "not applicable", never "pass". docs/conformance.md lists the checks.
"""
from __future__ import annotations

import os
import platform
import sys
import time
import traceback
from typing import Any, Iterable, Mapping, Sequence

from ..policy import ladder
from ..errors import LayerUnavailableError
from .checks import CHECKS, Check
from .harness import (DEFAULT_TIMEOUT, FAIL, NOT_APPLICABLE, PASS, Evidence, Fail, Harness,
                      NotApplicable)
from .policy_base import PolicyBase
from .report import CheckResult, Report, format_text, to_json, to_junit, write_junit

__all__ = ["run_conformance", "run_check", "CHECKS", "CHECK_IDS", "Check", "CheckResult",
           "Report", "Harness", "Evidence", "format_text", "to_json", "to_junit", "write_junit",
           "PASS", "FAIL", "NOT_APPLICABLE"]

CHECK_IDS: tuple[str, ...] = tuple(c.id for c in CHECKS)

#: What the report says of a read-only jail (docs/conformance.md, "Under a read-only jail").
READ_ONLY_NOTE = ("the jail is read-only: the checks take their evidence out through a "
                  "separate write root of their own (outbox), and 10.2.2-cwd-jail checks that "
                  "a write in the jail is refused")


def run_check(h: Harness, c: Check) -> CheckResult:
    """Run one check in its own scratch directory; never raises for the check's outcome."""
    import subprocess

    ev = h.begin(c.id)
    t0 = time.monotonic()
    try:
        try:
            reason = c.fn(h, ev)
            status = PASS
        except Fail as e:
            status, reason = FAIL, str(e)
        except NotApplicable as e:
            status, reason = NOT_APPLICABLE, str(e)
        except LayerUnavailableError as e:
            status, reason = NOT_APPLICABLE, f"the sandbox refuses to run on this host: {e}"
        except subprocess.TimeoutExpired as e:
            status, reason = FAIL, f"timed out after {e.timeout:g}s: {e.cmd!r}"[:500]
        except Exception as e:  # noqa: BLE001 - a crash of the engine is a finding
            status, reason = FAIL, f"check crashed: {type(e).__name__}: {e}"
            ev.note("traceback: " + traceback.format_exc().replace("\n", " | ")[-1500:])
    finally:
        h.end()
    if status == PASS and (ev.problems or ev.control_failures):  # pragma: no cover
        status, reason = FAIL, "; ".join(ev.problems + ev.control_failures)
    return CheckResult(c.id, c.rule, c.title, status, reason, c.requirement, c.enforced_by,
                       ev.as_dict(), round(time.monotonic() - t0, 3))


def _host_facts() -> dict:
    import pwd

    from .._version import __version__
    from ..probe import probe
    try:
        user = pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        user = str(os.geteuid())
    out = {"version": __version__, "kernel": platform.release(), "arch": platform.machine(),
           "euid": os.geteuid(), "user": user, "python": sys.version.split()[0]}
    try:
        rep = probe()
    except Exception as e:  # noqa: BLE001 - the checks still say what holds
        out.update(layers={}, probe_error=f"{type(e).__name__}: {e}")
        return out
    out.update(landlock_abi=rep.facts.get("landlock_abi"),
               layers={k: v.available for k, v in rep.layers.items()},
               layer_details={k: v.detail for k, v in rep.layers.items()})
    return out


def run_conformance(allow_degraded: Iterable[str] = (), *, only: Sequence[str] | None = None,
                    timeout: float = DEFAULT_TIMEOUT, base_dir: str | None = None,
                    rung: str = ladder.DEFAULT,
                    preset: tuple[str, Mapping[str, Any]] | None = None,
                    policy_file: PolicyBase | None = None,
                    executor: str | None = None) -> Report:
    """Run the checks (all, or the ids in ``only``) under the configuration that lets
    ``allow_degraded`` layers, and those of the fallback ladder's ``rung``, degrade. The
    report's configuration names the rung the runs reached (hcp_linux.policy.ladder), so a pass is
    read against what that rung keeps. ``preset``: (name, table), the policy every check's
    runs start from (hcp_linux.policy.presets; a check's own fields go over it).
    ``policy_file``: a user's policy file fitted to the checks' jails (.policy_base.load),
    over the preset. ``executor``: the one every run uses (None: the process default).
    Raises PolicyError for an unknown layer, rung or check id, or a preset and file that
    make no valid policy (before any check runs)."""
    from ..errors import PolicyError

    if rung not in ladder.BY_NAME:
        raise PolicyError(f"conformance: unknown rung {rung!r} (known: "
                          f"{', '.join(ladder.NAMES)})")
    allow_degraded = tuple(allow_degraded) + tuple(sorted(ladder.BY_NAME[rung].loses))

    selected = list(CHECKS)
    if only:
        unknown = [i for i in only if i not in CHECK_IDS]
        if unknown:
            raise PolicyError(f"conformance: unknown check id(s) {', '.join(unknown)} "
                              f"(known: {', '.join(CHECK_IDS)})")
        selected = [c for c in CHECKS if c.id in only]
    t0 = time.monotonic()
    with Harness(allow_degraded, timeout=timeout, base_dir=base_dir, preset=preset,
                 policy_file=policy_file, executor=executor) as h:
        if preset is not None or policy_file is not None:
            try:  # one line now, not the same refusal in every check
                h.policy(jail=str(h.base))
            except PolicyError as e:
                what = ([f"preset {preset[0]}"] if preset else []) + (
                    [f"policy file {policy_file.path}"] if policy_file else [])
                raise PolicyError(f"conformance: {' with '.join(what)}: {e}") from None
        host = _host_facts()
        results = [run_check(h, c) for c in selected]
        config = {"allow_degraded": list(h.allow_degraded), "timeout": timeout,
                  "degraded_in_runs": dict(h.degraded_seen), "interpreter": h.python,
                  "rung": _rung_verdict(rung, h.degraded_seen)}
        if preset is not None:
            config["preset"] = {"name": preset[0], "table": dict(preset[1])}
        if policy_file is not None:
            config["policy"] = policy_file.as_dict()
        if h.read_only_jail:
            config["read_only_jail"] = READ_ONLY_NOTE
    return Report(results, host, config, round(time.monotonic() - t0, 3))


def _rung_verdict(allowed: str, degraded: Iterable[str]) -> dict[str, str]:
    """The rung the checks' runs stood on, and what it keeps and loses."""
    rung = ladder.reached(degraded)
    if rung is None:
        return {"allowed": allowed, "reached": "below-ladder",
                "loses": "layers beyond every rung: " + ", ".join(sorted(degraded))}
    return {"allowed": allowed, "reached": rung.name, "keeps": rung.keeps_text,
            "loses": rung.loses_text}


def main(allow_degraded: Sequence[str] = (), *, json_out: bool = False,
         junit: str | None = None, rung: str = ladder.DEFAULT,
         preset: tuple[str, Mapping[str, Any]] | None = None,
         policy_file: PolicyBase | None = None, executor: str | None = None) -> int:
    """The CLI's `conformance` subcommand: print the report, write JUnit, exit 1 on a
    failure."""
    report = run_conformance(allow_degraded, rung=rung, preset=preset,
                             policy_file=policy_file, executor=executor)
    if junit:
        write_junit(report, junit)
    print(to_json(report) if json_out else format_text(report))
    return 0 if report.ok else 1

