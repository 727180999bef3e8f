"""Plans in fp16 and bf16, and under autocast's policy: arenas, outputs against fp32 onnxruntime, the
casts the precision pass adds, and autocast training against torch.autocast."""
import numpy as np
import pytest

import planner
from executor import Executor
from planner import precision
from planner.dtypes import is_float
from zoo_cases import CASES, input_shapes, reference, rel_l2, small_model

TOLERANCE = {"fp16": 2e-2, "bf16": 6e-2, "amp-fp16": 2e-2, "amp-bf16": 6e-2}
"""Relative L2 error of the outputs against fp32 onnxruntime (the issue's targets)."""


def plan_and_run(case, chosen, batch=2):
    model, inputs, want = reference(case, batch)
    plan = planner.compile(model, {k: v.shape for k, v in inputs.items()}, precision=chosen)
    return plan, Executor(plan, backend="numpy", poison=True).run(inputs), want


@pytest.mark.parametrize("chosen", ["fp16", "bf16"])
@pytest.mark.parametrize("case", list(CASES))
def test_low_precision_halves_the_arena_and_keeps_the_outputs(case, chosen):
    fp32 = planner.compile(small_model(case), input_shapes(small_model(case), 2))
    plan, got, want = plan_and_run(case, chosen)
    if case != "mlp":  # its 4 KiB arena is mostly the 256-byte alignment of each buffer
        assert plan.arena_bytes <= 0.55 * fp32.arena_bytes
    for name in want:
        assert got[name].dtype == want[name].dtype, "outputs keep their declared type"
        assert rel_l2(got[name], want[name]) <= TOLERANCE[chosen], name
    low = precision.low_dtype(chosen)
    floats = [t for t in plan.tensors.values() if t.kind in ("param", "const") and is_float(t.dtype)]
    assert floats and all(np.dtype(t.dtype) == low for t in floats), "every float param is stored in the low type"


@pytest.mark.parametrize("chosen", ["amp-fp16", "amp-bf16"])
@pytest.mark.parametrize("case", ["resnet18", "densenet121", "bert_base", "gpt2_small", "unet"])
def test_autocast_runs_matrix_products_low_and_softmax_in_float32(case, chosen):
    plan, got, want = plan_and_run(case, chosen)
    low = precision.low_dtype(chosen)
    for name in want:
        assert rel_l2(got[name], want[name]) <= TOLERANCE[chosen], name
    for step in plan.steps:
        first = plan.tensors[step.inputs[0]] if step.inputs and step.inputs[0] else None
        if step.op in ("Conv", "MatMul", "Gemm") and first is not None:
            assert np.dtype(first.dtype) == low, f"{step.name} reads {first.dtype}"
        if step.op in ("Softmax", "LayerNormalization") and first is not None:
            assert np.dtype(first.dtype) == np.float32, f"{step.name} reads {first.dtype}"
    casts = [(s.inputs[0], plan.tensors[s.outputs[0]].dtype) for s in plan.steps if s.op == "Cast"]
    assert casts
    assert len(casts) == len(set(casts)), "one cast per tensor and type, shared by its readers"


def test_fp32_plans_are_unchanged():
    model = small_model("resnet18")
    shapes = input_shapes(model, 2)
    a, b = planner.compile(model, shapes), planner.compile(model, shapes, precision="fp32")
    assert a.arena_bytes == b.arena_bytes and [s.name for s in a.steps] == [s.name for s in b.steps]


def test_an_unknown_precision_is_refused():
    with pytest.raises(planner.PlanError, match="unknown precision 'fp8'"):
        planner.compile(small_model("mlp"), precision="fp8")


def test_masks_saturate_instead_of_becoming_infinite():
    """bert's additive mask holds float32's lowest value, which fp16 cannot: it becomes fp16's lowest."""
    plan, got, want = plan_and_run("bert_base", "fp16")
    assert all(np.isfinite(v).all() for v in got.values())


@pytest.mark.torch
@pytest.mark.parametrize("case", ["mlp", "lenet", "resnet18"])
def test_amp_bf16_training_follows_torch_autocast(case):
    """Ten SGD steps on one batch, the loss per step within 1e-2 of torch.autocast("cpu", bfloat16). A small
    learning rate keeps the descent steady: a ReLU input within bfloat16 rounding of zero takes the other
    side now and then in either run, moving that unit's whole gradient (5% of a layer's, measured), and at
    lr 3e-3 such flips compound to 2-3% within ten steps, in torch against its own float32 run too."""
    torch = pytest.importorskip("torch")
    from frontends.torch_module import to_torch
    from test_training import BATCH, batch_of
    model = small_model(case)
    feeds, labels = batch_of(model, BATCH)
    plan = planner.compile(model, input_shapes(model, BATCH), training=True, optimizer="sgd",
                           optimizer_args={"lr": 0.001}, precision="amp-bf16")
    ex = Executor(plan, backend="numpy", poison=True)
    ours = [ex.train_step({**feeds, "labels": labels}) for _ in range(10)]
    module = to_torch(model, input_shapes(model, BATCH)).train()
    opt = torch.optim.SGD(list(module.graph_parameters().values()), lr=0.001)
    theirs = []
    for _ in range(10):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = module(**feeds)[module.graph.outputs[0]]
        loss = torch.nn.functional.cross_entropy(logits.float(), torch.as_tensor(labels))
        loss.backward()
        opt.step()
        theirs.append(loss.item())
    assert theirs[-1] < theirs[0] and ours[-1] < ours[0]
    np.testing.assert_allclose(ours, theirs, rtol=1e-2)
