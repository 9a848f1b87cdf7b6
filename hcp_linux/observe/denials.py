"""What a run was refused, layer by layer: the receipt's ``denials`` and ``--explain``.

An agent that sees a command fail must tell a sandbox refusal from a missing file or a broken
tool, or it retries, or its user turns the sandbox off. So each run collects the refusals it
caused, deterministically, from the layer that refused:

- seccomp: the filter hands each policy denial (an errno answer other than ENOSYS, see
  seccomp_profiles.compiler.notified) to the runtime as SECCOMP_RET_USER_NOTIF.
  :class:`SeccompListener` (one service thread for all runs) receives it, answers it with
  the errno the blocklist gave before (SECCOMP_IOCTL_NOTIF_SEND, never "continue"), and
  records it with its rule (profile, ``why``). Calls the filter allows never reach it: a
  run with no denial pays nothing per syscall.
- network: the egress proxy's refusals (its decisions are in the receipt already), and,
  under network = "allow", connect() and send attempts that find no route in the sandbox's
  namespace (a raw address: only allowed names reach the network). The filter hands every
  connect(), every sendto() that names a destination, and every sendmsg()/sendmmsg() to the
  listener there (the network-observe profile); it reads the destination, records it if it
  has no route (egress.routes) and the socket uses it, and answers "continue" in every case:
  the kernel runs the call and refuses it by its own routes, so the record never decides
  anything.
- Landlock: the kernel logs denials (ABI >= 7) to the audit subsystem only; where this
  process may read them (root in the initial namespaces, audit on), :mod:`landlock_log`
  gives each run its domain's records; elsewhere the layer is said unavailable, with why.
- the mount view: a path that is not in the view is not refused, it is absent (ENOENT); no
  kernel layer sees it. The receipt's roots are the view; :func:`explain_lines` says so.

Bounded: at most :data:`MAX_RECORDED` records per layer; the rest are counted.
"""
from __future__ import annotations

import errno
import os
import select
import socket
import threading
from typing import Any

from .. import receipt_keys as keys
from . import landlock_log
from ..seccomp_profiles.model import OBSERVE

#: Records kept per run and layer; past it, only counted (a flood of blocked calls must not
#: grow the runtime's memory or the receipt).
MAX_RECORDED = 100

#: The profile that hands connect() and the sends to the listener, which records
#: the attempts that find no route (rulesets.observes_connect says where: "allow" only).
OBSERVED_PROFILE = "network-observe"

#: Why a connect() or a send to a raw address fails under network = "allow", and what to do
#: instead (a TCP connect, or a TCP Fast Open sendto()).
NO_ROUTE = "no route: only allowed names reach the network (raw addresses are not routed)"
NO_ROUTE_HINT = "use the host name with --allow-host NAME:PORT"
#: A datagram's: only the sandbox's resolver answers UDP there (docs/network-modes.md).
NO_ROUTE_UDP_HINT = ("UDP reaches only the sandbox's resolver (127.0.0.53, in "
                     "/etc/resolv.conf); a tool that needs other UDP needs --network host")

#: How long the end of a run waits for the listener's answers in progress.
_FINISH = 2.0


class SeccompListener:
    """Answers and records one run's seccomp denials, served by the process's one
    :class:`_Service` thread, which wakes only for a notification: a run with no denial
    costs no thread start, no wake-up (a thread per run cost each run ~0.3 ms, measured).

    Every notification is answered with the errno the same profiles' program without
    notifications gives that call (the blocklist's answer before denials were recorded); the
    record names the rule that matched (profile, ``why``). If no one answers, the calling
    thread waits in the kernel, killable: the run's timeout and kill still end it. When the
    listener fd is closed (the runtime dies, or gives up on it), the kernel answers pending
    and later notified calls ENOSYS: still refused."""

    def __init__(self, listener: int, profiles: tuple[str, ...],
                 local: tuple[tuple[bytes, int], ...] = ()) -> None:
        self.listener = listener
        self._profiles = profiles
        # the allow list's networks the egress-capture step made local (plan.capture_nets):
        # reached, not "no route"
        self._local = local
        self.lock = threading.Lock()
        self.closed = False
        self.records: list[dict[str, Any]] = []
        self.count = 0
        self.no_route: list[dict[str, Any]] = []  # network records: no-route connect/sendto
        self.no_route_count = 0
        self.unread = ""  # why a call's destination could not be read, if one could not
        self.error = ""  # why the records may be incomplete, if they may
        self._answers: Any = None  # the program that answers itself, decoded on first use
        self._explainer: Any = None

    def start(self) -> None:
        """Have the service thread watch the listener (epoll_ctl from here: no wake-up)."""
        _service().watch(self)

    # -- the caller holds self.lock ----------------------------------------------------------

    def pending(self) -> bool:
        """Whether a notification waits (poll, no wait): NOTIF_RECV itself would block."""
        poller = select.poll()
        poller.register(self.listener, select.POLLIN)
        return any(ev & select.POLLIN for _, ev in poller.poll(0))

    def answer_one(self) -> None:
        """Receive one notification, answer it, record it."""
        from hcp_linux.seccomp_profiles import notify
        from hcp_linux.seccomp_profiles.explain import Explainer

        try:
            n = notify.receive(self.listener)
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.EINTR):
                return  # the caller was killed or interrupted before we read it
            raise
        if self._explainer is None:
            self._explainer = Explainer(self._profiles)
        found = self._explainer.match(n.nr, n.args)
        if found is not None and found.action == OBSERVE:
            self._observe(n, found.syscall)
            return
        err = self._errno(n)
        # Answered at once, with no read of the caller's memory in between: a caller gone
        # meanwhile fails the answer (ENOENT), and ids are never reused within a filter, so
        # SECCOMP_IOCTL_NOTIF_ID_VALID has nothing to add here.
        answered = notify.refuse(self.listener, n.id, err)
        record: dict[str, Any] = {
            "layer": "seccomp", "syscall": found.syscall if found else f"#{n.nr}",
            "nr": n.nr, "pid": n.pid, "errno": errno.errorcode.get(err, str(err)),
            "profile": found.profile if found else None, "why": found.why if found else None,
        }
        if not answered:
            record["note"] = "the caller was gone before the answer"
        self.count += 1
        if len(self.records) < MAX_RECORDED:
            self.records.append(record)

    def _observe(self, n: Any, what: str) -> None:
        """A connect() or an addressed send (``what``: the syscall's name) handed over to be
        looked at: record it if its destination has no route in the sandbox's namespace,
        and let the kernel run it in every case.

        The destination is read from the caller's memory by its pid (:meth:`_destination`),
        then the notification is checked still pending (SECCOMP_IOCTL_NOTIF_ID_VALID: the pid
        was still the caller's when read, not a recycled one). The look never decides: the
        kernel reads the destination again when it runs the call and refuses it by the
        namespace's own routes (none there but lo's), so memory rewritten meanwhile (TOCTOU)
        widens nothing; at worst a record is missing or names an address the call no longer
        held. Memory that cannot be read (EFAULT, a caller gone) is not recorded: the kernel
        answers the call; memory this runtime may not read (EPERM: a ptrace policy such as
        Yama's) is said in the receipt (``denial_layers.network``: incomplete)."""
        from hcp_linux.seccomp_profiles import notify

        dest = None
        if n.pid > 0:
            try:
                dest = self._destination(n, what)
            except OSError as e:  # EFAULT: the kernel cannot read it either; ESRCH: gone
                if e.errno not in (errno.EFAULT, errno.ESRCH, errno.EBADF, errno.ENOTSOCK):
                    # EPERM: not ours to read; ENOSYS: no pidfd_getfd (before 5.6)
                    self.unread = self.unread or f"{what}: {e.strerror}"
        if dest is not None and not notify.still_pending(self.listener, n.id):
            dest = None  # the pid may not have been the caller's when read
        notify.let_run(self.listener, n.id)  # gone meanwhile (False): nothing to answer
        if dest is None:
            return
        self.no_route_count += 1
        if len(self.no_route) < MAX_RECORDED:
            udp = what != "connect" and dest[2] == socket.SOCK_DGRAM
            self.no_route.append({
                "layer": "network", "what": what, "address": dest[0], "port": dest[1],
                "pid": n.pid, "errno": "ENETUNREACH", "reason": NO_ROUTE,
                "hint": NO_ROUTE_UDP_HINT if udp else NO_ROUTE_HINT})

    def _destination(self, n: Any, what: str) -> "tuple[str, int, int] | None":
        """(address, port, socket type) of the call's destination when it has no route and
        the call goes there; None otherwise. Reads the caller's memory (OSError as the
        kernel says): connect(fd, addr, len); sendto(fd, buf, size, flags, addr, len);
        sendmsg(fd, msghdr, flags); sendmmsg(fd, vector, count, flags), of which the first
        :data:`routes.MMSG_READ` entries, and the first with no route among them (the kernel
        stops at a vector's first failure; later entries, unread, are not recorded). A send's
        socket, borrowed, says whether it uses the address (routes.send_uses_address)."""
        from hcp_linux.egress import routes
        from hcp_linux.seccomp_profiles import notify

        def read_sockaddr(address: int, length: int) -> bytes:
            if not address or not 0 < length <= routes.SOCKADDR_STORAGE:
                return b""  # none, or one the kernel refuses (EINVAL) before any route
            return notify.read_memory(n.pid, address, min(length, routes.SOCKADDR_MAX))

        a = n.args
        if what == "connect":
            found = routes.unrouted(read_sockaddr(a[1], a[2] & 0xFFFFFFFF), self._local)
            return None if found is None else (found[0], found[1], socket.SOCK_STREAM)
        if what == "sendto":
            flags, names = a[3], [(a[4], a[5] & 0xFFFFFFFF)]
        elif what == "sendmsg":
            flags = a[2]
            names = routes.msg_names(notify.read_memory(n.pid, a[1], routes.MSGHDR_SIZE)
                                     if a[1] else b"", routes.MSGHDR_SIZE)
        elif what == "sendmmsg":
            count, flags = min(a[2] & 0xFFFFFFFF, routes.MMSG_READ), a[3]
            names = routes.msg_names(notify.read_memory(
                n.pid, a[1], count * routes.MMSGHDR_SIZE) if a[1] and count else b"",
                routes.MMSGHDR_SIZE)
        else:
            return None
        for address, length in names:
            sockaddr = read_sockaddr(address, length)
            found = routes.unrouted(sockaddr, self._local)
            if found is not None:
                kind = _sends_there(n.pid, a[0] & 0xFFFFFFFF, routes.sockaddr_family(sockaddr),
                                    flags & 0xFFFFFFFF)
                return None if kind is None else (found[0], found[1], kind)
        return None

    def _errno(self, n: Any) -> int:
        """The errno the profiles' program without notifications answers this call: the
        answer the blocklist gave before denials were recorded, exactly (run on the call's
        seccomp_data, ~6 us). EPERM if that program would not refuse it (it cannot: the two
        programs differ only in the action of the same rules): refused either way."""
        import hcp_linux.seccomp_profiles as seccomp_profiles
        from hcp_linux.seccomp_profiles import bpf

        if self._answers is None:
            self._answers = bpf.decode(seccomp_profiles.compile_profiles(self._profiles))
        ret = bpf.run(self._answers, n.nr, n.arch, n.args)
        if ret & bpf.RET_ACTION_FULL == bpf.RET_ERRNO and ret & bpf.RET_DATA:
            return int(ret & bpf.RET_DATA)
        return errno.EPERM

    def _close(self) -> None:
        _service().unwatch(self)
        if self.listener >= 0:
            os.close(self.listener)
            self.listener = -1

    # -- in the service thread ---------------------------------------------------------------

    def on_event(self, events: int) -> None:
        with self.lock:
            if self.listener < 0:
                return
            try:
                if events & select.EPOLLIN and self.pending():
                    self.answer_one()
                elif events & (select.EPOLLHUP | select.EPOLLERR):
                    _service().unwatch(self)  # no task uses the filter: finish() closes it
            except OSError as e:
                self.error = self.error or f"{type(e).__name__}: {e}"
                _service().unwatch(self)
            if self.closed:  # finish() gave up waiting for this answer: ours to close
                self._close()

    # -- at the end of the run, in the thread that waited for it ----------------------------

    def finish(self, wait: float = _FINISH) -> None:
        """The run is over (every process of it gone): answer what is still queued, here,
        and close the listener. Bounded by ``wait`` (an answer in progress holds the lock;
        the service closes the listener when it is done with it)."""
        if not self.lock.acquire(timeout=wait):
            self.error = self.error or f"the listener did not answer within {wait:g}s"
            self.closed = True
            return
        try:
            if not self.closed and self.listener >= 0:
                while self.pending():
                    self.answer_one()
        except OSError as e:
            self.error = self.error or f"{type(e).__name__}: {e}"
        finally:
            self.closed = True
            self._close()
            self.lock.release()

    def summary(self) -> tuple[list[dict[str, Any]], int]:
        """The seccomp records and their count so far. Without the lock, which an answer
        stuck in progress may hold: a copy of a list is one step under the GIL."""
        return list(self.records), self.count

    def no_route_summary(self) -> tuple[list[dict[str, Any]], int]:
        """The network records (connects and sends that found no route) and their count
        so far."""
        return list(self.no_route), self.no_route_count


def _sends_there(pid: int, fd: int, family: int, flags: int) -> "int | None":
    """The type of the socket ``fd`` of process ``pid`` when a send on it with a destination
    of ``family`` and ``flags`` goes there (egress.routes.send_uses_address), else None.
    Looked at on a copy of the fd (notify.borrow_fd), closed here: the caller's socket is
    left as it was. OSError as the kernel says (EBADF, ENOTSOCK: the call's own answer)."""
    from hcp_linux.egress.routes import send_uses_address
    from hcp_linux.seccomp_profiles import notify

    copy = notify.borrow_fd(pid, fd)
    try:
        held = socket.socket(fileno=copy)
    except OSError:
        os.close(copy)
        raise
    with held:
        try:
            held.getpeername()
            connected = True
        except OSError:  # ENOTCONN
            connected = False
        if send_uses_address(held.type, held.family, family, flags, connected):
            return int(held.type)
    return None


def receive_listener(channel: int) -> tuple[int, int]:
    """The listener the executor sent on ``channel`` before exec, or -1, and the pid of the
    process that sent it (the kernel's SCM_CREDENTIALS, in our pid namespace: the channel
    has SO_PASSCRED from its start), or 0; closes the channel. Called once the exec is
    confirmed, so it is there if it was sent: no wait."""
    import array
    fds: list[int] = []
    sender = 0
    with socket.socket(fileno=channel) as ch:
        try:
            _, ancillary, _, _ = ch.recvmsg(
                1, socket.CMSG_SPACE(4) + socket.CMSG_SPACE(12), socket.MSG_DONTWAIT)
        except BlockingIOError:
            return -1, 0
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds += array.array("i", data[:len(data) - len(data) % 4])
        elif level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(data) >= 4:
            sender = int.from_bytes(data[:4], "little", signed=True)
    for extra in fds[1:]:
        os.close(extra)
    return (fds[0] if fds else -1), sender


class _Service(threading.Thread):
    """The one thread that answers every run's notifications (epoll; listeners are added
    and removed by the runs' own threads). Started with the first run that records
    denials; it never stops, and holds nothing between runs."""

    def __init__(self) -> None:
        super().__init__(name="hcp-seccomp-listener", daemon=True)
        self._ep = select.epoll()
        self._by_fd: dict[int, SeccompListener] = {}
        self._lock = threading.Lock()

    def watch(self, run: SeccompListener) -> None:
        with self._lock:
            self._by_fd[run.listener] = run
            self._ep.register(run.listener, select.EPOLLIN)

    def unwatch(self, run: SeccompListener) -> None:
        with self._lock:
            if run.listener >= 0 and self._by_fd.get(run.listener) is run:
                del self._by_fd[run.listener]
                self._ep.unregister(run.listener)

    def run(self) -> None:
        while True:
            for fd, events in self._ep.poll():
                with self._lock:  # an event of an fd unwatched meanwhile finds no run
                    run = self._by_fd.get(fd)
                if run is not None:
                    try:
                        run.on_event(events)
                    except Exception as e:  # noqa: BLE001 - one run's fault must not end it
                        run.error = run.error or f"{type(e).__name__}: {e}"


_the_service: "_Service | None" = None
_service_lock = threading.Lock()


def _service() -> _Service:
    global _the_service
    if _the_service is None:
        with _service_lock:
            if _the_service is None:
                service = _Service()
                service.start()
                _the_service = service
    return _the_service


def _forget_service() -> None:
    """In a forked child: the service thread is the parent's."""
    global _the_service, _service_lock
    _the_service, _service_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_service)


def network_records(decisions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The egress proxy's refusals as denial records."""
    out = []
    for d in decisions:
        if d.get("allowed"):
            continue
        out.append({"layer": "network", "host": d.get("host"), "port": d.get("port"),
                    "reason": d.get("reason"), "protocol": d.get("protocol")})
    return out


def denial_layers(plan: Any) -> dict[str, str]:
    """Per layer, whether this run's denials are recorded ("recorded") or why not."""
    out: dict[str, str] = {}
    if plan.seccomp is not None:
        out["seccomp"] = ("recorded (ENOSYS fallback answers, such as clone3's, are not)"
                          if plan.seccomp_listener else plan.seccomp_unrecorded)
    if plan.landlock is not None:
        out["landlock"] = landlock_unrecorded(plan)
    if plan.proxy:
        out["network"] = "recorded (the egress proxy's refusals" + (
            "; connect() and send attempts that find no route)"
            if plan.seccomp_listener and OBSERVED_PROFILE in plan.seccomp_names
            else "; not connect() nor send attempts that find no route: no seccomp "
            "listener)")
    if "mountns" in plan.layers:
        out["mount"] = "unavailable: " + MOUNT_HINT
    return out


def landlock_unrecorded(plan: Any) -> str:
    """``denial_layers.landlock`` as the run starts: "recorded" where its records are read
    (complete() then says whether they all came), else why not."""
    if plan.landlock_log:
        return "recorded"
    why = landlock_log.available()
    if why:
        return why
    seccomp_why = (plan.seccomp_unrecorded or "no seccomp layer").removeprefix("unavailable: ")
    return (f"unavailable: the seccomp listener's message names the process that makes the "
            f"run's Landlock domain, and this run has no listener ({seccomp_why})")


def complete(receipt: dict[str, Any], listener: "SeccompListener | None",
             landlock: "landlock_log.Watch | None" = None) -> None:
    """At the end of a run: the receipt's ``denials`` (and ``denials_not_recorded``, the
    count past MAX_RECORDED per layer)."""
    denials: list[dict[str, Any]] = []
    dropped: dict[str, int] = {}
    if listener is not None:
        listener.finish()
        records, count = listener.summary()
        denials += records
        if count > len(records):
            dropped["seccomp"] = count - len(records)
        if listener.error:
            keys.set_denial_layer(receipt, "seccomp",
                                  f"incomplete: the listener stopped: {listener.error}")
    decisions = receipt.get("network", {}).get("decisions") or []
    net = network_records(decisions)
    net_count = len(net)
    if listener is not None:
        no_route, no_route_count = listener.no_route_summary()
        net += no_route
        net_count += no_route_count
    denials += net[:MAX_RECORDED]
    if net_count > MAX_RECORDED:
        dropped["network"] = net_count - MAX_RECORDED
    if landlock is not None:  # after the listener is closed: it holds nothing of the run
        keys.set_denial_layer(receipt, "landlock", landlock.finish())
        denials += landlock.records
        if landlock.count > len(landlock.records):
            dropped["landlock"] = landlock.count - len(landlock.records)
    elif keys.denial_layer(receipt, "landlock") == "recorded":  # the maker's pid never came
        keys.set_denial_layer(receipt, "landlock",
                              "unavailable: the process that made the run's Landlock domain "
                              "was not learned (no credentials with the listener)")
    if listener is not None and listener.unread \
            and keys.denial_layer(receipt, "network") is not None:
        keys.set_denial_layer(receipt, "network",
                              "incomplete: the destination of a connect() or a send could "
                              f"not be read ({listener.unread}); the kernel refused it all "
                              "the same")
    keys.set_denials(receipt, denials, dropped)


#: The calls whose no-route attempts are recorded, and the word --explain says for each.
_NO_ROUTE_CALLS = {"connect": "connect", "sendto": "send", "sendmsg": "send",
                   "sendmmsg": "send"}

MOUNT_HINT = ("a path outside the mount view is absent (ENOENT), not refused: no layer "
              "records it; the view is the receipt's roots")


def explain(denial: dict[str, Any]) -> str:
    """One line an agent can act on, for one record."""
    layer = denial.get("layer")
    if layer == "seccomp":
        what = denial.get("syscall")
        who = f"seccomp profile {denial['profile']}: {denial['why']}" if denial.get("profile") \
            else "seccomp"
        return (f"blocked: {what} (pid {denial.get('pid')}, {denial.get('errno')}; {who}) "
                f"— not allowed in the sandbox")
    if layer == "landlock":
        return landlock_log.explain(denial)
    if layer == "network" and denial.get("what") in _NO_ROUTE_CALLS:
        address, port = denial.get("address"), denial.get("port")
        shown = f"[{address}]" if ":" in str(address) else address
        verb = _NO_ROUTE_CALLS[str(denial.get("what"))]
        return (f"blocked: {verb} to {shown}:{port} (pid {denial.get('pid')}, "
                f"{denial.get('errno')}) — {denial.get('reason')}; {denial.get('hint')}")
    if layer == "network":
        return _explain_egress(denial)
    return f"blocked: {denial}"


def _explain_egress(denial: dict[str, Any]) -> str:
    """An egress proxy or resolver refusal. A DNS answer has a name and no port; a connection
    that sent no request (or an unreadable one) may have neither: what is unknown is not
    printed, and the --allow-host hint is given only where a name or address is known."""
    host, port = denial.get("host"), denial.get("port")
    reason = str(denial.get("reason") or "refused")
    if denial.get("protocol") == "dns":
        if host is None:
            return f"blocked: a DNS query — {reason}"
        hint = ("" if "not a valid host name" in reason
                else f"; if it is needed, add --allow-host {host}")
        return f"blocked: DNS lookup of {host} — {reason}{hint}"
    if host is None:
        return f"blocked: a connection to the egress proxy that named no host — {reason}"
    shown = f"[{host}]" if ":" in str(host) else str(host)
    target = shown if port is None else f"{shown}:{port}"
    if "denied by rule" in reason:
        hint = "it is on the deny list (deny_hosts)"
    elif reason.startswith("connecting to "):
        hint = "allowed, but the host did not answer: not a sandbox refusal"
    elif reason.startswith("not connected to "):
        hint = "allowed, but the command ended first: not a sandbox refusal"
    elif reason.startswith("captured connection to "):
        hint = "connect to a name the sandbox's resolver answered, not to an address"
    else:
        hint = f"if it is needed, add --allow-host {target}"
    return f"blocked: connect to {target} — {reason}; {hint}"


def explain_lines(receipt: dict[str, Any], returncode: int) -> list[str]:
    """``--explain``: one line per recorded denial; then what was not recorded; and, after
    a failed run, what the mount view holds (a path outside it is absent, not refused)."""
    lines = [explain(d) for d in receipt.get("denials", ())]
    for layer, n in sorted((receipt.get("denials_not_recorded") or {}).items()):
        lines.append(f"blocked: {n} more {layer} denials (not recorded: the first "
                     f"{MAX_RECORDED} are)")
    if returncode == 0:
        return lines
    sources = receipt.get("denial_layers") or {}
    for layer in ("seccomp", "landlock"):
        why = sources.get(layer, "")
        if why.startswith(("unavailable", "incomplete")):
            lines.append(f"note: {layer} denials are not recorded here ({why})")
    view = (receipt.get("layers") or {}).get("mountns") or {}
    if view.get("status") == "enforced":
        ro = " ".join(view.get("read_only", ())) or "-"
        rw = " ".join(view.get("read_write", ())) or "-"
        lines.append(f"note: the sandbox sees only its view (read-only: {ro}; read-write: "
                     f"{rw}); other paths are absent (ENOENT), not refused; to show one, add "
                     f"--read-only-root DIR or --write-root DIR")
    return lines
