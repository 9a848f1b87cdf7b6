"""Moving bytes between a client and its upstream: bounded buffers with drain() back-pressure,
half-close, an idle timeout, and a graceful close within a second, else an abort."""
from __future__ import annotations

import asyncio
import concurrent.futures
import datetime
import errno
import ipaddress
import os
import socket
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable, Sequence, Union

from . import socks
from .hosts import Decision, EgressPolicy, HostError, format_host, parse_authority
from .httpwire import (HeadError, RequestHead, check_framing, host_header, origin_request,
                       parse_request_head, read_head, rewrite_response_head, simple_response,
                       split_absolute_url)


_CHUNK = 262144
_MAX_RESPONSE_HEAD = 65536  # origins' heads (cookies) can exceed what we accept from clients


async def _discard(reader: asyncio.StreamReader, limit: int) -> None:
    while limit > 0:
        data = await reader.read(min(limit, _CHUNK))
        if not data:
            return
        limit -= len(data)


async def _close(*writers: asyncio.StreamWriter) -> None:
    """Close gracefully (flushing what is buffered) within a second, else abort."""
    for writer in writers:
        writer.close()
    for writer in writers:
        try:
            await asyncio.wait_for(writer.wait_closed(), 1.0)
        except asyncio.CancelledError:
            _abort(writer)
            raise
        except Exception:  # noqa: BLE001 - reset, timeout: nothing more to do than abort
            _abort(writer)


def _abort_unless_closing(writer: asyncio.StreamWriter) -> None:
    if not writer.transport.is_closing():
        _abort(writer)


def _abort(writer: asyncio.StreamWriter) -> None:
    try:
        writer.transport.abort()
    except Exception:  # noqa: BLE001 - already closed
        pass
