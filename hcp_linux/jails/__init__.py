"""The directories runs use: where they live (locations), a pack's workspace of each mode
(workspace), files read and written inside a jail by descriptor (jailfiles), who owns what a
dead runtime left (reclaim), and ``hcp-linux gc`` (gc).

May import: :mod:`hcp_linux.errors` and :mod:`hcp_linux.policy`.
"""
