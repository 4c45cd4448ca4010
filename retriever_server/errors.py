"""The error a server reports when an index directory cannot be served (raised while building and
loading, by the index and by each kind's searcher)."""


class IndexLoadError(RuntimeError):
    """An index directory that cannot be served; the message says what is wrong and how to fix it."""
