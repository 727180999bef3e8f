"""Exporting a PyTorch module with torch.onnx, planning the file and running it with poison on against
onnxruntime: what a user's first export meets (shared by the export tests)."""
import warnings

import numpy as np
import torch

import planner
from zoo_cases import run_on


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
