"""Running an `EgressProxy` on an event loop of its own, in a daemon thread, and the proxy
variables a child is given to reach it."""
from __future__ import annotations

import asyncio
import socket
import threading
from typing import Sequence, Union

from .hosts import EgressPolicy
from .proxy import EgressProxy, LogFn

__all__ = ["ProxyThread", "proxy_env"]


class ProxyThread:
    """Run an `EgressProxy` on its own event loop in a daemon thread.

    ``start()`` returns once the proxy accepts connections; ``stop()`` closes the listening
    socket(s) and every connection, and joins the thread. Usable as a context manager.
    """

    def __init__(self, policy: EgressPolicy,
                 listening_sock: Union[socket.socket, Sequence[socket.socket]], *,
                 log: LogFn | None = None, captured: Sequence[socket.socket] = (),
                 resolver: socket.socket | None = None, **options: float) -> None:
        self._socks = ([listening_sock] if isinstance(listening_sock, socket.socket)
                       else list(listening_sock))
        self._captured, self._resolver = tuple(captured), resolver
        self.proxy = EgressProxy(policy, log=log, **options)  # type: ignore[arg-type]
        self._thread = threading.Thread(target=self._run, name="hcp-egress-proxy", daemon=True)
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._error: BaseException | None = None

    def start(self, timeout: float = 10.0) -> ProxyThread:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError("egress proxy did not start")
        if self._error is not None:
            raise self._error
        return self

    def stop(self, timeout: float = 10.0) -> None:
        loop, task = self._loop, self._task
        if loop is not None and task is not None:
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # the loop already closed
                pass
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self._thread.is_alive():
            raise RuntimeError("egress proxy thread did not stop")

    def __enter__(self) -> ProxyThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            self._task = loop.create_task(self.proxy.serve(*self._socks, ready=self._ready.set,
                                                             captured=self._captured,
                                                             resolver=self._resolver))
            loop.run_until_complete(self._task)
        except asyncio.CancelledError:
            pass
        except BaseException as exc:  # noqa: BLE001 - re-raised by start()
            self._error = exc
        finally:
            self._ready.set()
            try:
                _cancel_leftovers(loop)
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()


def _cancel_leftovers(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel whatever serve() left running, as asyncio.run does, and turn the loop once more
    so that transports' scheduled closes run before the loop is closed."""
    tasks = asyncio.all_tasks(loop)
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    loop.run_until_complete(asyncio.sleep(0))


def proxy_env(port: int = 3128, host: str = "127.0.0.1") -> dict[str, str]:
    """The child's proxy variables, upper and lower case, all pointing at one port.

    HTTP(S)_PROXY use HTTP (CONNECT for https); ALL_PROXY uses ``socks5h`` so that names
    resolve at the proxy -- the sandbox has no resolver. NO_PROXY keeps the sandbox's own
    loopback (a private ``lo``) direct.
    """
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    values = {"HTTP_PROXY": f"http://{authority}", "HTTPS_PROXY": f"http://{authority}",
              "ALL_PROXY": f"socks5h://{authority}", "NO_PROXY": "localhost,127.0.0.1,::1"}
    env = dict(values)
    env.update({k.lower(): v for k, v in values.items()})
    return env
