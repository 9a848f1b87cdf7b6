"""How `hcp-linux run` ends, in-process or served: the receipt, the timeout's line, the
exit status."""
from __future__ import annotations

import sys


def end_of_run(receipt: dict, receipt_to: "str | None", returncode: int, timed_out: bool,
               timeout: float | None, explain: bool = False) -> int:
    """How `hcp-linux run` ends, served or not: the receipt with the run's exit (to
    ``receipt_to``: a path, or "-" for stderr), ``explain``: a line per denial (stderr),
    the timeout's line, the exit status."""
    if receipt_to:
        from ..run.receipt import write_receipt
        from ..receipt_keys import set_exit
        set_exit(receipt, returncode, timed_out)
        try:
            write_receipt(receipt, sys.stderr if receipt_to == "-" else receipt_to)
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
    if timed_out:
        from ..errors import EXIT_TIMEOUT
        print(f"error: sandbox: timed out after {timeout:g}s; the sandbox was killed",
              file=sys.stderr)
        return EXIT_TIMEOUT
    return 128 - returncode if returncode < 0 else returncode
