"""The live schedule test uses the fault tests' fleet (an `astraeus server` the test kills and restarts)."""

from tests.faults.conftest import fleet  # noqa: F401
