def parse_duration(text):
    """Return the number of seconds in a duration such as ``'1h30m'``.

    The units are ``d`` (days), ``h`` (hours), ``m`` (minutes) and ``s``
    (seconds); a bare number is a number of seconds.  An interactive
    session shows how it behaves:

    >>> parse_duration('45')
    45
    >>> parse_duration('2m')
    120
    >>> parse_duration('1h30m')
    5400
    >>> parse_duration('1d')
    86400
    >>> parse_duration('1d2h')
    93600
    >>> parse_duration('')
    Traceback (most recent call last):
      ...
    ValueError: empty duration
    >>> parse_duration('3x')
    Traceback (most recent call last):
      ...
    ValueError: unknown unit 'x'
    >>> parse_duration('1h1m1s')
