"""Allow-listed network egress for `--network allow`: host patterns, the policy, the proxy.

The sandbox runs in a private network namespace with only ``lo``; the one way out is the proxy
served here, outside the sandbox, on a listening socket created inside it. See `hosts` for the
pattern syntax and port rule, `addresses` for what counts as non-public, `proxy` for the server,
`capture` for the resolver and the capture that serve tools ignoring the proxy variables.
"""
from __future__ import annotations

from .addresses import Special, classify
from .hostnames import parse_authority, parse_host
from .hosts import DEFAULT_PORTS, Decision, EgressPolicy, Pattern, parse_pattern, system_resolver
from .proxy import EgressProxy
from .thread import ProxyThread, proxy_env

__all__ = ["DEFAULT_PORTS", "Decision", "EgressPolicy", "EgressProxy", "Pattern", "ProxyThread",
           "Special", "classify", "parse_authority", "parse_host", "parse_pattern", "proxy_env",
           "system_resolver"]
