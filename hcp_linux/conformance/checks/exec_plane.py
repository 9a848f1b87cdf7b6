"""§10.6 Workspace / exec plane: the workspace modes, file references, argv as an array,
writeback.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from ...errors import HostPathError, PolicyError, SandboxError
from ...runtime_files import jail_home
from ..harness import Evidence, Harness, proc_summary
from .base import PY_ARGV, _exact_refusal, _ran, _stdout, _tree_digest, _verdict, check


@check("10.6-mode-none", "§10.6", "mode none: cwd is the pack root, read-only",
       requirement="mode none (the default): the pack root (HCP/1); §10.5's reference runs the "
                   "child with a fixed cwd at the pack root. Read-only here (docs/driver.md "
                   "decision 1), so the pack's own executables stay unwritable.",
       enforced_by="driver; the pack root read-only by the mount view or Landlock")
def mode_none(h: Harness, ev: Evidence) -> str:
    files = {"data.txt": "pack data\n", "bin/tool": "#!/bin/sh\necho tool\n"}
    manifest = h.pack("pack", ["sh", "bin/tool"], mode="none", files=files)
    bare = h.pack("bare", ["sh"], files={"data.txt": "bare data\n"})  # no wrap.workspace
    root = manifest.parent
    before = _tree_digest(root)
    d = h.driver()
    script = ('pwd; cat data.txt; for f in new.txt data.txt bin/tool; do '
              '(echo evil >> "$f") 2>/dev/null && echo "wrote $f" || echo "refused $f"; done; '
              'rm pack.toml 2>/dev/null && echo "removed pack.toml" || echo "refused rm"')
    ev.try_(f"mode none: {script!r}")
    r = h.drive(d, manifest, ["sh", "-c", script])
    if _ran(ev, "mode none", r):
        lines = _stdout(r).splitlines()
        ev.require(lines[:1] == [str(root)], f"cwd {lines[:1]} is not the pack root {root}")
        ev.require(lines[1:2] == ["pack data"], "the pack's own file was not readable by a "
                                                "path relative to the cwd")
        ev.require(lines[2:] == ["refused new.txt", "refused data.txt", "refused bin/tool",
                                 "refused rm"], f"writes into the pack root: {lines[2:]}")
    after = _tree_digest(root)
    ev.saw(f"pack tree sha256 before {before[:16]}…, after {after[:16]}…")
    ev.require(before == after, "the pack root changed on disk")
    ev.try_("a pack with no wrap.workspace: pwd; cat data.txt")
    b = h.drive(d, bare, ["sh", "-c", "pwd; cat data.txt"])
    if _ran(ev, "no wrap.workspace", b):
        ev.require(_stdout(b).splitlines() == [str(bare.parent), "bare data"],
                   f"the default mode does not run in the pack root: {_stdout(b)!r}")
    ctl = h.unconfined(["sh", "-c", f'echo x > "{root}/ctl" && rm "{root}/ctl" && echo ok'])
    ev.ctl(f"unconfined write into the pack root: {proc_summary(ctl)}")
    ev.control_ok(ctl.returncode == 0, "the pack root is not writable even unconfined")
    return _verdict(ev, "cwd = the pack root (also with no wrap.workspace); its files read "
                        "by relative path; create, append, remove refused and absent on disk")


@check("10.6-mode-none-scratch", "§10.6", "mode none: HOME/TMPDIR writable and private per "
       "exec, outputs written back, nothing left",
       requirement="mode none keeps the pack root read-only, so what a run writes goes "
                   "elsewhere: a private TMPDIR (and home_env keys) per exec, the driver's "
                   "staging for --output; all removed in cleanup.",
       enforced_by="driver; the private /tmp by the mount view (else a scratch write root)")
def mode_none_scratch(h: Harness, ev: Evidence) -> str:
    manifest = h.pack("pack", ["sh"], mode="none", files={"data.txt": "pack data\n"})
    homed = h.pack("homed", ["sh"], mode="none")
    with open(homed, "a") as f:  # the manifest ends with its [wrap.workspace] table
        f.write('home_env = ["HOME"]\n')
    host = h.mkdir("host")
    d = h.driver()
    script = ('echo t > "$TMPDIR/t" && echo tmp-ok; ls -A "$TMPDIR"; '
              'cat data.txt > "$2" && echo out-ok')
    ev.try_(f"mode none, twice: {script!r} -o out.txt")
    r1 = h.drive(d, manifest, ["sh", "-c", script, "sh", "-o", "out.txt"], cwd=str(host))
    r2 = h.drive(d, manifest, ["sh", "-c", 'ls -A "$TMPDIR"'])
    if _ran(ev, "run 1", r1) and _ran(ev, "run 2", r2):
        ev.require("tmp-ok" in _stdout(r1).splitlines(), "TMPDIR was not writable")
        ev.require("t" not in _stdout(r2).splitlines(), "run 2 saw run 1's TMPDIR")
        got = (host / "out.txt").read_text() if (host / "out.txt").exists() else None
        ev.require(got == "pack data\n", f"-o out.txt written back: {got!r}")
    ev.try_("home_env = [HOME]: echo h > $HOME/h")
    r3 = h.drive(d, homed, ["sh", "-c", 'echo h > "$HOME/h" && echo "$HOME"'])
    if _ran(ev, "home_env", r3):
        home = _stdout(r3).strip()
        ev.require(home != str(homed.parent) and not (homed.parent / "h").exists(),
                   f"HOME is the pack root: {home}")
        ev.require(bool(home) and not os.path.exists(home),
                   f"the scratch HOME {home} survived")
    left = _left_in(h.dir / "tmp")
    ev.require(left == [], f"leftovers in the driver's tmp dir: {left}")
    return _verdict(ev, "private TMPDIR per exec, writable HOME (home_env) outside the pack, "
                        "-o written back, nothing left")


@check("10.6-mode-ephemeral", "§10.6", "wrap.workspace mode ephemeral: a fresh jail per exec",
       requirement="ephemeral is a fresh jail per exec.",
       enforced_by="driver (no layer)")
def mode_ephemeral(h: Harness, ev: Evidence) -> str:
    manifest = h.pack("pack", ["sh"], mode="ephemeral")
    d = h.driver()
    r1 = h.drive(d, manifest, ["sh", "-c", "pwd; ls -A; echo left > note"])
    r2 = h.drive(d, manifest, ["sh", "-c", "pwd; ls -A"])
    if _ran(ev, "run 1", r1) and _ran(ev, "run 2", r2):
        ev.require(r1.jail != r2.jail, "two execs shared a jail")
        ev.require(_stdout(r1).splitlines()[:1] == [os.path.realpath(r1.jail)],
                   "cwd is not the jail")
        ev.require("note" not in _stdout(r2).splitlines()[1:],
                   f"run 2 saw run 1's file: {_stdout(r2)!r}")
    ev.require(not os.path.exists(r1.jail) and not os.path.exists(r2.jail),
               "a jail survived its exec")
    ev.try_("a run killed by its timeout (1 s, sleep 30)")
    r3 = d.run(manifest, ["sh", "-c", "echo x > f; sleep 30"], capture_output=True, timeout=1)
    ev.saw(f"timed-out run: timed_out={r3.timed_out} rc={r3.returncode}")
    ev.require(r3.timed_out, "the run did not time out")
    ev.require(not os.path.exists(r3.jail), "the jail of a timed-out exec survived")
    left = _left_in(h.dir / "tmp")
    ev.require(left == [], f"leftovers in the driver's tmp dir: {left}")
    return _verdict(ev, "each exec got a fresh jail, removed after it (also after a timeout)")


@check("10.6-mode-workspace", "§10.6", "wrap.workspace mode workspace: a persistent jail per "
       "principal, HOME in it",
       requirement="workspace binds the jail to privacy.land: local for the Principal; the "
                   "runtime persists it. home_env defaults to [HOME].",
       enforced_by="driver (no layer)")
def mode_workspace(h: Harness, ev: Evidence) -> str:
    manifest = h.pack("pack", ["sh"], mode="workspace")
    d = h.driver()
    script = 'echo run >> count; echo "$HOME"; pwd; wc -l < count'
    a1 = h.drive(d, manifest, ["sh", "-c", script], principal="alice")
    a2 = h.drive(d, manifest, ["sh", "-c", script], principal="alice")
    b1 = h.drive(d, manifest, ["sh", "-c", script], principal="bob")
    if all(_ran(ev, w, r) for w, r in (("alice 1", a1), ("alice 2", a2), ("bob 1", b1))):
        jail = os.path.realpath(a1.jail)
        ev.require(a1.jail == a2.jail != b1.jail, "jails are not per principal")
        ev.require(_stdout(a1).split() == [jail, jail, "1"], f"alice 1: {_stdout(a1)!r}")
        ev.require(_stdout(a2).split() == [jail, jail, "2"], f"alice 2 did not see run 1's "
                                                             f"file: {_stdout(a2)!r}")
        ev.require(_stdout(b1).split()[2:] == ["1"], f"bob saw alice's file: {_stdout(b1)!r}")
        ev.require(a1.writeback.new_files == ("count",) and
                   a2.writeback.modified_files == ("count",),
                   f"new/modified files not reported: {a1.writeback} {a2.writeback}")
        ev.require(os.path.isfile(os.path.join(a1.jail, "count")), "the workspace did not "
                                                                   "persist")
        ev.require(jail.startswith(os.path.realpath(h.dir / "state") + "/"),
                   "the workspace is not under the state dir")
    # The CLI: `run --pack --principal`, persistent across CLI processes.
    env = dict(os.environ, XDG_STATE_HOME=str(h.mkdir("xdg")))
    counts = []
    for _ in range(2):
        c = h.cli(["run", "--pack", manifest, "--principal", "carol", "--", "sh", "-c",
                   "echo run >> count; wc -l < count"], env=env, expect_run=True)
        if _ran(ev, "CLI --pack --principal carol", c):
            counts.append(_stdout(c).strip())
    ev.require(counts == ["1", "2"], f"CLI runs counted {counts}, expected ['1', '2']")
    return _verdict(ev, "per-principal persistent jail with HOME in it, new/changed files "
                        "reported, persistent across CLI processes")


@check("10.6-file-references", "§10.6", "workspace: prefixes and file-flag values are "
       "rewritten into the jail",
       requirement="A runtime MUST rewrite workspace: prefixes into the jail (file_flags name "
                   "the flags whose next token is a file).",
       enforced_by="driver (no layer)")
def file_references(h: Harness, ev: Evidence) -> str:
    manifest = h.pack("pack", ["sh"], mode="workspace")
    host = h.mkdir("host")
    h.write(host / "in.txt", "host input\n")
    d = h.driver()
    script = 'printf "%s\\n" "$@"; echo data > "$1"; cat "${2#--json-file=}" "$4"'
    argv = ["sh", "-c", script, "sh", "workspace:data.txt", "--json-file=workspace:seed.txt",
            "--file", "in.txt"]
    ws = h.drive(d, manifest, ["sh", "-c", "echo seed > seed.txt"])  # a workspace file
    ev.try_(f"argv {argv[4:]} (cwd {host})")
    r = h.drive(d, manifest, argv, cwd=str(host))
    if _ran(ev, "seed run", ws) and _ran(ev, "rewrite run", r):
        jail = os.path.realpath(r.jail)
        lines = _stdout(r).splitlines()
        ev.saw(f"the child received {lines[:4]}")
        lines += [""] * (4 - len(lines))
        ev.require(lines[0] == f"{jail}/data.txt", f"workspace:data.txt became {lines[0]!r}")
        ev.require(lines[1] == f"--json-file={jail}/seed.txt",
                   f"--json-file=workspace:seed.txt became {lines[1]!r}")
        ev.require(lines[2] == "--file" and lines[3].startswith(jail + "/"),
                   f"--file in.txt became {lines[2:4]!r} (not inside the jail)")
        ev.require(lines[4:] == ["seed", "host input"], f"contents read: {lines[4:]}")
        landed = Path(jail, "data.txt")
        ev.require(landed.is_file() and landed.read_text() == "data\n",
                   "the workspace: file did not land in the jail")
    for bad in ("workspace:../escape.txt", "workspace:/etc/passwd", "--file=workspace:../x"):
        try:
            h.drive(d, manifest, ["sh", "-c", "touch escaped", "sh", bad])
            ev.require(False, f"{bad} was accepted")
        except SandboxError as e:
            ev.saw(f"{bad}: refused: {e}")
    return _verdict(ev, "workspace:, --flag=workspace: and --file host inputs point into the "
                        "jail; escapes refused")


_HOST_PATHS = ["/etc/passwd", "/home/someone/.aws/credentials", "/root/.ssh/id_rsa",
               "/Users/someone/secret", "--config=/etc/shadow", "/tmp/../etc/hosts",
               "//etc/passwd", "if=/etc/passwd", "of=/root/stolen", "--a=b=/home/u/.ssh/id",
               "-o=/etc/shadow"]


@check("10.6-host-path-refused", "§10.6", "Host-absolute paths under /etc /home /root /Users "
       "are refused with the exact message",
       requirement="MUST reject host-absolute paths under /etc, /home, /root and /Users "
                   "(`error: sandbox: host path not allowed`), as whole tokens and after any "
                   "`=` (`if=/etc/passwd`).",
       enforced_by="driver's file-reference scan before anything is created (no layer)")
def host_path_refused(h: Harness, ev: Evidence) -> str:
    shared = h.mkdir("shared")
    marker = shared / "ran"
    manifest = h.pack("pack", ["sh"], mode="ephemeral")
    d = h.driver(write_roots=(str(shared),))
    cases = [["sh", "-c", f"touch {marker}", "sh", p] for p in _HOST_PATHS]
    cases.append(["sh", "-c", f"touch {marker}", "sh", "--file", "/etc/hostname"])
    cases.append(["sh", "-c", f"touch {marker}", "sh", "-o", "/root/out.txt"])
    for argv in cases:
        what = " ".join(argv[4:])
        c = h.cli(["run", "--pack", manifest, "--write-root", shared, "--", *argv])
        _exact_refusal(ev, f"CLI --pack, {what}", c, 125, "host path not allowed")
        try:
            h.drive(d, manifest, argv)
            ev.require(False, f"driver: {what} was spawned")
        except HostPathError as e:
            ev.require(str(e) == "host path not allowed", f"driver: message {str(e)!r}")
        except SandboxError as e:
            ev.require(False, f"driver, {what}: refused with another error: {e}")
        ev.require(not marker.exists(), f"{what}: the command ran")
    ev.saw(f"{len(cases)} host paths refused by the CLI (125, exact line) and the driver "
           "(HostPathError)")
    # Control: the same argv with a path outside those prefixes runs.
    c = h.cli(["run", "--pack", manifest, "--write-root", shared, "--", "sh", "-c",
               f"touch {marker}", "sh", "/usr/share/doc"], expect_run=True)
    ev.ctl(f"the same with /usr/share/doc: {proc_summary(c)}")
    ev.control_ok(c.returncode == 0 and marker.exists(), "the control argv did not run")
    return _verdict(ev, f"{len(cases)} host-path forms refused (CLI 125 + exact line, driver "
                        "HostPathError); nothing ran")


_ARGV_NASTY = ["a b", "x; touch M1", "$(touch M2)", "`touch M3`", "'q' \"dq\"", "| touch M4",
               "> M5", "*", "--o=1 2", "", "tab\there", "new\nline", "\\"]


@check("10.6-file-references-stay-out", "§10.6", "File references cannot name the pack root, "
       "the state directory or another run's jail",
       requirement="MUST rewrite workspace: prefixes into the jail; a pack MUST NOT name a "
                   "driver or host path (the driver's own places are its business).",
       enforced_by="driver's file-reference scan before anything is created (no layer)")
def file_references_stay_out(h: Harness, ev: Evidence) -> str:
    tool_text = "#!/bin/sh\necho genuine\n"
    manifest = h.pack("pack", ["sh", "bin/tool"], mode="workspace",
                      files={"bin/tool": tool_text})
    tool = manifest.parent / "bin" / "tool"
    d = h.driver()
    host = h.mkdir("host")
    w = h.drive(d, manifest, ["sh", "-c", "echo alice-secret > notes.txt"], principal="alice")
    if not _ran(ev, "alice's workspace run", w):
        return _verdict(ev, "")
    alice = Path(w.jail) / "notes.txt"
    other = h.mkdir("tmp/hcp-linux-ephemeral-1-2-3/jail")
    h.write(other / "data", "another run\n")
    cases = [("-o into the pack's bin/tool", ["-o", str(tool)], "pack root"),
             ("--file from alice's workspace", ["--file", str(alice)], "state directory"),
             ("-o into alice's workspace", ["-o", str(alice)], "state directory"),
             ("--file from another run's jail", ["--file", str(other / "data")],
              "another run's jail")]
    for what, args, where in cases:
        ev.try_(f"principal bob: {what}")
        try:
            h.drive(d, manifest, ["sh", "-c", 'cat "$2"; echo owned > "$2"', "sh", *args],
                    principal="bob")
            ev.require(False, f"{what}: spawned")
        except PolicyError as e:
            ev.saw(f"{what}: refused: {e}")
            ev.require(where in str(e), f"{what}: refused for another reason: {e}")
    ev.require(tool.read_text() == tool_text, "the pack's tool was overwritten")
    ev.require(alice.read_text() == "alice-secret\n", "alice's file was overwritten")
    # Control: the same output to an ordinary host directory is written back.
    r = h.drive(d, manifest, ["sh", "-c", 'echo owned > "$2"', "sh", "-o",
                              str(host / "out.txt")], principal="bob")
    ok = r.returncode == 0 and (host / "out.txt").read_text() == "owned\n"
    ev.ctl(f"-o {host / 'out.txt'}: {proc_summary(r)}, written back: {ok}")
    ev.control_ok(ok, "an ordinary output was not written back")
    return _verdict(ev, "outputs into the pack root or a workspace, and inputs from another "
                        "principal's workspace or another run's jail, are refused")


@check("10.6-argv-array", "§10.6", "argv is spawned as an array: no shell, no splitting",
       requirement="MUST spawn argv as an array.",
       enforced_by="execve of the argv bytes (no layer)")
def argv_array(h: Harness, ev: Evidence) -> str:
    jail = h.mkdir("jail")
    py = h.python
    ev.try_(f"argv elements {_ARGV_NASTY!r}")
    markers = [f"M{i}" for i in range(1, 6)]

    def judge(what: str, r: object, where: Path) -> None:
        if _ran(ev, what, r):
            try:
                got = json.loads(_stdout(r))
            except ValueError:
                got = None
            ev.require(got == _ARGV_NASTY, f"{what}: the child received {got!r}")
        made = [m for m in markers if (where / m).exists()]
        ev.require(not made, f"{what}: a shell interpreted the arguments ({made} created)")

    judge("API", h.run([py, "-I", "-c", PY_ARGV, *_ARGV_NASTY], jail=jail), jail)
    judge("CLI", h.cli(["run", "--jail", jail, "--", py, "-I", "-c", PY_ARGV, *_ARGV_NASTY],
                       expect_run=True), jail)
    manifest = h.pack("pack", [py], mode="workspace")
    r = h.drive(h.driver(), manifest, [py, "-I", "-c", PY_ARGV, *_ARGV_NASTY])
    judge("driver", r, Path(r.jail))
    # Control: the same strings through a shell do create the markers.
    ctl = h.mkdir("control")
    h.unconfined(["sh", "-c", "echo " + " ".join(_ARGV_NASTY[:7])], cwd=str(ctl))
    made = [m for m in markers if (ctl / m).exists()]
    ev.ctl(f"the same strings through sh -c, unconfined: created {made}")
    ev.control_ok(len(made) >= 3, "the strings are harmless even through a shell")
    return _verdict(ev, "every element arrived intact (API, CLI, driver); no shell ran")


@check("10.6-writeback", "§10.6", "--output/-o are written back after success, atomically, "
       "never through a symlink",
       requirement="MUST write back --output / -o (and new jail files when mode is workspace) "
                   "according to its driver.",
       enforced_by="driver (no layer)")
def writeback(h: Harness, ev: Evidence) -> str:
    manifest = h.pack("pack", ["sh"], mode="ephemeral")
    host = h.mkdir("host")
    d = h.driver()
    h.write(host / "out1.txt", "old\n")
    ino = os.stat(host / "out1.txt").st_ino

    def tool(word: str, code: int) -> list[str]:
        return ["sh", "-c", f'echo {word} > "$2"; echo two > "$4"; '
                'echo three > "${5#--output=}"; echo four > "${6#--output=}"; '
                f'exit {code}', "sh",
                "--output", "out1.txt", "-o", "out2.txt", f"--output={host}/out3.txt",
                "--output=out4.txt"]

    ev.try_(f"argv {tool('one', 0)[4:]} in {host} (out1.txt exists), tool exits 0")
    r = h.drive(d, manifest, tool("one", 0), cwd=str(host))
    if _ran(ev, "successful run", r):
        got = {n: (host / n).read_text() if (host / n).exists() else None
               for n in ("out1.txt", "out2.txt", "out3.txt", "out4.txt")}
        ev.saw(f"host files after: {got}; written={list(r.writeback.written)}")
        ev.require(got == {"out1.txt": "one\n", "out2.txt": "two\n", "out3.txt": "three\n",
                           "out4.txt": "four\n"}, f"outputs written back: {got}")
        ev.require(os.stat(host / "out1.txt").st_ino != ino,
                   "out1.txt was rewritten in place, not replaced (temp file + rename)")
    ev.try_("the same, the tool writing 'bad' and exiting 1")
    r = h.drive(d, manifest, tool("bad", 1), cwd=str(host))
    after = (host / "out1.txt").read_text() if (host / "out1.txt").exists() else None
    ev.saw(f"failing run: rc={r.returncode}, skipped={r.writeback.skipped!r}, out1.txt "
           f"{after!r}")
    ev.require(r.returncode == 1 and after == "one\n",
               f"a failed run's output was written back (out1.txt is {after!r})")
    # Never through a symlink: an output whose destination is a symlink is refused.
    victim = h.write(h.mkdir("victim") / "file.txt", "victim\n")
    os.symlink(victim, host / "link.txt")
    try:
        h.drive(d, manifest, ["sh", "-c", 'echo evil > "$2"', "sh", "-o", "link.txt"],
                cwd=str(host))
        ev.require(victim.read_text() == "victim\n", "written back through a symlink")
        ev.note("an output destination that is a symlink was not refused before spawn")
    except SandboxError as e:
        ev.saw(f"-o link.txt (a symlink): refused: {e}")
    ev.require(victim.read_text() == "victim\n", "the symlink's target was written")
    # CLI --pack, absolute -o.
    out5 = host / "out5.txt"
    c = h.cli(["run", "--pack", manifest, "--", "sh", "-c", 'echo five > "$2"', "sh", "-o",
               out5], expect_run=True)
    if _ran(ev, "CLI --pack -o ABS", c):
        ev.require(out5.exists() and out5.read_text() == "five\n", "CLI: -o not written back")
    # Workspace mode: new jail files persist and are reported.
    wmanifest = h.pack("wpack", ["sh"], mode="workspace")
    w = h.drive(d, wmanifest, ["sh", "-c", "echo n > new.txt"])
    if _ran(ev, "workspace run", w):
        ev.require(w.writeback.new_files == ("new.txt",) and
                   os.path.isfile(os.path.join(w.jail, "new.txt")),
                   f"workspace mode: new_files {w.writeback.new_files}")
    return _verdict(ev, "--output/-o (4 spellings) written back atomically after exit 0 only; "
                        "never through a symlink; workspace new files reported")


def _left_in(tmp: Path) -> list[str]:
    """What the driver left in its temp dir: its entries, with the user's jail home there
    (an empty directory, kept once made: hcp_linux.runtime_files.jail_home) replaced by
    the jails it still holds."""
    home = Path(jail_home(str(tmp)))
    left = sorted(n for n in os.listdir(tmp) if tmp / n != home)
    return left + sorted(str(Path(home.name) / n) for n in
                         (os.listdir(home) if home.is_dir() else ()))
