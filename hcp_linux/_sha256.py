"""SHA-256 without hashlib: hashlib loads OpenSSL's libcrypto (~3 ms) to get a hash that
the interpreter also has built in (``_sha256`` up to 3.11, ``_sha2`` from 3.12), and every
`hcp-linux run` hashes its policy and its seccomp programs' cache keys. The same digest."""
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # the same type as hashlib's
    from hashlib import sha256
else:
    try:
        from _sha256 import sha256
    except ImportError:  # pragma: no cover - Python 3.12+
        try:
            from _sha2 import sha256
        except ImportError:  # an interpreter built without its own: OpenSSL's
            from hashlib import sha256

__all__ = ["sha256"]
