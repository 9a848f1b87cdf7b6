"""§10.3 Native-local: its marker set, and the other rules still kept.
"""
from __future__ import annotations

import os

from ...errors import HostPathError, NotAllowlistedError
from ..harness import Evidence, Harness
from .base import _env_lines, _exact_refusal, _ran, _stdout, _token, _verdict, check


@check("10.3-native-local", "§10.3", "native-local sets its marker and keeps the other rules",
       requirement="The runtime MUST set HCP_SANDBOX=native-local. All other requirements "
                   "(allow-list, credentials, file references) apply unchanged.",
       enforced_by="allow-list, environment builder, file-reference scan (no layer)")
def native_local(h: Harness, ev: Evidence) -> str:
    secret = _token()
    jail, shared = h.mkdir("jail"), h.mkdir("shared")
    env = dict(os.environ, GITHUB_TOKEN=secret, HCP_CONFORMANCE_AMBIENT=secret)
    nl = ["--no-sandbox", "--native-local"]
    # a read-only jail: native-local's HOME and TMPDIR need a write root (the outbox)
    box_flags = h.outbox(jail)[1]
    c = h.cli(["run", "--jail", jail, *box_flags, *nl, "--", "sh", "-c",
               'echo "$HCP_SANDBOX"; env'], env=env)
    if _ran(ev, "CLI native-local", c):
        ev.require(_stdout(c).splitlines()[:1] == ["native-local"],
                   f"child saw HCP_SANDBOX={_stdout(c).splitlines()[:1]}")
        ev.require(secret not in _stdout(c), "native-local: a caller secret reached the child")
        ev.require(_env_lines(_stdout(c)).get("HCP_SANDBOX") == ["native-local"],
                   "native-local: HCP_SANDBOX is not exactly native-local")
    marker = shared / "ran"
    c = h.cli(["run", "--jail", jail, *nl, "--allow-bin", "sh", "--", "touch", marker])
    _exact_refusal(ev, "CLI native-local, unlisted bin", c, 127, 'bin "touch" not allowlisted')
    ev.require(not marker.exists(), "native-local: the unlisted bin ran")
    d = h.driver(sandbox=False, native_local=True)
    manifest = h.pack("pack", ["sh"], mode="ephemeral")
    r = h.drive(d, manifest, ["sh", "-c", 'echo "$HCP_SANDBOX"'])
    if _ran(ev, "driver native-local", r):
        ev.require(_stdout(r) == "native-local\n", f"driver: child saw {_stdout(r)!r}")
    for argv, err in ((["sh", "-c", f"touch {marker}", "sh", "/etc/passwd"], HostPathError),
                      (["touch", str(marker)], NotAllowlistedError)):
        try:
            h.drive(d, manifest, argv)
            ev.require(False, f"driver native-local: {argv} was spawned")
        except err as e:
            ev.saw(f"driver native-local, {argv[-1]}: {type(e).__name__}: {e}")
    ev.require(not marker.exists(), "native-local driver: a refused command ran")
    c = h.cli(["run", "--pack", manifest, *nl, "--", "sh", "-c", f"touch {marker}", "sh",
               "/root/.ssh/id_rsa"])
    _exact_refusal(ev, "CLI --pack native-local, host path", c, 125, "host path not allowed")
    return _verdict(ev, "HCP_SANDBOX=native-local; allow-list, env scrub and host-path refusal "
                        "still apply")
