"""The sweeps owed by runs whose runtime died (hcp_linux.policy.protected).

A run's sweep is done by its runtime once every process of the run is gone. A runtime killed
during the run (the OOM killer, a harness's SIGKILL when the user cancels, a `timeout -s
KILL`) takes its sandbox with it (each process has PDEATHSIG), but not what the command
made: the ``.envrc`` it wrote stays, and the next run's lookup finds it existing, takes it
for the user's, and binds it read-only; nobody ever sweeps it. So before the command
starts, its sweep is written down (:func:`owe`), with the runtime's own files
(:func:`hcp_linux.runtime_files.pending_directory`: in the virtual environment, private to
the user, never writable by a run; outside a virtual environment there is none, and the
receipt says so), and removed once done (:func:`paid`). The next lookup of any runtime of
the user's (:func:`hcp_linux.policy.protected.find`) and ``hcp-linux gc`` first do the sweep
of each record whose runtime is gone (:func:`collect`). Done later, when the user may have
made one of those names since, what it finds is moved aside, not removed.

A record is JSON, named ``PID-START-RANDOM.json`` after the runtime that wrote it (its pid
and start time, so a reused pid is not taken for it). One that cannot be read was cut short
while it was written, before the command existed: it is removed. Only the stdlib.
"""
from __future__ import annotations

import os

from . import SweepEntry, sweep
from .after import After, sweep_made

_SUFFIX = ".json"
#: A record being collected is renamed to this suffix and the collector's id first: two
#: runtimes collecting at once do not both sweep it, and one that died meanwhile is seen.
_TAKEN = ".taking-"


def _start_time(pid: int) -> str | None:
    """The start time (clock ticks after boot) of process ``pid``, None when it is gone or
    cannot be read: with the pid, what tells a process from a later one with its pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2:].split()
    return fields[19].decode() if len(fields) > 19 else None


_mine: str | None = None


def _me() -> str:
    global _mine
    pid = os.getpid()
    if _mine is None or not _mine.startswith(f"{pid}-"):  # a fork is another process
        _mine = f"{pid}-{_start_time(pid) or 0}"
    return _mine


#: Each record's body but its start, by (entries, after): a runtime writes the same one for
#: every run of a policy.
_bodies: dict[tuple, bytes] = {}


def owner_of(pid: int) -> str:
    """The id a record names the runtime ``pid`` by (its pid and start time)."""
    return f"{pid}-{_start_time(pid) or 0}"


def owe(entries: tuple[SweepEntry, ...], after: After | None, since: int,
        owner: str | None = None, tag: str | None = None) -> str:
    """Write down the sweep of a run about to start; its record's path. ``owner``: the
    runtime that will sweep it (:func:`owner_of`; default: this process), ``tag``: the
    record's own part of its name (default: random). OSError when it cannot be written (no
    room), ValueError (a directory that is not the user's alone)."""
    import json

    from ...runtime_files import pending_directory
    where = pending_directory()
    if where is None:
        raise OSError(95, "no virtual environment to keep it in")
    if where not in _ready:
        _prepare(where)
    key = (entries, after)
    rest = _bodies.get(key)
    if rest is None:  # the same for every run while the protected names are (~30 us)
        rest = json.dumps({
            "sweep": [[p, list(t) if isinstance(t, tuple) else t, f] for p, t, f in entries],
            "after": None if after is None else {
                "roots": [[r, d, list(s)] for r, d, s in after.roots],
                "known": list(after.known), "allowed": list(after.allowed)},
        }).encode()[1:]
        if len(_bodies) >= 64:
            _bodies.clear()
        _bodies[key] = rest
    body = b'{"since": %d, ' % since + rest
    if tag is not None and not tag.isalnum():
        raise ValueError(f"a record's tag must be letters and digits, not {tag!r}")
    path = os.path.join(where, f"{owner or _me()}-{tag or os.urandom(6).hex()}{_SUFFIX}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except FileNotFoundError:  # removed since this process made it: made again
        _prepare(where)
        fd = os.open(path, flags, 0o600)
    try:
        if os.write(fd, body) != len(body):
            raise OSError(28, "short write", path)
    except BaseException:
        os.close(fd)
        paid(path)
        raise
    os.close(fd)
    return path


#: The record directories this process has made or checked to be the user's alone
#: (:func:`_prepare`): once, not before every run's record (16 us a run here).
_ready: set[str] = set()


def _prepare(where: str) -> None:
    """Make ``where`` (and its parent) if missing; ValueError when it is not a directory of
    this user's alone (runtime_files.make_private_directory)."""
    from ...runtime_files import make_private_directory
    _ready.discard(where)
    os.makedirs(os.path.dirname(where), 0o755, exist_ok=True)
    make_private_directory(where)
    _ready.add(where)


def paid(path: str) -> None:
    """The run's sweep is done (or the run never started): its record goes. One that
    cannot be removed (a read-only file system) stays: at worst a later lookup does its
    sweep again, moving aside what is at its names; never a traceback here."""
    try:
        os.unlink(path)
    except OSError:
        pass


def collect() -> dict[str, str]:
    """Do the sweep of every record whose runtime is gone, moving aside what it finds, and
    remove the record; each path acted on and what was done. Records of live runtimes are
    left to them. Never raises for what it finds (a record it cannot read is removed)."""
    from ...runtime_files import pending_directory, private_directory_problem
    where = pending_directory()
    if where is None:
        return {}
    try:
        names = os.listdir(where)
    except OSError:
        return {}  # none yet (the usual case), or not a directory of ours
    if private_directory_problem(where) is not None:
        return {}
    done: dict[str, str] = {}
    for name in names:
        owner, taken = _owner(name)
        if owner is None or _alive(owner):
            continue
        path = os.path.join(where, name)
        if taken is None:  # claim it: whoever renames it first sweeps it
            claimed = f"{path[:-len(_SUFFIX)]}{_TAKEN}{_me()}"
            try:
                os.rename(path, claimed)
            except OSError:
                continue
            path = claimed
        done.update(_settle(path))
    return done


def _owner(name: str) -> tuple[str | None, str | None]:
    """(the id of the runtime a record waits on, the collector's id when it was claimed):
    the writer's, or the collector's once claimed (a collector that died leaves it)."""
    if _TAKEN in name:
        base, taken = name.split(_TAKEN, 1)
        return taken, taken
    if not name.endswith(_SUFFIX):
        return None, None
    parts = name.split("-")
    return (f"{parts[0]}-{parts[1]}" if len(parts) == 3 else None), None


def _alive(owner: str) -> bool:
    pid, _, start = owner.partition("-")
    if not pid.isdigit():
        return True  # not a name of ours: left alone
    now = _start_time(int(pid))
    return now is not None and (now == start or start == "0")


def _entry(path: object, target: object, file_only: object) -> SweepEntry:
    """One sweep entry of a record, its types checked (ValueError): what :func:`owe`
    writes, and nothing else reaches the sweep."""
    if not isinstance(path, str) or not path.startswith("/") or not isinstance(file_only, bool):
        raise ValueError("a malformed entry")
    if isinstance(target, list) and len(target) == 2 \
            and all(isinstance(n, int) and not isinstance(n, bool) for n in target):
        return path, (target[0], target[1]), file_only
    if target is None or isinstance(target, str):
        return path, target, file_only
    raise ValueError("a malformed entry")


def _settle(path: str) -> dict[str, str]:
    import json
    try:
        with open(path, "rb") as f:
            record = json.loads(f.read())
        since = int(record["since"])
        entries = tuple(_entry(*e) for e in record["sweep"])
        a = record["after"]
        after = None if a is None else After(
            tuple((str(r), int(d), tuple(s)) for r, d, s in a["roots"]),
            tuple(a["known"]), tuple(a["allowed"]))
    except (OSError, ValueError, KeyError, TypeError):
        paid(path)  # cut short while it was written: before the command existed
        return {}
    # not the check of bound names: their bind held while the run lived, and since it died
    # the user's own git or editor may well have replaced one (a `git config` renames a
    # new .git/config over it), which that check would move aside
    done = sweep(tuple(e for e in entries if not isinstance(e[1], tuple)), since, aside=True)
    done.update(sweep_made(after, since, aside=True))
    paid(path)
    return done
