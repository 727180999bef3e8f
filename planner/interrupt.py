"""Ctrl-C in the memplan command: one line on stderr, exit status 130, no traceback, and no worker process left
running. Only the command's own process takes the interrupt: a process forked from it (fit's workers, a search's
pool) ignores it, prints nothing, and is ended by the command as it stops."""
import multiprocessing
import os
import signal
import sys
import threading

INTERRUPTED = 130
"""The exit status of a command stopped by SIGINT, as shells report one (128 + 2)."""

_pending = threading.Event()
"""Set by the command's SIGINT handler: the KeyboardInterrupt it raises is swallowed where it lands in a finalizer
or a weakref callback ("Exception ignored in ..."), and the command must still stop."""


def check():
    """Raise KeyboardInterrupt if Ctrl-C reached the command and was swallowed on the way (before a file is made
    final, and as the command returns)."""
    if _pending.is_set():
        raise KeyboardInterrupt


def interruptible(command):
    """`command()`'s exit status, or INTERRUPTED once Ctrl-C has stopped it and its workers. SIGINT stays ignored
    where it was (a background job), and a handler other than Python's, or off the main thread, is left alone."""
    ours = threading.current_thread() is threading.main_thread() and \
        signal.getsignal(signal.SIGINT) is signal.default_int_handler
    if ours:
        parent = os.getpid()

        def handler(signum, frame):
            if os.getpid() == parent:
                _pending.set()
                raise KeyboardInterrupt

        previous = signal.signal(signal.SIGINT, handler)
    try:
        status = command()
        check()
        return status
    except KeyboardInterrupt:
        if ours:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C does not cut the cleanup short
        end_children()
        print("memplan: interrupted", file=sys.stderr)
        return INTERRUPTED
    finally:
        if ours:
            signal.signal(signal.SIGINT, previous)
        _pending.clear()


def end_children(wait=2.0):
    """Terminate the worker processes this process started (multiprocessing's) that are still running, and kill
    those that have not ended after `wait` seconds."""
    children = multiprocessing.active_children()
    for child in children:
        child.terminate()
    for child in children:
        child.join(wait)
        if child.is_alive():
            child.kill()
            child.join()
