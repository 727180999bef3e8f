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

    def update(self, done=None, detail=""):
        if not self.shown:
            return
        elapsed = time.perf_counter() - self.start
        count = "" if done is None else f" {done}" + ("" if self.total is None else f"/{self.total}")
        rate = f", {done / elapsed:.2f}/s" if done and elapsed > 0 else ""
        line = f"\r{self.label}:{count} [{elapsed:.1f} s{rate}] {detail}"
        print(f"{line:<79}", end="", file=self.stream, flush=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.shown:
            print(file=self.stream, flush=True)
