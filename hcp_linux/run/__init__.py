"""The parent side of a run, either executor: the spawn (executor: the plan handed to hcp-exec
or the ctypes executor, the child's setup awaited), the process handed back (process), the
subprocess-shaped arguments (popen), and the enforcement receipt (receipt).

May import: :mod:`hcp_linux.native`, :mod:`hcp_linux.ctypes_executor`, :mod:`hcp_linux.proc`,
:mod:`hcp_linux.plan` and everything below it; never the public faces (sandbox, probe,
session), the driver or the CLI.
"""
