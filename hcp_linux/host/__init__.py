"""Where hcp-linux runs: the environment read from the marks each leaves (hostenv), and the
change that brings a missing layer back there (remedies, with the files under ``share/``).

May import: nothing of the package.
"""
