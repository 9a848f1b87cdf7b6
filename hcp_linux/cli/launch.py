"""The `hcp-linux` command's entry point: a served `run` (hcp_linux.cli.serve_client), else the CLI.

Python's start-up and the engine's imports cost `hcp-linux run` ~40 ms before the command
runs. With ``HCP_LINUX_SERVER`` set to the socket of a running ``hcp-linux serve``, `run`
asks that warm process for the plan instead (the policy, the bin, the environment, the mount
view, the confinement: compiled there, from this process's arguments, environment, cwd, umask
and signal state) and runs it *here*: hcp-exec is started by this process, so the sandbox
descends from the caller and inherits the caller's own confinement (its Landlock domain,
seccomp filters, cgroup, limits), never the server's. The server runs nothing.

Anything unexpected (no server, a server that is not this user's or lives in other
namespaces or under a confinement this process does not have, a policy file, a preset, a
config, a pack, ``--network allow``, a host without the layers the fast path needs) falls
back to the ordinary in-process run, which gives the same result. ``HCP_LINUX_SERVER=auto``
names the user's own server, which a run starts when there is none
(hcp_linux.cli.auto_server). This module and the client import only
what that path needs (no dataclasses, subprocess, argparse...): that is the point of them.
"""
from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing on the start-up path
if TYPE_CHECKING:
    from typing import Sequence


def entry() -> None:
    """The program (`hcp-linux`, `python -m hcp_linux`). A run, served or in-process, ends
    at once once it is over: Python's finalisation would cost a served run ~3 ms more than
    its own overhead (it imported next to nothing and started no thread), an in-process
    one 10 ms or more (hcp_linux.cli.cli.run_over says why that is safe)."""
    code = main()
    if _at_once:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except OSError:
                pass
        os._exit(code)
    sys.exit(code)


_at_once = False


def _configs(args: "list[str]") -> bool:
    """Whether this run reads a config (hcp_linux.cli.config): then it runs in-process, so
    that the configs are this process's, read under its own environment and checked against
    its own run, never the server's."""
    if "--no-config" in args[:args.index("--") if "--" in args else len(args)]:
        return False
    from .config import present
    return bool(present())


def main(argv: "Sequence[str] | None" = None) -> int:
    global _at_once
    from ..proc.stdio import fill_closed
    try:
        fill_closed()  # before any fd of ours: none may land where a command's stdio is taken
    except OSError as e:  # no /dev/null to open: fd 2 may be the closed one; say it if not
        try:
            os.write(2, f"error: sandbox: a standard fd (0, 1 or 2) is closed and /dev/null "
                        f"cannot be opened on it: {e.strerror}\n".encode())
        except OSError:
            pass
        return 125
    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        if getattr(sys, name) is None:  # closed at Python's start: /dev/null is there now
            setattr(sys, name, open(fd, "w" if fd else "r", closefd=False))
    # SIGCHLD ignored by our caller and inherited: the kernel would reap hcp-exec and a run
    # without a pid namespace would end with its status lost. Default, as coreutils'
    # timeout(1) sets it; the command then finds it at default too (hcp_client.c: the same).
    import _signal
    _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)
    args = list(sys.argv[1:] if argv is None else argv)
    # from the native client (hcp_linux/native/hcp_client.c), for this process alone: not
    # for the command's environment, nor a server's
    client = os.environ.pop(CLIENT_ENV, None)
    handover = os.environ.pop("HCP_LINUX_FINISH", None)
    unanswered = os.environ.pop("HCP_LINUX_UNANSWERED", None)
    if handover is not None:
        from . import serve_client
        code = serve_client.finish(int(handover) if handover.isdigit() else -1)
        if code is not None:
            _at_once = True
            return code
    server = os.environ.get("HCP_LINUX_SERVER")
    start_server = False
    if server and args[:1] == ["run"] and not _configs(args):
        from . import serve_client
        auto = server == "auto"  # the user's own server (hcp_linux.cli.auto_server)
        if auto:
            server = _auto_socket()
        try:
            if server is not None and unanswered is not None:  # the native client waited
                serve_client.unanswered(server, unanswered, auto)
                code = None
            else:
                code = None if server is None else serve_client.run_via_server(server, args,
                                                                              auto)
        except KeyboardInterrupt:  # as cli.main: nothing of the run is left by then
            from .interrupt import die_by
            die_by(2)
        if code is not None:
            if auto and client is not None:
                _name_client(client)
            _at_once = True
            return code
        start_server = auto and serve_client.absent
    from . import cli
    code = cli.main(args)
    _at_once = cli.run_over
    if start_server and cli.run_over:  # a run that ran (a refused one starts nothing)
        from .auto_server import start
        start()
        if client is not None:
            _name_client(client)
    return code


#: Set by the native client when it runs this program: its key (8 hex digits).
CLIENT_ENV = "HCP_LINUX_CLIENT"


def _name_client(key: str) -> None:
    """Tell the native client that ran this program which socket is the user's own server
    of this environment (hcp_linux.cli.auto_server.name_client)."""
    from .auto_server import name_client
    name_client(key)


def _auto_socket() -> "str | None":
    """The user's own server's socket, or None (with the line that says why) when its
    directory is not the user's alone."""
    from ..runtime_files import private_directory_problem
    from .auto_server import directory, socket_path
    why = private_directory_problem(directory())
    if why is None:
        return socket_path()
    from .serve_client import not_using
    not_using(f"HCP_LINUX_SERVER=auto ({directory()})", why)
    return None
