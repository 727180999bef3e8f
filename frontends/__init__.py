"""Frontends: every way a model comes in ends as a planner.ir.Graph."""


def read(model, weights=True, training=False, step=None):
    """An ONNX path or ModelProto, a Symbol, "zoo:NAME", a transformers config (a config.json or "hf:<model id>",
    exported in train mode for a `training` step, or with a cache for a generation `step` (tokens, length):
    frontends.hf_config), or a Graph -> Graph (dims not bound yet); with `weights` False, an ONNX model's external
    data is not read (its weights planned as absent)."""
    from planner.ir import Graph
    from . import hf_config, onnx_frontend
    if isinstance(model, Graph):
        return model
    if hf_config.is_config(model):
        return onnx_frontend.read(hf_config.exported(model, training, step=step), weights)
    if isinstance(model, str) and model.startswith("zoo:"):
        from . import zoo
        model = zoo.build(model[len("zoo:"):])
    from .symbol import Symbol
    if isinstance(model, Symbol):
        return model.to_graph()
    return onnx_frontend.read(model, weights)
