"""Progress of a long command, tqdm-style: one line on a terminal's stderr, rewritten in place; nothing
when stderr is not a terminal (the command prints its own summary line either way)."""
import sys
import time


class Progress:
    """`with Progress("run", total=10) as bar: bar.update(k, "loss 2.3")` shows 'run: 3/10 [1.2 s, 2.5/s] loss 2.3'."""

    def __init__(self, label, total=None, stream=None):
        self.label, self.total = label, total
        self.stream = stream or sys.stderr
        self.shown = self.stream.isatty()
        self.start = time.perf_counter()
        self.width = 79
        """The widest line shown, which each later one pads to so that it covers it."""

    def update(self, done=None, detail=""):
        if not self.shown:
            return
        elapsed = time.perf_counter() - self.start
        count = "" if done is None else f" {done}" + ("" if self.total is None else f"/{self.total}")
        rate = f", {done / elapsed:.2f}/s" if done and elapsed > 0 else ""
        line = f"{self.label}:{count} [{elapsed:.1f} s{rate}] {detail}"
        self.width = max(self.width, len(line))
        print(f"\r{line:<{self.width}}", end="", file=self.stream, flush=True)

    def __enter__(self):
        return self

    def __exit__(self, kind, *exc):
        """End the line; on Ctrl-C wipe it, so that the command's last word is its one line on the interrupt."""
        if self.shown:
            wipe = f"\r{'':<{self.width}}\r"
            print(wipe if kind is KeyboardInterrupt else "\n", end="", file=self.stream, flush=True)
