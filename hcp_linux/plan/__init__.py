"""A Policy and a command compiled into a Plan in the parent, where everything that may fail
fails (plan): the mount view from the policy's roots and the host's paths (confinement) and the
kernel rulesets, Landlock and seccomp (rulesets).

May import: :mod:`hcp_linux.policy`, :mod:`hcp_linux.observe`, :mod:`hcp_linux.host`,
:mod:`hcp_linux.egress`, the ground modules (errors, protocol, _libc), ``hcp_linux.landlock``
and ``hcp_linux.seccomp_profiles``; never the run or an executor.
"""
