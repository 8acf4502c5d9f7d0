"""`flakecheck conformance`: which invariance a server keeps, one axis at a time, and its noise profile.

    from flakecheck.probe.conformance import ConformanceConfig, conformance_check
    result = conformance_check(ConformanceConfig("http://127.0.0.1:8000", expect="invariant"))
    result.exit_code   # 1 when an expected axis does not hold
"""

from flakecheck.probe.conformance.noise import ServerNoise
from flakecheck.probe.conformance.pipeline import (
    ConformanceFailed,
    ConformanceInterrupted,
    ConformanceResult,
    conformance_check,
)
from flakecheck.probe.conformance.settings import ConformanceConfig

__all__ = ["ConformanceConfig", "ConformanceFailed", "ConformanceInterrupted", "ConformanceResult", "ServerNoise",
           "conformance_check"]
