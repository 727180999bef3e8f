"""benchmarks/hf_step_memory.py's measure of PyTorch's training-step memory on the CPU: the bytes alive before a
step plus the highest running sum of the profiler's allocations and frees during it."""
import json
import sys
from pathlib import Path

import pytest

from hf_configs import CONFIGS

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = pytest.mark.torch
sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))  # benchmarks/ is not a package
import hf_step_memory as bench  # noqa: E402

MiB = 2 ** 20


def test_the_peak_is_the_highest_running_sum_not_the_bytes_allocated():
    """1 MiB and 2 MiB alive together, both freed, then 1 MiB more: 3 MiB over the 1 MiB kept, not the 4 MiB
    allocated."""
    kept = torch.ones(MiB, dtype=torch.uint8)

    def step():
        first, second = torch.ones(MiB, dtype=torch.uint8), torch.ones(2 * MiB, dtype=torch.uint8)
        del first, second
        torch.ones(MiB, dtype=torch.uint8)

    peak, before = bench.profiled_peak(step, lambda: kept.nbytes)
    assert (before, peak) == (MiB, 4 * MiB)


def test_a_training_step_holds_the_states_before_it_and_every_gradient_in_it(tmp_path):
    """Before the step: float32 params and AdamW's two moments (and its step counts, buffers, ids and labels);
    during it, at least all the gradients, which opt.step() reads together."""
    path = tmp_path / "gpt2.json"
    path.write_text(json.dumps(CONFIGS["gpt2"]))
    step, resident, params = bench.torch_step(str(path), 2, 16, "fp32")
    peak, before = bench.profiled_peak(step, resident)
    assert 12 * params <= before < 12 * params + MiB
    assert peak - before >= 4 * params
