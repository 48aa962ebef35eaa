from collections import OrderedDict


class LRUCache:
    """A mapping that keeps at most *maxsize* items.

    When a new item is added to a full cache, the least recently used
    item is discarded.
    """

    def __init__(self, maxsize=128):
