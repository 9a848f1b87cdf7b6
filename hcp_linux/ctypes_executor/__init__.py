"""The ctypes executor, the fallback when hcp-exec is not built: the child side of a run in
Python (child: its steps, then execve), run in a fork of the runtime or in a fresh helper
interpreter started with ``-I -S`` (child_main: both the parent's start and the helper's main).

May import: :mod:`hcp_linux.proc`, the ground modules (errors, protocol, _libc),
``hcp_linux.landlock``, ``hcp_linux.seccomp_profiles``, and the plan's types. The helper
imports this package without site: keep this file free of imports.
"""
