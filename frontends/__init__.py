"""Frontends: every way a model comes in ends as a planner.ir.Graph."""


def read(model):
    """An ONNX path or ModelProto, a Symbol, "zoo:NAME", or a Graph -> Graph (dims not bound yet)."""
    from planner.ir import Graph
    from . import onnx_frontend
    if isinstance(model, Graph):
        return model
    if isinstance(model, str) and model.startswith("zoo:"):
        from . import zoo
        model = zoo.build(model[len("zoo:"):])
    from .symbol import Symbol
    if isinstance(model, Symbol):
        return model.to_graph()
    return onnx_frontend.read(model)
