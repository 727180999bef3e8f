"""Where a run's time goes: each step's kernel timed (the device synchronised after it), summed per op
type and listed for the slowest steps. `memplan run --profile` prints it; `Executor(plan, profile=True)`
keeps one in `executor.profile`."""
import statistics
import time
from collections import defaultdict

from planner.ir import op_name
from planner.units import format_bytes


class Profile:
    """The seconds of each timed step of `plan`, one entry per run that called it."""

    def __init__(self, plan, synchronize):
        self.plan, self.synchronize = plan, synchronize
        self.seconds = defaultdict(list)

    def timed(self, k, fn):
        """`fn`, a bound kernel of step `k`, that also records how long it took to finish."""
        def call(*args):
            start = time.perf_counter()
            fn(*args)
            self.synchronize()
            self.seconds[k].append(time.perf_counter() - start)
        return call

    def clear(self):
        """Forget what was recorded (the warm-up run)."""
        self.seconds.clear()

    def per_step(self):
        """{step index: median seconds over the recorded runs}."""
        return {k: statistics.median(times) for k, times in self.seconds.items()}

    def table(self, top=10):
        """Time per op type (steps, milliseconds per run, share of the kernels' time), then the `top` slowest
        steps with their output shapes: a text table."""
        per_step = self.per_step()
        total = sum(per_step.values()) or 1.0
        by_type = defaultdict(lambda: [0, 0.0])
        for k, seconds in per_step.items():
            entry = by_type[op_name(self.plan.steps[k].domain, self.plan.steps[k].op)]
            entry[0] += 1
            entry[1] += seconds
        lines = [f"kernels: {1e3 * total:.2f} ms per run over {len(per_step)} steps (median of each step)",
                 f"{'op type':<32} {'steps':>6} {'ms':>9} {'share':>6}"]
        for op, (count, seconds) in sorted(by_type.items(), key=lambda item: -item[1][1]):
            lines.append(f"{op:<32} {count:>6} {1e3 * seconds:>9.3f} {100 * seconds / total:>5.1f}%")
        lines += ["", f"the {min(top, len(per_step))} slowest steps:",
                  f"{'step':>5} {'op':<24} {'ms':>9} {'share':>6}  output"]
        for k, seconds in sorted(per_step.items(), key=lambda item: -item[1])[:top]:
            step = self.plan.steps[k]
            out = next((self.plan.tensors[o] for o in step.outputs if o), None)
            shape = f"{'x'.join(map(str, out.shape)) or 'scalar'} {out.dtype} ({format_bytes(out.nbytes)})" if out else ""
            lines.append(f"{k:>5} {op_name(step.domain, step.op):<24} {1e3 * seconds:>9.3f} "
                         f"{100 * seconds / total:>5.1f}%  {step.name} -> {shape}")
        return "\n".join(lines)
