"""Hand the heap's free pages back to the operating system after large answers (glibc's malloc_trim).

Large answers (a 16,384-query request, or dozens of 37 MB answers to clients that read slowly) raise
the server's live memory by tens of MB for seconds. Once they are sent, Python frees it, but glibc
keeps the freed pages for reuse, so the resident set stayed at its high-water mark (+100 MB after 32
unread answers, with under 2 MB still live: benchmarks/RESULTS.md, "Retriever under faults").
`malloc_trim` returns whole free pages. Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools


@functools.cache
def _malloc_trim():
    library = ctypes.util.find_library("c")
    trim = getattr(ctypes.CDLL(library), "malloc_trim", None) if library else None
    if trim is not None:
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


_trimming: asyncio.Future | None = None


def release_free_memory() -> None:
    """Trim the heap in a worker thread (ctypes lets go of the GIL), once however many answers end at once."""
    global _trimming
    trim = _malloc_trim()
    if trim is None or (_trimming is not None and not _trimming.done()):
        return
    _trimming = asyncio.get_running_loop().run_in_executor(None, trim, 0)
