import os

# Qt tests run headless everywhere.
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import torch

# The tests run tiny models, where intra-op threads cost more than they give; one thread
# also keeps a 2-core CI machine from oversubscribing.
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    """Every test gets a kind by where it lives and what it uses (pyproject.toml's markers):
    `gui` (a Qt window or widget: it uses qtbot, or lives under tests/app/gui), `slow` and
    `real_model` as marked, and `unit` for the rest, so `-m unit` is the quick loop."""
    import pytest

    for item in items:
        path = str(item.path).replace(os.sep, "/")
        if "qtbot" in getattr(item, "fixturenames", ()) or "/tests/app/gui/" in path:
            item.add_marker(pytest.mark.gui)
        if not any(item.get_closest_marker(name) for name in ("gui", "slow", "real_model")):
            item.add_marker(pytest.mark.unit)
