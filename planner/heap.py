"""Freed memory handed back to the operating system. glibc keeps the pages of freed allocations in its heap
for reuse (every allocation below its mmap threshold, which rises to 32 MiB as large blocks are freed), so
a process that planned a model (its weights converted, folded, copied) holds them long after: for resnet50,
its peak RSS rise through an Executor's runs was about 100 MiB higher. `trim` asks glibc to return them."""
import ctypes
import sys
from functools import cache


@cache
def _glibc():
    """glibc's handle where it is the C library, else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") else None


def trim():
    """Return the heap's free pages to the operating system (glibc's malloc_trim); nothing elsewhere."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
