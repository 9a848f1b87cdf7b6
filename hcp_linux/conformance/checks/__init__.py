"""One check per normative rule of HCP §10, plus hardening canaries.

The rules are those of https://harnesscontextprotocol.io/docs/specification/sandbox, quoted
in each check's ``requirement``.

Every check does the thing for real through the public surfaces (the Python API, the
``hcp-linux`` CLI, the HCP driver) and judges what happened on the host: files on disk, bytes
on the wire, processes in the process table, exact exit statuses and messages. Every denial
has a negative control: the same action, unconfined, must succeed; when it does not, the
check cannot be judged here and is "not applicable", never "pass". A violation observed in
the sandbox fails the check whatever the control did: it is proven.

Each check returns a one-line summary (pass) or raises :class:`Fail` /
:class:`NotApplicable`; its :class:`Evidence` records what was tried, what happened and what
the control did.
"""
from __future__ import annotations

# Importing a section registers its checks: this order is the order of CHECKS, of the report
# and of the check ids.
from . import default, requirements, native_local, isolation, exec_plane, hardening  # noqa: F401
from .base import CHECKS, Check, check

__all__ = ["CHECKS", "Check", "check"]
