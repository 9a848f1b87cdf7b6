import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

IS_ROOT = os.geteuid() == 0


def pytest_collection_modifyitems(config, items):
    if IS_ROOT:
        return
    skip = pytest.mark.skip(reason="needs root on the host")
    for item in items:
        if "root_only" in item.keywords:
            item.add_marker(skip)
