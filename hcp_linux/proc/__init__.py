"""The processes of a run, from the parent's side, for either executor and the served client:
the lasting thread every process is started from (spawner), hcp-exec started from a memfd
(hcp_spawn), a run's end whatever its helpers do (teardown), and what another process is, read
from the kernel (peer).

May import: nothing of the package (the standard library only).
"""
