"""Settings for the whole suite.

Hypothesis times each example (200 ms by default) and checks that generating data is not too
slow; on a busy machine (CI runs beside other work) either fails a correct test by chance.
What a property test proves does not depend on how fast an example ran, so neither applies
here. Tests that want a bound of their own still set it with ``@settings``.
"""

from hypothesis import HealthCheck, settings

# The real-model tier's llama-server: defined here once, so that the session starts one
# whichever modules ask for it (imported into each module, each would start its own).
from real_model_server import llama  # noqa: F401

settings.register_profile("segue", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("segue")
