"""Stand-in for README's ``my_model.py:make``."""

from snippets import build_my_indexer


def make():
    return build_my_indexer()
