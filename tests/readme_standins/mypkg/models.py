"""Stand-in for README's ``mypkg.models:build_layer``."""

from snippets import build_my_indexer


def build_layer():
    return build_my_indexer()
