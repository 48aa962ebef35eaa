import re

_word_re = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def split_words(text, lower=False):
    """Return the list of identifiers found in *text*.

    If *lower* is true, the words are converted to lower case.
    """
