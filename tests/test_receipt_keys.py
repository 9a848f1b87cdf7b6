"""One writer per receipt key: after build_receipt made it, only hcp_linux.receipt_keys
writes a run's receipt (issue 30). The package's source is read, not run: a write to a
receipt (``receipt[...] = ...``, ``rec[...] = ...``, ``x.receipt[...] = ...``, their
``setdefault``/``update``/``pop``) anywhere else fails this test, naming the line."""
from __future__ import annotations

import ast
from pathlib import Path

import hcp_linux
from hcp_linux import receipt_keys

PACKAGE = Path(hcp_linux.__file__).resolve().parent
#: Where a receipt may be written: its maker (from the plan) and the owner of later keys.
OWNERS = {"run/receipt.py", "receipt_keys.py"}
_NAMES = {"receipt", "rec"}
_MUTATORS = {"setdefault", "update", "pop", "clear", "__setitem__"}


def _is_receipt(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return node.id in _NAMES
    return isinstance(node, ast.Attribute) and node.attr == "receipt"


def _writes(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        targets: list[ast.AST] = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        for t in targets:
            if isinstance(t, ast.Subscript) and _is_receipt(t.value):
                lines.append(t.lineno)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in _MUTATORS and _is_receipt(node.func.value):
            lines.append(node.lineno)
    return lines


def test_only_the_owner_writes_a_receipt() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in OWNERS:
            continue
        for line in _writes(ast.parse(path.read_text(), str(path))):
            found.append(f"{rel}:{line}")
    assert found == [], "receipt written outside hcp_linux/receipt_keys.py: " + ", ".join(found)


def test_the_scan_finds_a_write() -> None:
    """The scan itself can fail: each shape of write is found."""
    for src in ('receipt["exit"] = 1', 'rec["end"] = {}', 'self.receipt["x"] = 1',
                'receipt.setdefault("spawn", {})', 'proc.receipt.update(a=1)',
                'del receipt["x"]'):
        assert _writes(ast.parse(src)) == [1], src
    assert _writes(ast.parse('x = receipt["exit"]')) == []


def test_each_writer_sets_what_it_says() -> None:
    r: dict = {}
    receipt_keys.set_exit(r, 3, True, "SIGTERM")
    receipt_keys.set_end(r, "timeout", ["n"])
    receipt_keys.set_protected_sweep(r, {})
    receipt_keys.add_spawn_note(r, "a")
    receipt_keys.add_spawn_note(r, "b")
    receipt_keys.set_denial_layers(r, {"seccomp": "recorded"})
    receipt_keys.set_denial_layer(r, "landlock", "unavailable")
    decisions = receipt_keys.set_egress(r, {"proxy": "p"})
    decisions.append({"d": 1})
    assert r == {"exit": {"returncode": 3, "timed_out": True, "ended_by": "SIGTERM"},
                 "end": {"by": "timeout", "notes": ["n"]}, "spawn": {"notes": ["a", "b"]},
                 "denial_layers": {"seccomp": "recorded", "landlock": "unavailable"},
                 "network": {"mode": "allow", "decisions": [{"d": 1}], "proxy": "p"}}


def test_an_end_that_needs_saying_is_said_once_whoever_ends_the_run() -> None:
    """set_end adds what a lost or view-lost end means after the teardown's notes; an end
    by exit, kill or timeout gets no such note (the receipt's one place for that rule)."""
    for by in ("exit", "kill", "timeout"):
        r: dict = {}
        receipt_keys.set_end(r, by)
        assert r == {"end": {"by": by}}
    for by, note in receipt_keys.END_NOTES.items():
        r = {}
        receipt_keys.set_end(r, by, ["teardown"])
        assert r == {"end": {"by": by, "notes": ["teardown", note]}}
    assert set(receipt_keys.END_NOTES) == set(receipt_keys.END_LINES)


def test_the_inits_report_reads_the_same_for_every_reader() -> None:
    """hcp_linux.protocol.init_report: four bytes are a wait status, VIEW_LOST cleared and
    said; anything shorter (the init died before writing) is no status, "lost"."""
    import struct

    from hcp_linux.protocol import VIEW_LOST, init_report
    exited_3, killed_9 = 3 << 8, 9
    assert init_report(struct.pack("<i", exited_3)) == (exited_3, "exit")
    assert init_report(struct.pack("<i", killed_9 | VIEW_LOST)) == (killed_9, "view-lost")
    for short in (b"", b"\x00", b"\x00\x00\x00"):
        assert init_report(short) == (None, "lost")
