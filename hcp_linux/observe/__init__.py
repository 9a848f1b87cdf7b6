"""What the kernel says about a run: its audit netlink interface (audit), a run's Landlock
denials read from the audit records (landlock_log), and the receipt's ``denials`` layer by
layer (denials).

May import: :mod:`hcp_linux.egress` (routes), ``hcp_linux.landlock``,
``hcp_linux.seccomp_profiles``; never the policy, the plan or the run.
"""
