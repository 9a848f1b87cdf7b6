"""What a caller asks for, as checked values: a :class:`~hcp_linux.policy.policy.Policy` and
its parts (limits, unix sockets, protected names, the environment, the fallback ladder), how
each field is said on the command line (policy_flags), which binaries a request may run
(allowlist), every single input value's check (values), a pack's manifest (pack), the
shipped presets (presets), how a policy's layers compose (layers), the srt and Codex
importers (imports) and the TOML they are printed as (toml_text).

May import: :mod:`hcp_linux.errors` and :mod:`hcp_linux.egress` (host patterns), nothing else
of the package: a Policy is made and checked before anything runs.
"""
