"""A run's Landlock denials, read from the kernel's audit records.

Landlock (ABI >= 7) logs a denial as an AUDIT_LANDLOCK_ACCESS record naming the *domain*
that refused (an id, unique per boot) and what was refused; the first logged denial of a
domain is followed by an AUDIT_LANDLOCK_DOMAIN record, ``status=allocated``, that names the
process which made the domain (``pid=``, in the initial pid namespace). A run's domain is
made by its init (or, without a pid namespace, its monitor): the process that also sends the
seccomp listener to the runtime, which learns its pid from that message's credentials
(SCM_CREDENTIALS, the kernel's word, translated to our pid namespace). So: the allocation
record with that pid gives the run's domain id, and every access record of that domain is
the run's. The event's AUDIT_SYSCALL record, when the kernel makes one, adds the pid and
the call that was refused.

What the domain logs is chosen at landlock_restrict_self (:func:`restrict_flags`):

- never the executor's own steps (LOG_SAME_EXEC_OFF): hcp-exec's proof that the ruleset is in
  force opens a canary that Landlock must refuse, which the kernel would otherwise log on
  every run into the host's audit trail;
- never the domains the command nests inside ours (LOG_SUBDOMAINS_OFF): a sandboxed command
  does not write into the host's audit trail through a sandbox of its own;
- the command's denials (LOG_NEW_EXEC_ON) only when this runtime reads them
  (:func:`available`), so a host's trail gets no records nobody asked for.

At the end of a run (every process of it gone, so every denial already queued), a marker
message (audit.send_user) is sent and waited for: once it is back, every record of the run
has been delivered (the queue is first in, first out). The kernel's count of dropped
records (AUDIT_GET ``lost``) before and after says when some may be missing. One reader
thread serves every run of the process; records of domains not yet claimed (a denial can
come before the runtime learns the init's pid) wait, bounded, for their run.
"""
from __future__ import annotations

import errno
import os
import threading
import time
from collections import OrderedDict
from typing import Any

from . import audit

#: What the receipt says while the kernel's audit is off: Landlock logs nothing then.
DISABLED = ("unavailable: the kernel's audit is disabled (enabled=0: auditctl -e 1, or boot "
            "with audit=1)")
#: Seconds a status that said audit is off stands for a run that logged nothing.
RECHECK = 1.0
#: Seconds the end of a run waits for its marker to come back through the audit queue.
FLUSH_WAIT = 2.0
#: Domains (and pids of allocation records) kept for a run that has not claimed them yet;
#: records of other processes' domains (other sandboxes on the host) pass through here too.
_UNCLAIMED = 256
_PER_UNCLAIMED = 16
#: Events whose access record waits for the same event's syscall record.
_AWAITING_SYSCALL = 256

_LOG_SAME_EXEC_OFF, _LOG_NEW_EXEC_ON, _LOG_SUBDOMAINS_OFF = 1 << 0, 1 << 1, 1 << 2


_logs: bool | None = None  # whether the kernel's Landlock logs (ABI >= 7)


def restrict_flags(reading: bool) -> int:
    """The ``landlock_restrict_self`` flags of a run: 0 below ABI 7 (no audit there, and the
    kernel refuses flags it does not know)."""
    global _logs
    if _logs is None:
        import hcp_linux.landlock as landlock
        try:
            _logs = landlock.abi_version() >= 7
        except OSError:
            _logs = False
    if not _logs:
        return 0
    return _LOG_SAME_EXEC_OFF | _LOG_SUBDOMAINS_OFF | (_LOG_NEW_EXEC_ON if reading else 0)


_why_not: str | None = None
_the_reader: "_Reader | None" = None
_lock = threading.Lock()
#: The last audit status read, and when (time.monotonic()).
_last: audit.Status | None = None
_last_at = float("-inf")


def available() -> str:
    """"" when this process can read Landlock's audit records, else why not: asked once per
    process, as the answer depends on the kernel and on this process's capabilities, which
    do not change. Whether audit is on is asked per run (:func:`prepare`): it may be turned
    on and off."""
    global _why_not
    if _why_not is not None:
        return _why_not
    with _lock:
        if _why_not is not None:
            return _why_not
        why = ""
        import hcp_linux.landlock as landlock
        try:
            abi = landlock.abi_version()
        except OSError as e:
            abi, why = 0, f"no Landlock ({e.strerror})"
        if not why and abi < 7:
            why = f"Landlock ABI {abi} logs no denials (ABI 7 does)"
        if not why:
            try:
                _read_status()
            except OSError as e:
                why = _capability_says("the audit status (AUDIT_GET)", "CAP_AUDIT_CONTROL", e)
        if not why:
            try:
                audit.subscribe(rcvbuf=0).close()  # the reader subscribes once audit is on
            except OSError as e:
                why = _capability_says("the audit records (the read-log group)",
                                       "CAP_AUDIT_READ", e)
        if not why and not _has_capability(29):  # CAP_AUDIT_WRITE: the end-of-run marker
            why = "writing the end-of-run marker needs CAP_AUDIT_WRITE"
        _why_not = "unavailable: " + why if why else ""
        return _why_not


def _read_status() -> audit.Status:
    """The audit status now, kept as the last one read."""
    global _last, _last_at
    status = audit.status()
    _last, _last_at = status, time.monotonic()
    return status


def _recent_status() -> audit.Status | None:
    """The last status read, if read less than RECHECK ago; else read now (None if it
    cannot be). AUDIT_GET costs a kernel thread per answer (~0.1-0.2 ms): asked at most
    once a RECHECK on the spawn's path."""
    if _last is not None and time.monotonic() - _last_at < RECHECK:
        return _last
    try:
        return _read_status()
    except OSError:
        return None


def prepare() -> None:
    """Before a run whose records are read (plan.landlock_log): where audit is on, have the
    reader subscribed, so that no record of the run can come before it. While audit is off
    there is no reader thread (none to pay for: the ctypes executor forks a runtime of one
    thread directly) and nothing to read."""
    global _the_reader
    reader = _the_reader
    if reader is not None and reader.is_alive():
        return
    status = _recent_status()
    if status is None or not status.enabled:
        return
    with _lock:
        if _the_reader is None or not _the_reader.is_alive():  # none yet, or it stopped
            try:
                sock = audit.subscribe()
            except OSError:
                return  # the run's Watch finds no reader and says so
            reader = _Reader(sock)
            reader.start()
            _the_reader = reader


def _capability_says(what: str, capability: str, e: OSError) -> str:
    name = errno.errorcode.get(e.errno or 0, str(e.errno))
    if e.errno in (errno.EPERM, errno.EACCES, errno.ECONNREFUSED):
        return f"reading {what} needs {capability} in the initial namespaces ({name})"
    return f"reading {what} failed ({e.strerror or e})"


def _has_capability(bit: int) -> bool:
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"CapEff:"):
                    return bool(int(line.split()[1], 16) >> bit & 1)
    except (OSError, ValueError):
        pass
    return False


def _forget() -> None:
    """In a forked child: the reader thread and its socket are the parent's."""
    global _why_not, _the_reader, _lock, _last, _last_at
    _why_not, _the_reader, _lock = None, None, threading.Lock()
    _last, _last_at = None, float("-inf")


os.register_at_fork(after_in_child=_forget)


#: The uncertainty of a process's start on the wall clock: /proc/stat's btime is whole
#: seconds, a start time whole clock ticks.
_START_SLACK = 1.0


def _boot_time() -> float | None:
    try:
        with open("/proc/stat", "rb") as f:
            for line in f:
                if line.startswith(b"btime "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


_BOOT_TIME = _boot_time()


def _started(pid: int) -> float | None:
    """When ``pid`` started, on the wall clock (seconds), or None when it cannot be read."""
    if _BOOT_TIME is None:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat_ = f.read()
        ticks = int(stat_.rsplit(b")", 1)[1].split()[19])  # field 22: starttime
    except (OSError, ValueError, IndexError):
        return None
    return _BOOT_TIME + ticks / os.sysconf("SC_CLK_TCK")


def _made_by(w: "Watch", allocated_at: float) -> bool:
    """Whether a domain allocated at ``allocated_at`` (the audit event's wall clock) by the
    pid ``w`` watches can be that process's: not when it came before the process started
    (a pid reused: pid_max is 32768 on many hosts, a test suite wraps it in minutes, and an
    earlier process's domain would be taken for the run's, its denials with it). Unknown
    start (neither read nor given): refused, since a run's missing records are better than
    another process's."""
    return w.maker_started is not None and allocated_at >= w.maker_started - _START_SLACK


class Watch:
    """One run's Landlock records: made when the runtime learns the pid of the process that
    made the run's domain, finished when the run is over."""

    def __init__(self, reader: "_Reader | None", pid: int, limit: int,
                 began: float | None = None) -> None:
        self._reader = reader
        self.pid = pid
        self.limit = limit
        self.domain: str | None = None
        self.records: list[dict[str, Any]] = []
        self.count = 0
        self.note = ""  # why the records may be incomplete, if they may
        #: audit's status as the run started (read at most RECHECK before); None when it
        #: could not be read
        self.start = _recent_status()
        #: when the domain's maker started (wall clock, seconds; None: unknown): a domain
        #: allocated before it is another process's that had the same pid (pids wrap).
        #: The runtime learns the maker's pid only once the command runs, and a short
        #: command's maker may be gone by then (its /proc entry with it): then ``began``,
        #: when the run began (before the maker was spawned, or a spare's was handed the
        #: plan), stands for it. The run's domain logs nothing before the command's exec
        #: (LOG_SAME_EXEC_OFF), which came after that.
        started = _started(pid)
        self.maker_started = began if started is None else started

    def add(self, rec: dict[str, Any]) -> None:
        """Under the reader's lock."""
        self.count += 1
        if len(self.records) < self.limit:
            self.records.append(rec)

    def finish(self, wait: float = FLUSH_WAIT) -> str:
        """Wait until every record of the run has come (the marker), stop watching, and
        return what the receipt says of the layer: "recorded" or why not (completely)."""
        reader = self._reader
        try:
            if self.start is None:
                return "incomplete: the audit status could not be read as the run started"
            if not self.start.enabled and not self.count and _last is not None \
                    and not _last.enabled and time.monotonic() - _last_at < RECHECK:
                # off, as read less than RECHECK ago: a run on a host with audit off does
                # not pay an AUDIT_GET each
                return DISABLED + f" (as read at most {RECHECK:g}s before the run ended)"
            try:
                status = _read_status()  # the records lost were lost by now
            except OSError as e:
                return f"incomplete: the audit status could not be read ({e})"
            if not status.enabled:
                if self.start.enabled or self.count:
                    return ("incomplete: audit was turned off during the run; the records "
                            "before that are here")
                return DISABLED
            if not self.start.enabled:
                return (f"incomplete: audit was off as the run started (read at most "
                        f"{RECHECK:g}s before), on at its end; denials before it was turned "
                        f"on were not logged")
            if reader is None:
                return "incomplete: the audit records could not be subscribed to"
            if reader.stopped:
                return f"incomplete: the audit reader stopped ({reader.stopped})"
            nonce = os.urandom(8).hex()
            done = reader.expect(nonce)
            try:
                try:
                    audit.send_user(f"hcp-linux-flush={nonce}")
                except OSError as e:
                    return f"incomplete: the end-of-run marker could not be sent ({e})"
                if not done.wait(wait):
                    return _marker_lost(reader, wait)
                if reader.stopped:
                    return f"incomplete: the audit reader stopped ({reader.stopped})"
            finally:
                reader.unexpect(nonce)
            if self.note:
                return f"incomplete: {self.note}"
            if status.lost > self.start.lost:
                return (f"incomplete: the kernel dropped {status.lost - self.start.lost} audit "
                        f"records since before the run (backlog limit "
                        f"{status.backlog_limit}); some of this run's may be among them")
            return "recorded (the kernel's audit records of the run's Landlock domain)"
        finally:
            if reader is not None:
                reader.forget(self)


def _marker_lost(reader: "_Reader", wait: float) -> str:
    """The end-of-run marker did not come back in time. If nothing at all ever came to the
    reader, the records do not reach this process (the kernel multicasts them in the initial
    network namespace only): later runs are not read, rather than each waiting in vain."""
    global _why_not
    if not reader.received:
        _why_not = ("unavailable: the audit records do not reach this process (the kernel "
                    "sends them to the initial network namespace only)")
        return "incomplete: " + _why_not.removeprefix("unavailable: ")
    return (f"incomplete: the end-of-run marker did not come back within {wait:g}s (the "
            f"reader thread was starved or the kernel's audit thread is behind)")


def watch(pid: int, limit: int, began: float | None = None) -> Watch | None:
    """Start collecting the records of the domain made by ``pid`` (a host pid: the run's
    init or monitor, which may have ended already); ``began``: when the run began (wall
    clock, time.time()), before its maker could make the domain. None when this process
    cannot read them (:func:`available`)."""
    if available():
        return None
    reader = _the_reader
    w = Watch(reader, pid, limit, began)
    if reader is not None:
        reader.claim(w)
    return w


class _Reader(threading.Thread):
    """The thread that receives every audit record and hands Landlock's to their runs."""

    def __init__(self, sock: Any) -> None:
        super().__init__(name="hcp-audit-reader", daemon=True)
        self._sock = sock
        self.received = 0  # messages received, all kinds
        self.stopped = ""  # why the thread ended, if it did
        self._lock = threading.Lock()
        self._by_pid: dict[int, Watch] = {}
        self._by_domain: dict[str, Watch] = {}
        # pid -> (domain, when it was allocated: the event's wall clock), unclaimed
        self._allocated: OrderedDict[int, tuple[str, float]] = OrderedDict()
        self._early: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()  # unclaimed
        self._awaiting: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()  # by serial
        self._markers: dict[str, threading.Event] = {}

    # -- the runs' side ----------------------------------------------------------------------

    def claim(self, w: Watch) -> None:
        with self._lock:
            self._by_pid[w.pid] = w
            allocated = self._allocated.pop(w.pid, None)
            if allocated is not None and _made_by(w, allocated[1]):
                self._bind(w, allocated[0])

    def forget(self, w: Watch) -> None:
        with self._lock:
            if self._by_pid.get(w.pid) is w:
                del self._by_pid[w.pid]
            if w.domain is not None and self._by_domain.get(w.domain) is w:
                del self._by_domain[w.domain]

    def expect(self, nonce: str) -> threading.Event:
        event = threading.Event()
        with self._lock:
            self._markers[nonce] = event
        return event

    def unexpect(self, nonce: str) -> None:
        with self._lock:
            self._markers.pop(nonce, None)

    # -- the thread --------------------------------------------------------------------------

    def run(self) -> None:
        while True:
            try:
                data = self._sock.recv(1 << 16)
            except OSError as e:
                with self._lock:  # records were lost to this socket: say so to every run
                    for w in self._by_pid.values():
                        w.note = w.note or (f"the audit socket lost records "
                                            f"({errno.errorcode.get(e.errno or 0, e)})")
                if e.errno == errno.ENOBUFS:
                    continue
                self.stopped = f"recv: {e.strerror or e}"
                self._sock.close()
                with self._lock:  # the runs waiting for a marker learn it now
                    for event in self._markers.values():
                        event.set()
                return
            self.received += 1
            for kind, payload in audit.messages(data):
                try:
                    self._one(kind, payload)
                except Exception as e:  # noqa: BLE001 - one odd record must not end the reader
                    with self._lock:
                        for w in self._by_pid.values():
                            w.note = w.note or f"a record could not be read ({e!r})"

    def _one(self, kind: int, payload: bytes) -> None:
        if kind == audit.AUDIT_USER:
            at = payload.find(b"hcp-linux-flush=")
            if at >= 0:
                nonce = payload[at + 16:at + 32].decode("ascii", "replace")
                with self._lock:
                    event = self._markers.pop(nonce, None)
                if event is not None:
                    event.set()
            return
        if kind == audit.AUDIT_SYSCALL:  # the host's every audited call: read only ours
            with self._lock:
                waiting = self._awaiting.pop(audit.serial_of(payload) or "", ())
            syscall = audit.record(payload) if waiting else None
            if syscall is not None:
                for rec in waiting:
                    _add_syscall(rec, syscall[1])
            return
        if kind not in (audit.AUDIT_LANDLOCK_ACCESS, audit.AUDIT_LANDLOCK_DOMAIN):
            return
        parsed = audit.record(payload)
        if parsed is None:
            return
        serial, fields = parsed
        with self._lock:
            if kind == audit.AUDIT_LANDLOCK_ACCESS:
                self._access(serial, fields)
            elif fields.get("status") == "allocated":
                self._allocated_domain(serial, fields)

    def _access(self, serial: str, fields: dict[str, str]) -> None:
        domain = fields.get("domain", "")
        rec = _access_record(fields)
        w = self._by_domain.get(domain)
        if w is not None:
            w.add(rec)
        else:  # its allocation record follows in the same event, or its run claims it later
            early = self._early.setdefault(domain, [])
            self._early.move_to_end(domain)
            if len(early) < _PER_UNCLAIMED:
                early.append(rec)
            while len(self._early) > _UNCLAIMED:
                self._early.popitem(last=False)
        self._awaiting.setdefault(serial, []).append(rec)
        while len(self._awaiting) > _AWAITING_SYSCALL:
            self._awaiting.popitem(last=False)

    def _allocated_domain(self, serial: str, fields: dict[str, str]) -> None:
        try:
            pid = int(fields.get("pid", ""))
            at = float(serial.split(":", 1)[0])
        except ValueError:
            return
        domain = fields.get("domain", "")
        w = self._by_pid.get(pid)
        if w is not None and w.domain is None and _made_by(w, at):
            self._bind(w, domain)
            return
        self._allocated[pid] = (domain, at)
        self._allocated.move_to_end(pid)
        while len(self._allocated) > _UNCLAIMED:
            self._allocated.popitem(last=False)

    def _bind(self, w: Watch, domain: str) -> None:
        w.domain = domain
        self._by_domain[domain] = w
        for rec in self._early.pop(domain, ()):
            w.add(rec)


#: The access record's fields kept in the receipt, as the kernel names them: the object
#: (path, dev, ino; daddr/dest or saddr/src for TCP; opid/ocomm for a signal; ioctlcmd).
_OBJECT_FIELDS = ("path", "dev", "ino", "ioctlcmd", "daddr", "dest", "saddr", "src", "opid",
                  "ocomm")


def _access_record(fields: dict[str, str]) -> dict[str, Any]:
    entry: dict[str, Any] = {"layer": "landlock",
                             "blockers": [b for b in fields.get("blockers", "").split(",") if b]}
    for name in _OBJECT_FIELDS:
        if name in fields:
            entry[name] = fields[name]
    return entry


def _add_syscall(entry: dict[str, Any], fields: dict[str, str]) -> None:
    """The refused call, from the event's AUDIT_SYSCALL record: its pid (ours: the initial
    namespace's), its name and its errno."""
    from hcp_linux.seccomp_profiles.syscalls import name_of
    try:
        entry["pid"] = int(fields.get("pid", ""))
    except ValueError:
        pass
    try:
        nr, arch = int(fields.get("syscall", "")), int(fields.get("arch", ""), 16)
    except ValueError:
        return
    entry["syscall"] = name_of(nr, arch) or f"#{nr}"
    try:
        code = -int(fields.get("exit", ""))
    except ValueError:
        return
    if code > 0:
        entry["errno"] = errno.errorcode.get(code, str(code))


#: Each blocker (the access right Landlock refused) as a verb and why it is refused, with
#: what to do where the policy can grant it.
_BLOCKERS: dict[str, tuple[str, str]] = {
    "fs.execute": ("execute", "read"), "fs.read_file": ("read", "read"),
    "fs.read_dir": ("list", "read"), "fs.write_file": ("write", "write"),
    "fs.truncate": ("truncate", "write"),
    # the kernel names the directory for these: the one an entry was to be made or removed in
    "fs.remove_dir": ("remove in", "write"), "fs.remove_file": ("remove in", "write"),
    "fs.make_char": ("create in", "write"), "fs.make_dir": ("create in", "write"),
    "fs.make_reg": ("create in", "write"), "fs.make_sock": ("create in", "write"),
    "fs.make_fifo": ("create in", "write"), "fs.make_block": ("create in", "write"),
    "fs.make_sym": ("create in", "write"), "fs.refer": ("link or rename in", "write"),
    "fs.ioctl_dev": ("ioctl", "ioctl"), "fs.resolve_unix": ("connect to", "socket"),
    "fs.change_topology": ("mount", "mount"),
    "net.bind_tcp": ("bind", "tcp"), "net.connect_tcp": ("connect to", "tcp"),
    "scope.abstract_unix_socket": ("connect to", "abstract"), "scope.signal": ("signal", "signal"),
}
_HINTS = {
    "read": "not granted in the sandbox; if it is needed, add --read-only-root DIR",
    "write": "not writable in the sandbox; if it is needed, add --write-root DIR",
    "kernel": "a kernel interface the sandbox may read only",
    "ioctl": "device ioctls are granted on the terminal only",
    "socket": "a unix socket outside the grants; if it is needed, add --allow-unix-socket PATH",
    "mount": "the sandbox's mounts are fixed",
    "tcp": "TCP is refused where the sandbox has no network namespace of its own",
    "abstract": "abstract unix sockets outside the sandbox cannot be reached",
    "signal": "processes outside the sandbox cannot be signalled",
}


def explain(denial: dict[str, Any]) -> str:
    """One line an agent can act on, for one Landlock record."""
    blockers = denial.get("blockers") or []
    verb, kind = _BLOCKERS.get(blockers[0], ("access", "read")) if blockers else ("access", "read")
    path = str(denial.get("path", ""))
    if kind == "tcp":
        what = f"TCP port {denial.get('dest', denial.get('src', '?'))}"
    elif kind == "signal":
        what = f"pid {denial.get('opid', '?')} ({denial.get('ocomm', '?')})"
    else:
        what = path or "?"
    if kind in ("read", "write") and path.startswith(("/proc/", "/sys/", "/dev/")):
        kind = "kernel" if kind == "write" else kind
    how = ", ".join(str(denial[k]) for k in ("syscall", "errno") if k in denial)
    who = f"pid {denial['pid']}" if "pid" in denial else "pid ?"
    return (f"blocked: {verb} {what} ({who}{', ' + how if how else ''}; landlock: "
            f"{','.join(blockers) or '?'}) — {_HINTS[kind]}")
