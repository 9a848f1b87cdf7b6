"""What the parent (the plan) and both executors (hcp-exec and the ctypes child) agree on.

A name here is read on both sides of the fork: the plan compiles it into what the child is
told to do, and the child acts on it. Keeping it in one module below both lets either side
change without the other importing it.
"""
from __future__ import annotations

#: A file the child creates at the root of the new mount view, which no Landlock rule grants:
#: its last check before execve is that it can no longer read it (Landlock is in force).
CANARY = "/.hcp-canary"
#: Where the egress proxy listens inside the sandbox's own network namespace.
PROXY_ADDRESS = ("127.0.0.1", 3128)

__all__ = ["CANARY", "PROXY_ADDRESS"]
