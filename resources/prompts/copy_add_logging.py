import logging

logger = logging.getLogger(__name__)


class Cache:
    def __init__(self, maxsize=128):
        self.maxsize = maxsize
        self.data = {}

    def get(self, key, default=None):
        if key in self.data:
            return self.data[key]
        return default

    def set(self, key, value):
        if len(self.data) >= self.maxsize:
            self.data.pop(next(iter(self.data)))
        self.data[key] = value

    def delete(self, key):
        if key in self.data:
            del self.data[key]


class LoggingCache:
    """The same cache, logging every operation."""

    def __init__(self, maxsize=128):
        self.maxsize = maxsize
        self.data = {}

    def get(self, key, default=None):
        logger.debug("get %r", key)
        if key in self.data:
