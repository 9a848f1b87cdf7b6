"""The conformance report: a readable table, JSON, and JUnit XML (one testcase per check;
failures carry the evidence, not-applicable checks are skipped with their reason)."""
from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from typing import Any

from .harness import FAIL, NOT_APPLICABLE, PASS


@dataclass
class CheckResult:
    id: str
    rule: str
    title: str
    status: str               # pass | fail | not-applicable
    reason: str               # one line: the summary (pass), the violation or why not judged
    requirement: str
    enforced_by: str
    evidence: dict[str, list[str]] = field(default_factory=dict)
    duration: float = 0.0


@dataclass
class Report:
    results: list[CheckResult]
    host: dict[str, Any]
    config: dict[str, Any]
    duration: float = 0.0

    @property
    def counts(self) -> dict[str, int]:
        out = {PASS: 0, FAIL: 0, NOT_APPLICABLE: 0}
        for r in self.results:
            out[r.status] += 1
        return out

    @property
    def ok(self) -> bool:
        return self.counts[FAIL] == 0

    def ids(self, status: str) -> list[str]:
        return [r.id for r in self.results if r.status == status]

    def as_dict(self) -> dict[str, Any]:
        return {"conformant": self.ok, "summary": {**self.counts, "total": len(self.results)},
                "host": self.host, "config": self.config, "duration": round(self.duration, 3),
                "checks": [asdict(r) for r in self.results]}


_MARK = {PASS: "pass", FAIL: "FAIL", NOT_APPLICABLE: "n/a"}


def _evidence_lines(r: CheckResult, indent: str = "    ") -> list[str]:
    lines = []
    for key, label in (("tried", "tried"), ("observed", "observed"), ("control", "control"),
                       ("notes", "note")):
        for item in r.evidence.get(key, []):
            lines.append(f"{indent}{label + ':':<10}{item}")
    return lines


def _rung_line(rung: Any) -> list[str]:
    """The fallback-ladder rung the runs reached, and what the passes below do not cover."""
    if not rung:
        return []
    return [f"rung: {rung['reached']} (weakest allowed: {rung['allowed']}); lost: "
            f"{rung['loses']}"]


def _base_lines(cfg: dict[str, Any]) -> list[str]:
    """The preset and policy file every check's runs started from, and what of the file
    could not apply to the checks' own jails."""
    out = []
    if cfg.get("preset"):
        out.append(f"preset: {cfg['preset']['name']}")
    if cfg.get("policy"):
        pol = cfg["policy"]
        out.append(f"policy file: {pol['file']} (its project: {pol['project']})")
        out.extend(f"  {line}" for line in pol.get("changes", ()))
    if cfg.get("read_only_jail"):
        out.append(f"read-only jail: {cfg['read_only_jail']}")
    return out


def format_text(report: Report) -> str:
    h, cfg = report.host, report.config
    out = [f"HCP §10 conformance of hcp-linux {h.get('version')} on Linux {h.get('kernel')} "
           f"{h.get('arch')}, euid {h.get('euid')} ({h.get('user')})",
           "layers (probe): " + ", ".join(f"{k} {'ok' if v else 'MISSING'}"
                                          for k, v in h.get("layers", {}).items()),
           "configuration: " + (("layers allowed to degrade: "
                                 + ", ".join(cfg["allow_degraded"]))
                                if cfg.get("allow_degraded") else
                                "strict (no layer may degrade)"),
           *_rung_line(cfg.get("rung")),
           *_base_lines(cfg),
           ""]
    rows = [("CHECK", "RULE", "RESULT", "WHAT HAPPENED")]
    for r in report.results:
        rows.append((r.id, r.rule, _MARK[r.status], r.reason))
    w0 = max(len(x[0]) for x in rows)
    w1 = max(len(x[1]) for x in rows)
    w2 = max(len(x[2]) for x in rows)
    width = 160
    for a, b, c, d in rows:
        line = f"{a:<{w0}}  {b:<{w1}}  {c:<{w2}}  {d}"
        if len(line) > width:
            line = line[:width - 1] + "…"
        out.append(line)
    details = [r for r in report.results if r.status != PASS]
    if details:
        out.append("")
        out.append("Evidence (failures and checks that could not be judged):")
        for r in details:
            out.append(f"  {r.id} [{_MARK[r.status]}] {r.title}")
            out.append(f"    {'why:':<10}{r.reason}")
            out.append(f"    {'rule:':<10}{r.requirement}")
            out.append(f"    {'enforced:':<10}{r.enforced_by}")
            out.extend(_evidence_lines(r))
    n = report.counts
    out.append("")
    out.append(f"{len(report.results)} checks: {n[PASS]} pass, {n[FAIL]} fail, "
               f"{n[NOT_APPLICABLE]} not applicable ({report.duration:.1f}s) — "
               + ("CONFORMANT on this host" if report.ok else "NOT CONFORMANT: "
                  + ", ".join(report.ids(FAIL))))
    if report.ok and n[NOT_APPLICABLE]:
        out.append("(not applicable: " + ", ".join(report.ids(NOT_APPLICABLE)) + ")")
    out.append("full evidence: --json")
    return "\n".join(out)


def to_json(report: Report) -> str:
    return json.dumps(report.as_dict(), indent=2, sort_keys=False)


def to_junit(report: Report) -> bytes:
    c = report.counts
    suites = ET.Element("testsuites", name="hcp-linux conformance",
                        tests=str(len(report.results)), failures=str(c[FAIL]),
                        skipped=str(c[NOT_APPLICABLE]), errors="0",
                        time=f"{report.duration:.3f}")
    suite = ET.SubElement(suites, "testsuite", name="hcp-linux.conformance",
                          tests=str(len(report.results)), failures=str(c[FAIL]),
                          skipped=str(c[NOT_APPLICABLE]), errors="0",
                          time=f"{report.duration:.3f}")
    props = ET.SubElement(suite, "properties")
    flat = {**{f"host.{k}": v for k, v in report.host.items()},
            **{f"config.{k}": v for k, v in report.config.items()}}
    for k, v in flat.items():
        ET.SubElement(props, "property", name=k,
                      value=v if isinstance(v, str) else json.dumps(v, sort_keys=True))
    for r in report.results:
        case = ET.SubElement(suite, "testcase", classname=f"hcp_linux.conformance.{r.rule}",
                             name=r.id, time=f"{r.duration:.3f}")
        body = "\n".join([f"{r.title}", f"rule: {r.requirement}",
                          f"enforced by: {r.enforced_by}"] + _evidence_lines(r, ""))
        if r.status == FAIL:
            el = ET.SubElement(case, "failure", message=r.reason, type="ConformanceFailure")
            el.text = body
        elif r.status == NOT_APPLICABLE:
            el = ET.SubElement(case, "skipped", message=r.reason)
            el.text = body
        out = ET.SubElement(case, "system-out")
        out.text = body if r.status == PASS else f"{r.reason}"
    ET.indent(suites)
    return ET.tostring(suites, encoding="utf-8", xml_declaration=True) + b"\n"


def write_junit(report: Report, path: str | os.PathLike[str]) -> None:
    data = to_junit(report)
    path = os.fspath(path)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


__all__ = ["CheckResult", "Report", "format_text", "to_json", "to_junit", "write_junit"]
