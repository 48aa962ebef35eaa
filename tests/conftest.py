import os

# Qt tests run headless everywhere.
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
