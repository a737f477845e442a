"""Test-suite configuration: property tests draw the same examples on every run.

Hypothesis otherwise draws new examples each run, so a fresh clone (CI, a new user's first
``python -m pytest``) could fail on an example no earlier run met (a float32 tolerance met by
an unlucky draw). Derandomized, the examples are a function of each test's code; exploring
further is a local choice: ``python -m pytest --hypothesis-profile=explore``.
"""

from hypothesis import settings

settings.register_profile("deterministic", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile("deterministic")
