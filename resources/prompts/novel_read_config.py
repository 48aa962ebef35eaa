import os


def read_config(path, defaults=None):
    """Read a simple ``key = value`` configuration file.

    Blank lines and lines starting with ``#`` are ignored.  Values are
    stripped of surrounding whitespace.  Keys missing from the file are
    taken from *defaults*.  Return a new dictionary.
    """
    result = dict(defaults or {})
    if not os.path.exists(path):
