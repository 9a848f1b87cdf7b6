"""The package's version, the one place it is written (pyproject.toml reads it here): a leaf
module, so that what reports it (the CLI's --version, the conformance report) need not import
the package's public names."""
__version__ = "0.1.0"
