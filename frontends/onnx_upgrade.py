"""A model of an older opset -> the same model at a newer one, through onnx's version converter, with what the
converter drops put back and what it gets wrong mended or refused."""
import re

import numpy as np
from google.protobuf.message import Message
from onnx import (AttributeProto, TensorProto, ValueInfoProto, defs, external_data_helper, helper, numpy_helper,
                  version_converter)

from planner.errors import ModelError

OLDEST = 7
"""The oldest opset upgraded: opset 7 gave ONNX's arithmetic NumPy's broadcasting (before it, attributes said
how), and the classic models of the ONNX model zoo (resnet50-v1-7, mobilenetv2-7) are of it."""
LOSSY = {("Scan", 8): "opset 8's Scan loops over a batch axis that opset 9's lacks, and onnx's version converter "
                      "drops that axis"}
"""(op, version) the converter upgrades into something else: refused."""
PLACEHOLDER = "memplan-upgrade-placeholder"
"""Where the initializers the converter is given say their data is: nowhere (upgrade)."""
RESIZED = ("Upsample", "Resize")
"""Ops that become opset 11's Resize, whose default coordinates (half_pixel) are not theirs (asymmetric)."""


def upgrade(model, opset, target):
    """The model, of default-domain opset `opset`, converted to `target`, with its declared types and metadata
    (memplan's hints) as they were. Its top-level initializers are PLACEHOLDERs of the same names, types and dims,
    saying their data is elsewhere: the caller reads the model's own, so that the weights are never copied."""
    _refuse_lossy(model.graph, opset)
    try:
        converted = version_converter.convert_version(_skeleton(model), target)
    except (version_converter.ConvertError, RuntimeError, ValueError) as e:
        raise ModelError(_culprit(model.graph, opset, target) or _reason(e)) from None
    _carry(model.graph, converted.graph, {t.name: t for t in model.graph.initializer})
    return converted


def _refuse_lossy(graph, opset):
    for node in _nodes(graph):
        if node.domain in ("", "ai.onnx") and defs.has(node.op_type, opset):
            why = LOSSY.get((node.op_type, defs.get_schema(node.op_type, opset).since_version))
            if why:
                raise ModelError(f"node {_label(node)!r} ({node.op_type}): {why}")


def _nodes(graph):
    """Every node of the graph and of its subgraphs."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == AttributeProto.GRAPH:
                yield from _nodes(attr.g)


def _skeleton(model):
    """A copy of the model whose top-level initializers hold no values (they say their data is elsewhere): no
    upgrade adapter reads them, so the converter need not copy the weights."""
    light = _copy(model, "graph")
    light.graph.CopyFrom(_copy(model.graph, "initializer"))
    for t in model.graph.initializer:
        placeholder = light.graph.initializer.add(name=t.name, dims=t.dims, data_type=t.data_type,
                                                  data_location=TensorProto.EXTERNAL)
        placeholder.external_data.add(key="location", value=PLACEHOLDER)
    return light


def _copy(message, skipped):
    """A copy of a protobuf message without its field `skipped`."""
    out = type(message)()
    for field, value in message.ListFields():
        if field.name == skipped:
            continue
        if isinstance(value, Message):
            getattr(out, field.name).CopyFrom(value)
        elif isinstance(value, (bool, int, float, str, bytes)):
            setattr(out, field.name, value)
        else:  # a repeated field
            getattr(out, field.name).extend(value)
    return out


def _culprit(graph, opset, target):
    """'node NAME (OP): why' for the first default-domain node the converter fails on alone, or None."""
    for node in graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        alone = helper.make_graph([node], "alone", [ValueInfoProto(name=i) for i in node.input if i],
                                  [ValueInfoProto(name=o) for o in node.output if o])
        try:
            version_converter.convert_version(helper.make_model(alone, opset_imports=[helper.make_opsetid("", opset)]),
                                              target)
        except (version_converter.ConvertError, RuntimeError, ValueError) as e:
            why = _reason(e) if defs.has(node.op_type, opset) else f"not an ONNX op of opset {opset}"
            return f"node {_label(node)!r} ({node.op_type}): {why}"
    return None


def _label(node):
    return node.name or next((o for o in node.output if o), node.op_type)


def _reason(error):
    """The converter's message without its source location and assertion text."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return re.sub(r"^.*?Assertion `.*?` failed: ", "", text)


def _carry(old, new, constants):
    """Put back in `new` (the converter's copy of graph `old`) the declared types and metadata it drops, node
    names it loses, and the coordinates of the Resize nodes made from Upsample and Resize of opset 10 (whose
    scales are looked up in `constants`, the values of the graphs around, and in the graph's own)."""
    if [v.name for v in old.input] != [v.name for v in new.input] or \
            [v.name for v in old.output] != [v.name for v in new.output]:
        raise ModelError("onnx's version converter changes the graph's inputs or outputs")
    for field in ("input", "output", "value_info", "metadata_props"):
        del getattr(new, field)[:]
        getattr(new, field).extend(getattr(old, field))
    constants = {**{t.name: t for t in new.initializer}, **constants,
                 **{n.output[0]: n.attribute[0] for n in new.node if n.op_type == "Constant" and len(n.attribute) == 1}}
    before = {tuple(n.output): n for n in old.node}
    for node in new.node:
        was = before.get(tuple(node.output))
        if was is None:
            continue
        node.name = node.name or was.name
        del node.metadata_props[:]
        node.metadata_props.extend(was.metadata_props)
        if node.op_type == "Resize" and was.op_type in RESIZED:
            _asymmetric(node, was, constants)
        subgraphs = {a.name: a.g for a in was.attribute if a.type == AttributeProto.GRAPH}
        for attr in node.attribute:
            if attr.type == AttributeProto.GRAPH and attr.name in subgraphs:
                _carry(subgraphs[attr.name], attr.g, constants)


def _asymmetric(node, was, constants):
    """Upsample and opset 10's Resize sample at x / scale (asymmetric), as opset 11's Resize says it; nearest
    rounds that down where it upsamples and up where it downsamples (onnxruntime's rule), which opset 11 says for
    all axes at once, so the scales must be constants that all go one way (Upsample's do, by its spec)."""
    where = f"node {_label(was)!r} ({was.op_type})"
    mode = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "mode"), b"nearest")
    if mode not in (b"nearest", b"linear"):
        raise ModelError(f"{where}: mode {mode.decode(errors='replace')!r} is not nearest or linear")
    node.attribute.append(helper.make_attribute("coordinate_transformation_mode", "asymmetric"))
    if mode != b"nearest":
        return
    scales = _value(constants.get(node.input[2] if len(node.input) > 2 else ""))
    if scales is None and was.op_type == "Upsample":
        scales = np.ones(1)
    rounds = f"{where}: nearest sampling rounds down where it upsamples and up where it downsamples"
    if scales is None:
        raise ModelError(f"{rounds}; its scales are computed, so opset 11's Resize cannot be told which")
    if (scales < 1).any() and (scales > 1).any():
        raise ModelError(f"{rounds}, and its scales {scales.tolist()} do both, which opset 11's Resize cannot say")
    node.attribute.append(helper.make_attribute("nearest_mode", "ceil" if (scales < 1).any() else "floor"))


def _value(found):
    """The values of an initializer or a Constant node's attribute, or None."""
    if isinstance(found, TensorProto):
        return None if external_data_helper.uses_external_data(found) else numpy_helper.to_array(found)
    if found is not None and found.name in ("value", "value_floats"):
        return np.asarray(helper.get_attribute_value(found) if found.name == "value_floats"
                          else numpy_helper.to_array(found.t))
    return None
