"""How `hcp-linux run` ends, in-process or served: the receipt, the timeout's line, the
exit status."""
from __future__ import annotations

import os
import sys


def open_receipt_dir(receipt_to: "str | None") -> "int | None":
    """The directory the receipt goes to, opened before the command runs (None for no
    receipt, or "-"): the receipt is written there after the run, whatever the command did
    to the path meanwhile. A receipt inside the jail could otherwise be sent anywhere the
    user can write: the command renames its directory and leaves a symlink in its place, and
    the runtime, unconfined, writes through it. OSError, for the caller to refuse the run
    in one line before anything is spawned."""
    if not receipt_to or receipt_to == "-":
        return None
    return os.open(os.path.dirname(receipt_to) or ".",
                   os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)


def end_of_run(receipt: dict, receipt_to: "str | None", returncode: int, timed_out: bool,
               timeout: float | None, explain: bool = False,
               receipt_dir: "int | None" = None) -> int:
    """How `hcp-linux run` ends, served or not: the receipt with the run's exit (to
    ``receipt_to``: a path, in ``receipt_dir`` when it was opened before the run, or "-"
    for stderr), ``explain``: a line per denial (stderr), the timeout's line, the line of a
    run killed from outside or by its init (the receipt's ``end.by``), the exit status."""
    if receipt_to:
        from ..run.receipt import write_receipt
        from ..receipt_keys import set_exit
        set_exit(receipt, returncode, timed_out)
        try:
            write_receipt(receipt, sys.stderr if receipt_to == "-" else receipt_to,
                          receipt_dir)
        except OSError as e:  # checked before the run; this is a race with its removal
            from ..errors import EXIT_REFUSED, printable
            print(f"error: sandbox: receipt {printable(receipt_to)}: "
                  f"{e.strerror or e}", file=sys.stderr)
            return EXIT_REFUSED
    if explain:
        from ..observe.denials import explain_lines
        from ..errors import printable
        for line in explain_lines(receipt, returncode):
            print(printable(line), file=sys.stderr)
    from ..receipt_keys import END_LINES
    said = END_LINES.get(receipt.get("end", {}).get("by", ""))
    if said is not None:
        print(f"error: sandbox: {said}", file=sys.stderr)
    if timed_out:
        from ..errors import EXIT_TIMEOUT
        print(f"error: sandbox: timed out after {timeout:g}s; the sandbox was killed",
              file=sys.stderr)
        return EXIT_TIMEOUT
    return 128 - returncode if returncode < 0 else returncode
