"""Property tests over hostile input: valid models mutated (inputs dropped, duplicated, swapped or
renamed, attributes and dims drawn at random, op types exchanged, files truncated) and CLI argument
lists drawn from the commands' flags. Each must end in success or one MemplanError subclass, never
another exception, within a memory cap and a time cap. Each example runs in a forked child, so that
the caps (resource.setrlimit, alarm) and any crash stay there."""
import os
import sys

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import planner
from graphs import random_dag
from isolation import isolated
from zoo_cases import input_shapes, small_model

EXAMPLES = settings(derandomize=True, max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def plan_and_run(model_bytes, shapes):
    """Plan the model (from bytes: a truncated file must fail cleanly) and, when it plans small, run it."""
    import tempfile
    from executor import Executor, random_feeds
    with tempfile.NamedTemporaryFile(suffix=".onnx", delete=False) as f:
        f.write(model_bytes)
    try:
        plan = planner.compile(f.name, shapes)
    finally:
        os.unlink(f.name)
    if plan.arena_bytes <= 64 << 20:
        Executor(plan, backend="numpy", poison=True).run(random_feeds(plan))
    return plan.arena_bytes


def seeds():
    """Valid models to mutate, with the shapes that bind them."""
    out = []
    for case in ("mlp", "lenet", "resnet18", "mobilenet_v2", "bert_base", "gpt2_small", "unet_resize"):
        m = small_model(case)
        out.append((m, input_shapes(m, 2)))
    rng = np.random.default_rng(0)
    out.append((random_dag(lambda lo, hi: int(rng.integers(lo, hi + 1)), 12), None))
    return out


SEEDS = seeds()
OPS = sorted({n.op_type for m, _ in SEEDS for n in m.graph.node})
VALUES = st.one_of(st.integers(-3, 8), st.sampled_from([0, -1, 2**31, 2**40, -2**62]))


def mutate(data, model):
    """A copy of `model` with one to three mutations drawn from `data`."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    nodes = m.graph.node
    names = [t for n in nodes for t in n.output] + [i.name for i in m.graph.input] + \
        [i.name for i in m.graph.initializer]
    for _ in range(data.draw(st.integers(1, 3))):
        node = nodes[data.draw(st.integers(0, len(nodes) - 1))]
        kind = data.draw(st.sampled_from(["drop", "duplicate", "swap", "rename", "attribute", "op", "output",
                                          "dims", "dtype"]))
        inputs = list(node.input)
        if kind == "drop" and inputs:
            del inputs[data.draw(st.integers(0, len(inputs) - 1))]
        elif kind == "duplicate" and inputs:
            inputs.append(inputs[data.draw(st.integers(0, len(inputs) - 1))])
        elif kind == "swap" and len(inputs) > 1:
            inputs.reverse()
        elif kind == "rename" and inputs:
            inputs[data.draw(st.integers(0, len(inputs) - 1))] = data.draw(st.sampled_from(names))
        elif kind == "attribute" and node.attribute:
            _redraw(data, node.attribute[data.draw(st.integers(0, len(node.attribute) - 1))])
        elif kind == "op":
            node.op_type = data.draw(st.sampled_from(OPS))
        elif kind == "output":
            node.output.append(f"extra{len(node.output)}")
        elif kind == "dims":
            dims = m.graph.input[0].type.tensor_type.shape.dim
            if len(dims):
                dims[data.draw(st.integers(0, len(dims) - 1))].dim_value = data.draw(VALUES)
        elif kind == "dtype":
            m.graph.input[0].type.tensor_type.elem_type = data.draw(st.sampled_from([1, 2, 6, 7, 9, 10, 11, 16]))
        del node.input[:]
        node.input.extend(inputs)
    return m


def _redraw(data, attr):
    """Give an attribute a value drawn at random, of its own type."""
    if attr.type == onnx.AttributeProto.INT:
        attr.i = data.draw(VALUES)
    elif attr.type == onnx.AttributeProto.INTS:
        attr.ints[:] = data.draw(st.lists(VALUES, max_size=6))
    elif attr.type == onnx.AttributeProto.FLOAT:
        attr.f = data.draw(st.sampled_from([0.0, -1.0, 1e30, float("nan"), float("inf")]))
    elif attr.type == onnx.AttributeProto.STRING:
        attr.s = data.draw(st.sampled_from([b"", b"NOTSET", b"SAME_UPPER", b"bogus"]))


def check(outcome):
    kind, detail = outcome
    assert kind in ("ok", "error"), detail


@EXAMPLES
@given(st.data())
def test_mutated_models_plan_run_or_fail_cleanly(data):
    model, shapes = SEEDS[data.draw(st.integers(0, len(SEEDS) - 1))]
    mutated = mutate(data, model)
    check(isolated(plan_and_run, mutated.SerializeToString(), shapes))


@EXAMPLES
@given(st.data())
def test_truncated_files_fail_cleanly(data):
    model, shapes = SEEDS[data.draw(st.integers(0, len(SEEDS) - 1))]
    raw = model.SerializeToString()
    cut = raw[:data.draw(st.integers(0, len(raw) - 1))]
    check(isolated(plan_and_run, cut, shapes))


COMMANDS = ["inspect", "report", "plan", "viz", "max-batch", "run"]
FLAGS = {"--input": st.sampled_from(["input:2x784", "input:0x784", "input:2x3", "nope:1", "input:", "input:99999999999x784"]),
         "--batch": st.sampled_from(["1", "0", "-3", "x", "99999999999"]),
         "--training": None, "--loss": st.sampled_from(["mse", "cross_entropy", "hinge"]),
         "--optimizer": st.sampled_from(["adam", "sgd", "lion"]), "--lr": st.sampled_from(["0.1", "-1", "nan", "abc"]),
         "--remat": st.sampled_from(["mirror", "budget", "optimal", "x"]),
         "--budget": st.sampled_from(["1KiB", "2GiB", "0", "-5", "1e9", "lots"]),
         "--strategy": st.sampled_from(["naive", "bestfit", "optimal", "magic"]),
         "--schedule": st.sampled_from(["file", "memory", "never"]),
         "--workspace-mode": st.sampled_from(["pool", "tensor", "none"]),
         "--repeat": st.sampled_from(["1", "0", "-1"]), "--top": st.sampled_from(["0", "3", "-2"]),
         "--time-limit": st.sampled_from(["0.2", "0", "inf"]), "--json": None, "--csv": None}


def cli_argv(data, tmp):
    argv = [data.draw(st.sampled_from(COMMANDS)), data.draw(st.sampled_from(["zoo:mlp", "zoo:none", "missing.onnx"]))]
    for flag in data.draw(st.lists(st.sampled_from(sorted(FLAGS)), max_size=4)):
        argv += [flag] if FLAGS[flag] is None else [flag, data.draw(FLAGS[flag])]
    if argv[0] in ("plan", "viz") or data.draw(st.booleans()):
        argv += ["-o", os.path.join(tmp, data.draw(st.sampled_from(["out.json", "t.svg", "missing/x.json", ""])))]
    return argv


def run_cli(argv):
    from planner import cli
    try:
        return cli.main(argv)
    except SystemExit as e:
        return e.code


@EXAMPLES
@given(st.data())
def test_cli_arguments_exit_0_or_2(tmp_path_factory, data):
    tmp = str(tmp_path_factory.mktemp("cli"))
    argv = cli_argv(data, tmp)
    kind, detail = isolated(run_cli, argv)
    assert kind == "ok" and detail in (0, 2), (argv, detail)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
