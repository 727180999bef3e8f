"""Exporting a PyTorch module with torch.onnx, planning the file and running it with poison on against
onnxruntime: what a user's first export meets (shared by the export tests)."""
import copy
import warnings

import numpy as np
import onnx
import torch
from onnx import numpy_helper

import planner
from executor import Executor
from executor.torch_module import torch_optimizer
from zoo_cases import rel_l2, run_on


class Output(torch.nn.Module):
    """One output (`field`) of a transformers model called with its inputs by name (and `fixed` keywords),
    so that the export takes plain tensors."""

    def __init__(self, model, names, field, **fixed):
        super().__init__()
        self.model, self.names, self.field, self.fixed = model, names, field, fixed

    def forward(self, *inputs):
        return getattr(self.model(**dict(zip(self.names, inputs)), **self.fixed), self.field)


def runs_like_onnxruntime(module, path, dynamo, backend="numpy", **inputs):
    """Export `module` on `inputs` by the dynamo or the TorchScript exporter, plan the file and run it on
    `backend` with poison on; its output matches onnxruntime's (rtol 1e-4). Returns the plan."""
    import onnxruntime as ort
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), tuple(inputs.values()), str(path), input_names=list(inputs),
                          output_names=["out"], dynamo=dynamo, **({} if dynamo else {"opset_version": 17}))
    feeds = {name: value.numpy() for name, value in inputs.items()}
    plan = planner.compile(str(path), {name: value.shape for name, value in feeds.items()})
    got = run_on(backend, plan, feeds)["out"]
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(got, session.run(None, feeds)[0], rtol=1e-4, atol=1e-5)
    return plan


def stored_params(module, model):
    """{parameter name: (initializer name, stored transposed, added constant)} of the module exported as `model`:
    each nn.Parameter found among the initializers as it is, transposed, or plus one (Gemma's RMSNorm scales by
    1 + weight, which the dynamo exporter folds); a parameter the export does not hold (unused, or folded with
    constant inputs) is left out, one held twice fails."""
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    found = {}
    for name, p in module.named_parameters():
        value = p.detach().numpy()
        forms = [(False, 0, value), (False, 1, value + 1), *([(True, 0, value.T)] if value.ndim == 2 else [])]
        hits = [(n, t, c) for n, a in inits.items() for t, c, v in forms if a.shape == v.shape and np.array_equal(a, v)]
        assert len(hits) <= 1, f"{name} is stored {len(hits)} times among the initializers"
        found.update({name: hits[0]} if hits else {})
    return found


def folded_buffers(path, found):
    """The float initializers of more than one element that no nn.Parameter was exported as."""
    stored = {n for n, _, _ in found.values()}
    return sorted(i.name for i in onnx.load(str(path)).graph.initializer if i.name not in stored
                  and i.data_type == onnx.TensorProto.FLOAT and np.prod(i.dims) > 1)


def trains_like_pytorch(module, path, ids, vocab, backend="numpy", steps=3, lr=0.1, rtol=1e-4, **options):
    """Train a causal or masked LM exported at `path` (input_ids -> logits) by memplan on `backend` for `steps` SGD
    steps with poison on, and `module` (in eval mode: no dropout) beside it, training the parameters the export
    holds: the losses and every trained parameter agree. The labels are the next tokens, a few ignored. Returns
    memplan's plan."""
    found = stored_params(module, onnx.load(str(path)))
    ids = np.asarray(ids)
    labels = np.concatenate([ids[:, 1:], np.full((ids.shape[0], 1), -100)], axis=1)
    labels[0, :2] = -100
    plan = planner.compile(str(path), {"input_ids": ids.shape}, training=True, loss="cross_entropy", optimizer="sgd",
                           optimizer_args={"lr": lr}, frozen=folded_buffers(path, found), **options)
    ex = Executor(plan, backend=backend, poison=True)
    ours = [ex.train_step({"input_ids": ids, "labels": labels}) for _ in range(steps)]
    module = copy.deepcopy(module).eval()
    for name, p in module.named_parameters():
        p.requires_grad_(name in found)  # one the export folded with constants (DeBERTa's position projections)
    opt = torch_optimizer("sgd", [p for p in module.parameters() if p.requires_grad], {"lr": lr})
    theirs = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(module(torch.as_tensor(ids)).reshape(-1, vocab),
                                                 torch.as_tensor(labels).reshape(-1), ignore_index=-100)
        loss.backward()
        opt.step()
        theirs.append(loss.item())
    np.testing.assert_allclose(ours, theirs, rtol=rtol)
    assert theirs[-1] < theirs[0] - 100 * rtol * theirs[0], "the steps hardly moved the loss"
    trained = ex.parameters()
    for name, p in module.named_parameters():
        if name not in found:
            continue
        stored, transposed, added = found[name]
        value = p.detach().numpy()
        assert rel_l2(trained[stored] - added, value.T if transposed else value) < rtol, name
    return plan
