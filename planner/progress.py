"""Progress of a long command, tqdm-style: one line on a terminal's stderr, rewritten in place; nothing
when stderr is not a terminal (the command prints its own summary line either way). A search inside the
command (sublinear recomputation's) tells `show`, which writes on the command's open line, so that a
command draws one line however many searches and worker processes it runs."""
import contextvars
import sys
import time

CURRENT = contextvars.ContextVar("memplan_progress", default=None)
"""The line open now (a Progress, or a worker's stand-in that sends to its parent), which `show` writes on."""


class Progress:
    """`with Progress("run", total=10) as bar: bar.update(k, "loss 2.3")` shows 'run: 3/10 [1.2 s, 2.5/s] loss 2.3'."""

    def __init__(self, label, total=None, stream=None):
        self.label, self.total = label, total
        self.stream = stream or sys.stderr
        self.shown = self.stream.isatty()
        self.start = time.perf_counter()
        self.done, self.detail, self.inner = None, "", ""
        self.width = 79
        """The widest line shown, which each later one pads to so that it covers it."""
        self._token = None

    def update(self, done=None, detail=""):
        """Show `done` of the total, and `detail` in place of the one before (and of an inner search's)."""
        self.done, self.detail, self.inner = done, detail, ""
        self._draw()

    def show(self, text):
        """An inner search's state, after the detail; "" clears it."""
        self.inner = text
        self._draw()

    def _draw(self):
        if not self.shown:
            return
        elapsed = time.perf_counter() - self.start
        done = self.done
        count = "" if done is None else f" {done}" + ("" if self.total is None else f"/{self.total}")
        rate = f", {done / elapsed:.2f}/s" if done and elapsed > 0 else ""
        line = f"{self.label}:{count} [{elapsed:.1f} s{rate}] {self.detail}"
        line += f" ({self.inner})" if self.inner else ""
        self.width = max(self.width, len(line))
        print(f"\r{line:<{self.width}}", end="", file=self.stream, flush=True)

    def __enter__(self):
        self._token = CURRENT.set(self)
        return self

    def __exit__(self, kind, *exc):
        """End the line; on Ctrl-C wipe it, so that the command's last word is its one line on the interrupt."""
        CURRENT.reset(self._token)
        if self.shown:
            wipe = f"\r{'':<{self.width}}\r"
            print(wipe if kind is KeyboardInterrupt else "\n", end="", file=self.stream, flush=True)


def note(text):
    """A line of its own on stderr, while a command runs: above the command's progress line where one is drawn
    (drawn again below it)."""
    line = CURRENT.get()
    if line is not None and line.shown:
        print(f"\r{text:<{line.width}}", file=line.stream, flush=True)
        line._draw()
    else:
        print(text, file=sys.stderr, flush=True)


def show(label, done, total=None):
    """An inner search's progress, 'LABEL done/total': on the open line where a command has one, else on a line
    of its own on a terminal's stderr (ended once done reaches total)."""
    text = f"{label} {done}" + ("" if total is None else f"/{total}")
    line = CURRENT.get()
    if line is not None:
        line.show("" if done == total else text)
    elif sys.stderr.isatty():
        print(f"\rmemplan: {text}", end="\n" if done == total else "", file=sys.stderr, flush=True)
