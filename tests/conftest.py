import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

IS_ROOT = os.geteuid() == 0

# A developer's own config (~/.config/hcp-linux/policy.toml, /etc/hcp-linux/policy.toml) must
# not change what the suite's runs are: no test reads one unless it says so (tests/test_config.py
# gives its runs an environment of their own). Inherited by every CLI the suite starts.
os.environ["HCP_LINUX_NO_CONFIG"] = "1"


def pytest_addoption(parser):
    parser.addoption("--executor", choices=("auto", "native", "ctypes"), default="auto",
                     help="hcp-linux executor for this run: the process default of the API, "
                          "and --executor on every `hcp-linux run` built by sandboxing.hcp_argv "
                          "(auto: native when built, else ctypes)")


def pytest_configure(config):
    name = config.getoption("--executor")
    from hcp_linux import native
    native.set_default(name)
    if name == "native" and native.binary() is None:
        raise pytest.UsageError("--executor native: not built (python -m hcp_linux.native.build)")
    if name != "auto":
        import sandboxing
        sandboxing.EXECUTOR_ARGS[:] = ["--executor", name]


def pytest_collection_modifyitems(config, items):
    if IS_ROOT:
        return
    skip = pytest.mark.skip(reason="needs root on the host")
    for item in items:
        if "root_only" in item.keywords:
            item.add_marker(skip)
