"""The Hypothesis profiles of the fuzz suites (tests/test_fuzz_*.py), in one place.

``ci`` (the default): a bounded, derandomized number of examples, so CI is reproducible and
short; ``long`` (``HYPOTHESIS_PROFILE=long``): 10,000 examples per target. No example
database: a CI machine keeps nothing between runs.
"""
from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_COMMON = dict(deadline=None, database=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                      HealthCheck.filter_too_much])
settings.register_profile("ci", max_examples=200, derandomize=True, **_COMMON)
settings.register_profile("long", max_examples=10_000, **_COMMON)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
if PROFILE not in ("ci", "long"):
    PROFILE = "ci"
LONG = PROFILE == "long"


def fuzz(ci: int = 200, long: int = 10_000) -> settings:
    """The settings of one target: its example count under the chosen profile."""
    return settings(settings.get_profile(PROFILE), max_examples=long if LONG else ci)
