"""The trace-store commands' tests (test_traces.py) read the stores tests/storage records:
its session fixtures, shared here rather than recorded twice."""

from tests.storage.conftest import make_decoder, models, recorded  # noqa: F401 - fixtures, found by name
