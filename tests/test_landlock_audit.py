"""Landlock's denials of a run, read from the kernel's audit records (issue #20, item 1).

The kernel logs a Landlock denial (ABI >= 7) to the audit subsystem only; the runtime reads
the records where it may (root in the initial namespaces: CAP_AUDIT_CONTROL, _READ, _WRITE)
and audit is enabled. This host boots with audit off, so the tests that need records turn it
on for their own duration and restore the state they found (``audit_on``); nothing else of
the host's audit configuration is touched.

Each denial is real: the sandboxed command opens a file Landlock refuses (the canary at the
view's root, not granted; /proc/self/oom_score_adj for writing, /proc granted read-only), and
gets EACCES. Controls: the same open for writing succeeds unconfined; with audit off the
layer says so and has no records; a run with no denial records nothing; the executor's own canary check, made on every run, is not in
the host's audit trail (LOG_SAME_EXEC_OFF), while a command's open of the same file is.
Both executors; root here, and the unavailable answer as nobody.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from runtime_hooks import audit_changed, set_audit
from sandboxing import TIMEOUT, hcp_argv

import hcp_linux.landlock as landlock
from hcp_linux import Policy, Sandbox
from hcp_linux.observe import audit, landlock_log
from hcp_linux.native import binary

EXECUTORS = ["ctypes"] + (["native"] if binary() is not None else [])

#: Opens the canary (read) and /proc/self/oom_score_adj (write) N times each, printing the
#: errno names; then, if asked, waits for a line on stdin before the next round.
_DENIED = r"""
import errno, sys
n = int(sys.argv[1]) if len(sys.argv) > 1 else 1
for i in range(n):
    for path, mode in (("/.hcp-canary", "r"), ("/proc/self/oom_score_adj", "w")):
        try:
            with open(path, mode) as f:
                if mode == "w":
                    f.write("0")
            print(path, "ok", flush=True)
        except OSError as e:
            print(path, errno.errorcode[e.errno], flush=True)
    if len(sys.argv) > 2:
        sys.stdin.readline()
"""


def _kernel_logs() -> bool:
    try:
        return landlock.abi_version() >= 7
    except OSError:
        return False


needs_reader = pytest.mark.skipif(
    not _kernel_logs() or landlock_log.available() != "",
    reason="reading Landlock's audit records needs Landlock ABI 7 and root in the initial "
           "namespaces (CAP_AUDIT_CONTROL, CAP_AUDIT_READ, CAP_AUDIT_WRITE)")


@contextlib.contextmanager
def _audit(value: int) -> Iterator[None]:
    before = audit.status().enabled
    if before == 2:
        pytest.skip("audit's configuration is locked (enabled=2)")
    set_audit(value)
    audit_changed()
    try:
        yield
    finally:
        set_audit(before)
        audit_changed()


@pytest.fixture
def audit_on() -> Iterator[None]:
    with _audit(1):
        yield


@pytest.fixture
def audit_off() -> Iterator[None]:
    with _audit(0):
        yield


@pytest.fixture
def jail(tmp_path: Path) -> Path:
    d = tmp_path / "jail"
    d.mkdir()
    (d / "denied.py").write_text(_DENIED)
    os.chmod(tmp_path, 0o755)
    return d


def _run(jail: Path, executor: str, *argv: str, **policy: object):  # type: ignore[no-untyped-def]
    return Sandbox(Policy(jail=str(jail), **policy), executor=executor).run(  # type: ignore[arg-type]
        list(argv), capture_output=True, timeout=TIMEOUT)


def _landlock(receipt: dict) -> list[dict]:
    return [d for d in receipt["denials"] if d["layer"] == "landlock"]


@needs_reader
@pytest.mark.root_only
@pytest.mark.parametrize("executor", EXECUTORS)
def test_landlock_denials_are_recorded(jail: Path, executor: str, audit_on: None) -> None:
    run = _run(jail, executor, "python3", "denied.py")
    assert run.returncode == 0, run.stderr
    # refused for real: EACCES, and the write did not happen (the value is unchanged below)
    assert run.stdout.decode().split("\n")[:2] == [
        "/.hcp-canary EACCES", "/proc/self/oom_score_adj EACCES"]
    assert run.receipt["denial_layers"]["landlock"].startswith("recorded"), run.receipt
    got = _landlock(run.receipt)
    read = [d for d in got if d["blockers"] == ["fs.read_file"]]
    write = [d for d in got if "fs.write_file" in d["blockers"]]
    assert [d["path"] for d in read] == ["/.hcp-canary"], got
    assert len(write) == 1 and write[0]["path"].endswith("/oom_score_adj"), got
    for d in read + write:
        assert d["syscall"] in ("open", "openat") and d["errno"] == "EACCES", d
        assert d["pid"] > 0 and d["pid"] != os.getpid()
    assert len({d["pid"] for d in read + write}) == 1  # one process made every call


@pytest.mark.root_only
def test_the_write_succeeds_unconfined(tmp_path: Path) -> None:
    """Control: the refused write is one a process may make outside the sandbox."""
    p = subprocess.run([sys.executable, "-c", "open('/proc/self/oom_score_adj', 'w').write('0')"],
                       capture_output=True, timeout=TIMEOUT)
    assert p.returncode == 0, p.stderr


@needs_reader
@pytest.mark.root_only
def test_audit_off_is_said_and_records_nothing(jail: Path, audit_off: None) -> None:
    run = _run(jail, EXECUTORS[-1], "python3", "denied.py")
    assert "/.hcp-canary EACCES" in run.stdout.decode()  # still refused
    assert run.receipt["denial_layers"]["landlock"].startswith(
        "unavailable: the kernel's audit is disabled")
    assert _landlock(run.receipt) == []


@needs_reader
@pytest.mark.root_only
@pytest.mark.parametrize("executor", EXECUTORS)
def test_the_executors_own_check_is_not_logged(jail: Path, executor: str,
                                               audit_on: None) -> None:
    """Every run proves its ruleset is in force by an open Landlock must refuse (the
    canary); the kernel would log that into the host's audit trail on every run. It is
    not logged: what is seen on the audit multicast for a run of /bin/true is nothing of
    Landlock's, while a command's own open of the canary is seen (the control)."""
    def landlock_records(*argv: str) -> list[bytes]:
        seen: list[bytes] = []
        with audit.subscribe() as sub:
            sub.settimeout(0.2)
            run = _run(jail, executor, *argv)
            nonce = os.urandom(8).hex()
            audit.send_user(f"test-flush={nonce}")
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                try:
                    data = sub.recv(1 << 16)
                except socket.timeout:
                    continue
                done = False
                for kind, payload in audit.messages(data):
                    if kind == audit.AUDIT_LANDLOCK_ACCESS and b"hcp-canary" in payload:
                        seen.append(payload)
                    done = done or (kind == audit.AUDIT_USER and nonce.encode() in payload)
                if done:
                    break
            else:
                pytest.fail("the flush marker did not come back")
        assert run.returncode == 0, run.stderr
        return seen
    assert landlock_records("/bin/true") == []
    assert len(landlock_records("python3", "-c", "import os\ntry: open('/.hcp-canary')\n"
                                "except OSError: pass")) == 1


@needs_reader
@pytest.mark.root_only
def test_concurrent_runs_get_their_own_records(jail: Path, audit_on: None) -> None:
    """Records go to the run whose domain refused: two runs at once, 3 and 5 rounds. A pair
    during which the kernel dropped audit records (its backlog limit, reached on a loaded CI
    machine: the receipt says "incomplete", honestly) is run again, at most three times."""
    box = Sandbox(Policy(jail=str(jail)))
    for _ in range(3):
        results: dict[int, object] = {}

        def one(n: int) -> None:
            results[n] = box.run(["python3", "denied.py", str(n)], capture_output=True,
                                 timeout=TIMEOUT)
        threads = [threading.Thread(target=one, args=(n,)) for n in (3, 5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        statuses = [results[n].receipt["denial_layers"]["landlock"]  # type: ignore[attr-defined]
                    for n in (3, 5)]
        if not any(s.startswith("incomplete: the kernel dropped") for s in statuses):
            break
    for n in (3, 5):
        run = results[n]
        assert run.returncode == 0, run.stderr  # type: ignore[attr-defined]
        said = run.receipt["denial_layers"]["landlock"]  # type: ignore[attr-defined]
        assert said.startswith("recorded"), said
        got = _landlock(run.receipt)  # type: ignore[attr-defined]
        assert sum(d["blockers"] == ["fs.read_file"] for d in got) == n, got


@needs_reader
@pytest.mark.root_only
def test_a_flood_is_capped_and_counted(jail: Path, audit_on: None) -> None:
    """1,000 rounds: at most 100 records kept, the rest counted; if the kernel dropped
    records (its backlog limit), the layer says so instead of claiming them all."""
    run = _run(jail, EXECUTORS[-1], "python3", "denied.py", "1000")
    assert run.returncode == 0, run.stderr
    assert run.stdout.decode().count("EACCES") == 2000
    said = run.receipt["denial_layers"]["landlock"]
    assert len(_landlock(run.receipt)) == 100
    counted = 100 + run.receipt.get("denials_not_recorded", {}).get("landlock", 0)
    if said.startswith("recorded"):
        assert counted >= 2000  # each open's denial (a write open may log two blockers' worth)
    else:
        assert said.startswith("incomplete: the kernel dropped"), said
        assert 100 <= counted <= 4000


@needs_reader
@pytest.mark.root_only
def test_audit_turned_off_mid_run_is_said(jail: Path) -> None:
    """The records before audit was turned off are kept; the layer says it is incomplete."""
    with _audit(1):
        proc = Sandbox(Policy(jail=str(jail))).spawn(
            ["python3", "denied.py", "2", "wait"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            assert proc.stdout.readline() == b"/.hcp-canary EACCES\n"
            proc.stdout.readline()
            time.sleep(0.2)  # the first round's records reach the reader
            set_audit(0)
            proc.stdin.write(b"go\n")
            proc.stdin.flush()
            proc.stdin.close()
            assert proc.wait(timeout=TIMEOUT) == 0
        finally:
            proc.kill()
            proc.wait()
        said = proc.receipt["denial_layers"]["landlock"]
        assert said.startswith("incomplete: audit was turned off during the run"), said
        assert [d["path"] for d in _landlock(proc.receipt)][:1] == ["/.hcp-canary"]


@pytest.mark.skipif(os.geteuid() == 0, reason="the answer of a process without the capabilities")
def test_unavailable_without_the_capabilities_says_why(jail: Path) -> None:
    run = _run(jail, EXECUTORS[-1], "python3", "denied.py")
    assert "/.hcp-canary EACCES" in run.stdout.decode()
    said = run.receipt["denial_layers"]["landlock"]
    assert said.startswith("unavailable: ") and ("CAP_AUDIT" in said or "ABI" in said), said
    assert _landlock(run.receipt) == []


@needs_reader
@pytest.mark.root_only
def test_explain_says_what_to_do(jail: Path, audit_on: None) -> None:
    p = subprocess.run(hcp_argv(jail, "python3", "denied.py", extra=["--explain"]),
                       capture_output=True, timeout=TIMEOUT, cwd=jail)
    assert p.returncode == 0, p.stderr
    lines = [line for line in p.stderr.decode().splitlines() if "landlock:" in line]
    assert any(line.startswith("blocked: read /.hcp-canary (pid ") and
               "EACCES; landlock: fs.read_file) — not granted in the sandbox; if it is needed, "
               "add --read-only-root DIR" in line for line in lines), lines
    assert any(line.startswith("blocked: write /proc/") and "a kernel interface" in line
               for line in lines), lines


def test_the_kernels_record_text_is_read() -> None:
    """The record format of Documentation/admin-guide/LSM/landlock.rst, and the kernel's
    untrusted-string encodings: quoted, or hexadecimal when the text has a space, a quote,
    a control character or a byte above 0x7e."""
    got = audit.record(b'audit(1729738800.268:30): domain=195ba459b blockers=fs.refer '
                       b'path="/usr/bin" dev="vda2" ino=351\0')
    assert got == ("1729738800.268:30", {"domain": "195ba459b", "blockers": "fs.refer",
                                          "path": "/usr/bin", "dev": "vda2", "ino": "351"})
    hexed = "/tmp/a b\"c\n".encode().hex().upper().encode()
    assert audit.fields(b"domain=1 path=" + hexed + b" comm=(null)")["path"] == "/tmp/a b\"c\n"
    assert audit.fields(b"comm=(null) ocomm=\"sh\"") == {"comm": "(null)", "ocomm": "sh"}
    assert audit.record(b"type=1423 not a record") is None
    assert audit.record(b"audit(1.2:3") is None
    # a SYSCALL record's numbers (arch=c000003e syscall=257) give the call's name
    from hcp_linux.seccomp_profiles.syscalls import name_of
    assert name_of(257, 0xC000003E) == "openat" and name_of(1 << 20, 0xC000003E) is None


_DEAF = r"""
import json, sys
from hcp_linux import Policy, Sandbox
box = Sandbox(Policy(jail=sys.argv[1]))
said = []
for _ in range(2):
    run = box.run(["python3", "denied.py"], capture_output=True)
    said.append(run.receipt["denial_layers"]["landlock"])
print(json.dumps(said))
"""


@needs_reader
@pytest.mark.root_only
def test_a_runtime_the_records_do_not_reach_says_so_once(jail: Path, audit_on: None) -> None:
    """The kernel multicasts audit records in the initial network namespace only. A runtime
    in another one has every capability and still gets nothing: its first run waits for the
    end-of-run marker in vain (bounded) and says so; later runs do not wait at all."""
    p = subprocess.run(["unshare", "--net", "--", sys.executable, "-c", _DEAF, str(jail)],
                       capture_output=True, timeout=TIMEOUT, cwd=jail)
    assert p.returncode == 0, p.stderr
    first, second = json.loads(p.stdout)
    assert first.startswith("incomplete: the audit records do not reach this process"), first
    assert second.startswith("unavailable: the audit records do not reach this process"), second


def test_a_domain_allocated_before_its_maker_started_is_not_the_runs() -> None:
    """pid_max is 32768 on many hosts: a test suite wraps it in minutes, and an earlier
    process's unclaimed domain, allocated under the same pid, was taken for a later run's
    (its denials in the run's receipt). The reader binds a domain to a run only when the
    allocation came after the run's maker started. Fed the kernel's record text directly
    (the reader's own parsing and matching, no audit needed); a real process is the maker."""
    from hcp_linux.observe import audit, landlock_log
    child = subprocess.Popen(["sleep", "30"])
    try:
        started = landlock_log._started(child.pid)
        assert started is not None
        reader = landlock_log._Reader(socket.socket(socket.AF_UNIX))

        def allocated(at: float, domain: str) -> None:
            text = (f"audit({at:.3f}:7): domain={domain} status=allocated mode=enforcing "
                    f"pid={child.pid} uid=0 exe=\"/bin/sleep\" comm=\"sleep\"").encode()
            reader._one(audit.AUDIT_LANDLOCK_DOMAIN, text)

        allocated(started - 60, "1a2b")  # another process's, when this pid was its
        stale = landlock_log.Watch(reader, child.pid, 10)
        reader.claim(stale)
        assert stale.domain is None
        reader.forget(stale)
        allocated(started + 0.5, "3c4d")  # the run's own (negative control)
        mine = landlock_log.Watch(reader, child.pid, 10)
        reader.claim(mine)
        assert mine.domain == "3c4d"
        # a stale record that comes after the claim (a backlog) is refused too
        late = landlock_log.Watch(reader, child.pid, 10)
        reader.forget(mine)
        reader.claim(late)
        allocated(started - 60, "5e6f")
        assert late.domain is None
    finally:
        child.kill()
        child.wait()


def _gone(pid: int) -> bool:
    """Whether ``pid`` has no /proc entry left (ended and reaped)."""
    return not os.path.exists(f"/proc/{pid}")


@needs_reader
@pytest.mark.root_only
@pytest.mark.parametrize("since", ["the-run-began", "control-unknown"])
@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_maker_gone_before_its_watch_still_gets_its_records(
        jail: Path, executor: str, since: str, audit_on: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The runtime learns the pid of the domain's maker (the init) once the command runs; a
    short command, on a loaded host, is over and its init reaped before the runtime reads
    when that init started. The run's records were then refused as another process's and
    the receipt said "recorded" with none of them (test_concurrent_runs_get_their_own_records
    failed 10 in 22 under two CPU hogs). Here the order is forced: the watch is made only
    once the maker's /proc entry is gone. When the run began stands for the maker's start;
    the control (the watch told nothing of when the run began) shows the loss it prevents."""
    real = landlock_log.watch
    waited: list[bool] = []

    def late_watch(pid: int, limit: int, began: float | None = None):  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + TIMEOUT
        while not _gone(pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        waited.append(_gone(pid))
        return real(pid, limit, began if since == "the-run-began" else None)
    monkeypatch.setattr(landlock_log, "watch", late_watch)
    run = _run(jail, executor, "python3", "denied.py", "2")
    assert waited == [True]  # the order was the one under test
    assert run.returncode == 0, run.stderr
    assert run.receipt["denial_layers"]["landlock"].startswith("recorded"), run.receipt
    reads = sum(d["blockers"] == ["fs.read_file"] for d in _landlock(run.receipt))
    assert reads == (2 if since == "the-run-began" else 0), _landlock(run.receipt)
