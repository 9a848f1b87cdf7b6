"""What a driver run hands back: its :class:`DriverResult` and :class:`WritebackReport`."""
from __future__ import annotations

import subprocess
from dataclasses import dataclass
from typing import Any

__all__ = ["DriverResult", "WritebackReport"]


@dataclass(frozen=True)
class WritebackReport:
    """What :meth:`LinuxDriver.writeback` did.

    ``written``: host destinations of ``--output``/``-o`` replaced atomically.
    ``missing``: outputs the tool did not produce (their destinations are untouched).
    ``skipped``: why nothing was written back (``"exit status 1"``, ``"timed out"``...), or None.
    ``new_files`` / ``modified_files``: workspace mode only, jail-relative paths the run created
    or changed; they persist in place (the workspace *is* the local land). ``None`` when not
    workspace mode or when the workspace was too large to list.
    ``failed`` / ``error``: set only on the report a :class:`WritebackError` carries (its
    ``report``): which destination failed and why; then ``written`` is empty.
    """

    written: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    skipped: str | None = None
    new_files: tuple[str, ...] | None = None
    modified_files: tuple[str, ...] | None = None
    failed: str | None = None  # the destination whose failure stopped the writeback
    error: str | None = None  # why (the WritebackError's cause); nothing was written

    def as_receipt(self) -> dict[str, Any]:
        """The receipt's ``driver.writeback`` entry."""
        if self.error is not None:
            return {"status": "failed", "path": self.failed, "error": self.error,
                    "written": []}
        if self.skipped is not None:
            return {"status": "skipped", "reason": self.skipped, "written": []}
        return {"status": "written", "written": list(self.written),
                "missing": list(self.missing)}


@dataclass
class DriverResult:
    """The result of :meth:`LinuxDriver.run`, shaped like ``subprocess.CompletedProcess``."""

    args: list[str]
    returncode: int
    stdout: bytes | None
    stderr: bytes | None
    receipt: dict[str, Any]
    timed_out: bool
    writeback: WritebackReport
    jail: str
    mode: str
    truncated: frozenset[str] = frozenset()  # captured streams cut at policy.limits.output

    def check_returncode(self) -> None:
        if self.returncode:
            raise subprocess.CalledProcessError(self.returncode, self.args, self.stdout,
                                                self.stderr)
