"""Training steps planned and run by memplan against the same model trained by PyTorch: to_torch's copy
of the graph with F.cross_entropy (or F.mse_loss) and torch.optim's SGD or Adam, from the same initial
weights, both in float32, each taking STEPS steps on one fixed batch.

"Agree" means within 1e-4 relative: per step |ours - torch| / |torch| for the loss, and per param tensor
||ours - torch|| / ||torch|| in the 2-norm (norm-wise: an elementwise ratio means nothing for values near
zero). The settings keep float32 rounding (measured against a float64 run of the torch copy) near 1e-6:
one batch learnt by steady descent (on fresh random batches, small-batch BatchNormalization and ReLU
boundaries make the run chaotic, and rounding grows to 1e-2 within 20 steps), and an Adam eps large
enough that gradients at rounding level are not blown up to full-size steps (which also makes the test
sensitive to where eps sits in the update). A ReLU input within rounding of zero still takes opposite
sides now and then, moving one unit's gradient: in 64 seeded runs of lenet and resnet18 with these
settings that reached 4e-5.
"""
import numpy as np
import pytest

import planner
from executor import Executor
from zoo_cases import input_shapes, rel_l2, small_model

torch = pytest.importorskip("torch")
from executor.torch_module import LOSSES, to_torch, torch_optimizer  # noqa: E402  (needs torch)

pytestmark = pytest.mark.torch
STEPS, BATCH, RTOL = 20, 8, 1e-4
OPTIMIZERS = {  # test id: (optimizer, optimizer_args)
    "sgd": ("sgd", {"lr": 0.003, "weight_decay": 0.01}),
    "momentum": ("momentum", {"lr": 0.003, "momentum": 0.9, "weight_decay": 0.01, "nesterov": False}),
    "nesterov": ("momentum", {"lr": 0.003, "momentum": 0.9, "weight_decay": 0.01, "nesterov": True}),
    "adam": ("adam", {"lr": 3e-4, "betas": (0.9, 0.99), "eps": 1e-3, "weight_decay": 0.01}),
}


def batch_of(model, batch, seed=0):
    """Feeds of standard normal inputs, and random class labels."""
    rng = np.random.default_rng(seed)
    classes = model.graph.output[0].type.tensor_type.shape.dim[1].dim_value
    feeds = {n: rng.standard_normal(s, dtype=np.float32) for n, s in input_shapes(model, batch).items()}
    return feeds, rng.integers(0, classes, batch)


def train_memplan(model, batch, data, loss="cross_entropy", optimizer="sgd", args=None):
    """Losses per step and the final params of memplan's training plan on `data`; and the initial params."""
    plan = planner.compile(model, input_shapes(model, batch), training=True, loss=loss, optimizer=optimizer,
                           optimizer_args=args)
    ex = Executor(plan, backend="numpy", poison=True)
    start = ex.parameters()
    target = "labels" if loss == "cross_entropy" else "targets"
    losses = [ex.train_step({**feeds, target: y}) for feeds, y in data]
    return losses, ex.parameters(), start


def train_torch(model, batch, data, loss="cross_entropy", optimizer="sgd", args=None):
    """The same with to_torch's copy and torch.optim: losses per step, final params, initial params."""
    module = to_torch(model, input_shapes(model, batch)).train()
    params = module.graph_parameters()
    start = {name: p.detach().numpy().copy() for name, p in params.items()}
    opt = torch_optimizer(optimizer, list(params.values()), args)
    losses = []
    for feeds, y in data:
        opt.zero_grad()
        value = LOSSES[loss](module(**feeds)[module.graph.outputs[0]], torch.as_tensor(y))
        value.backward()
        opt.step()
        losses.append(value.item())
    return losses, {name: p.detach().numpy() for name, p in params.items()}, start


def assert_same_training(ours, theirs):
    (losses, params, start), (torch_losses, torch_params, torch_start) = ours, theirs
    assert set(start) == set(torch_start), "memplan and to_torch train different params"
    for name in start:
        assert np.array_equal(start[name], torch_start[name]), f"{name} starts from other weights"
    for step, (a, b) in enumerate(zip(losses, torch_losses)):
        assert abs(a - b) <= RTOL * abs(b), f"step {step}: loss {a} vs torch {b}"
    worst = max(params, key=lambda n: rel_l2(params[n], torch_params[n]))
    assert rel_l2(params[worst], torch_params[worst]) < RTOL, \
        f"{worst}: {rel_l2(params[worst], torch_params[worst]):.2e} from torch after {len(losses)} steps"
    assert any(rel_l2(params[n], start[n]) > 100 * RTOL for n in params), "training hardly moved the params"


@pytest.mark.parametrize("setting", OPTIMIZERS)
@pytest.mark.parametrize("case", ["mlp", "lenet", "resnet18"])
def test_training_matches_torch(case, setting):
    optimizer, args = OPTIMIZERS[setting]
    model = small_model(case)
    data = [batch_of(model, BATCH)] * STEPS
    assert_same_training(train_memplan(model, BATCH, data, "cross_entropy", optimizer, args),
                         train_torch(model, BATCH, data, "cross_entropy", optimizer, args))


def regression(batch, seed=0):
    """The mlp case's inputs and targets from a fixed random linear map (of the mlp's output width)."""
    model = small_model("mlp")
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(input_shapes(model, batch)["input"], dtype=np.float32)
    w = (rng.standard_normal((x.shape[1], 5)) / np.sqrt(x.shape[1])).astype(np.float32)
    return model, x, w


def test_mse_training_matches_torch():
    model, x, w = regression(4)
    data = [({"input": x}, x @ w)] * STEPS
    optimizer, args = OPTIMIZERS["adam"]
    assert_same_training(train_memplan(model, 4, data, "mse", optimizer, args),
                         train_torch(model, 4, data, "mse", optimizer, args))


@pytest.mark.parametrize("loss", ["cross_entropy", "mse"])
def test_loss_decreases_on_a_learnable_task(loss):
    """The mlp fits a fixed batch labelled by a linear map: classes by its argmax, or its values."""
    model, x, w = regression(16)
    y = np.argmax(x @ w, axis=1) if loss == "cross_entropy" else x @ w
    losses, _, _ = train_memplan(model, 16, [({"input": x}, y)] * 30, loss, "momentum",
                                 {"lr": 0.05, "momentum": 0.9})
    assert np.all(np.isfinite(losses))
    assert losses[-1] < losses[0] / 2, losses
