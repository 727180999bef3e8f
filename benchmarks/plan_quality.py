"""Plan quality over the zoo: the transient arena (inputs, outputs, activations, workspace; params
excluded) each strategy needs, against LOAD, other planners re-implemented on the same intervals
(TFLite greedy-by-size, TFLite Micro first fit, XLA best of two orders, TVM USMP greedy_by_size,
ONNX Runtime exact-size reuse) and onnx-tool's compress_memory(); then compile times for gpt2_small
and a 50,000-node chain.

    python benchmarks/plan_quality.py [--batches 1 32] [--models resnet50 ...] [--optimal-seconds 10]
    python benchmarks/plan_quality.py --defaults [--held-out DIR] [--batches 1 8 32] [--train-batch 8]

--defaults compares the default plan (strategy and workspace mode "auto") with the former default
(bestfit, pooled workspace): each plan's transient arena against its own LOAD, for every zoo model and,
with --held-out, for torchvision's convnext_tiny, vit_b_16 and densenet121 exported (without weights) into
DIR on the first run, inference at --batches and a training step at --train-batch, and the geometric means.
onnx-tool is optional (pip install onnx-tool); its column is left empty without it.
"""
import argparse
import math
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

import planner
from frontends import zoo
from planner import allocators
from planner.compiler import STRATEGIES

sys.path.insert(0, str(Path(__file__).parent))
from load_time import chain  # noqa: E402

MiB = 2 ** 20
HELD_OUT = ("convnext_tiny", "vit_b_16", "densenet121")
"""torchvision models the planner was not tuned on."""
SEQ = 128
ONNX_TOOL_PADDING = 64
"""onnx-tool rounds tensors to 64 bytes, memplan to 256; the comparison uses onnx-tool's rounding."""


def shapes(name, batch):
    if name == "bert_base":
        return {"input_ids": (batch, SEQ), "attention_mask": (batch, SEQ)}
    if name == "gpt2_small":
        return {"input_ids": (batch, SEQ)}
    return None


def transient(plan):
    """(arena, LOAD) of the plan's transient region: what params and pooled workspace leave out."""
    base = plan.stats["persistent_bytes"]
    return plan.arena_bytes - base, plan.lower_bound_bytes - base


def buffers(plan):
    """(sizes, starts, ends) of the transient buffers the plan placed."""
    spans = plan.buffer_spans()
    return [plan.tensors[r].nbytes for r in spans], [s for s, _ in spans.values()], [e for _, e in spans.values()]


def arena_of(name, plan, alignment=256):
    """The transient arena allocator `name` gives the plan's own buffers, at `alignment`."""
    return allocators.allocate(name, *buffers(plan), alignment=alignment)[1]


def onnx_tool_bytes(model, input_shapes):
    """onnx-tool's compress_memory() of the same model and shapes, or None without onnx-tool."""
    try:
        import onnx_tool
    except ImportError:
        return None
    m = onnx_tool.Model(model)
    feeds = {n: np.zeros(s, np.int64 if "input_ids" in n or "mask" in n else np.float32) for n, s in input_shapes.items()}
    m.graph.shape_infer(feeds)
    return int(m.graph.compress_memory()[1])


BASELINES = {"tflite": "greedy_by_size", "tfl-micro": "first_fit", "xla": "xla", "tvm-usmp": "usmp",
             "ort": "exact_reuse"}
"""Other planners re-implemented in planner/allocators (column: allocator), run on bestfit's own buffers."""


def quality(names, batches, optimal_seconds):
    print(f"{'model':<13} {'batch':>5} {'LOAD':>9} " + " ".join(f"{s:>9}" for s in (*STRATEGIES, "share*")) +
          "".join(f" {b:>9}" for b in BASELINES) +
          f" {'bf@64':>9} {'onnx-tool':>9} {'bf/LOAD':>8} {'bf s':>6}   (MiB; share* = auto match range)")
    ratios, worse_than_greedy, worse_than_tool = [], [], []
    over_load = {b: [] for b in ("bestfit", "share", *BASELINES)}
    config = planner.Config(time_limit=optimal_seconds)
    keep = {"inverted_residual": False}  # MobileNetV2's blocks as exported: the allocators meet onnx-tool's buffers
    for name in names:
        for batch in batches:
            model = zoo.build(name)
            graph = planner.load(model, shapes(name, batch) or {"input": (batch, *_image(model))})
            row = {}
            for strategy in STRATEGIES:
                start = time.perf_counter()
                row[strategy] = planner.compile(graph, strategy=strategy, config=config, **keep)
                row[strategy].stats["seconds"] = time.perf_counter() - start
            row["share*"] = planner.compile(graph, strategy="share", config=replace(config, auto_search_match_range=True),
                                            **keep)
            best = row["bestfit"]
            arena, load = transient(best)
            others = {b: arena_of(a, best) for b, a in BASELINES.items()}
            greedy = others["tflite"]
            for b, value in (("bestfit", arena), ("share", transient(row["share"])[0]), *others.items()):
                over_load[b].append(value / load)
            tool = onnx_tool_bytes(model, {n: graph.tensors[n].shape for n in graph.inputs})
            padded = arena_of("bestfit", best, ONNX_TOOL_PADDING)
            ratios.append(arena / load)
            if arena > greedy:
                worse_than_greedy.append(f"{name}@{batch}")
            if tool is not None and padded > tool:
                worse_than_tool.append(f"{name}@{batch}")
            cells = " ".join(f"{transient(row[s])[0] / MiB:>9.1f}" for s in (*STRATEGIES, "share*"))
            print(f"{name:<13} {batch:>5} {load / MiB:>9.1f} {cells}"
                  + "".join(f" {v / MiB:>9.1f}" for v in others.values()) + f" {padded / MiB:>9.1f} "
                  f"{'' if tool is None else f'{tool / MiB:9.1f}':>9} {arena / load:>8.3f} "
                  f"{best.stats['seconds']:>6.2f}")
    print(f"bestfit / LOAD, geometric mean over {len(ratios)} plans: "
          f"{math.exp(sum(map(math.log, ratios)) / len(ratios)):.4f}")
    print("arena / LOAD, geometric mean: " + ", ".join(
        f"{b} {math.exp(sum(map(math.log, r)) / len(r)):.4f}" for b, r in over_load.items()))
    print(f"bestfit above TFLite greedy-by-size: {', '.join(worse_than_greedy) or 'never'}")
    print(f"bestfit at onnx-tool's {ONNX_TOOL_PADDING}-byte padding above onnx-tool: {', '.join(worse_than_tool) or 'never'}")


def _image(model):
    return tuple(d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim[1:])


def held_out(directory):
    """{name: path} of the HELD_OUT models exported into `directory` (by PyTorch's TorchScript exporter, a dynamic
    batch), exporting those not there yet."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    found = {name: directory / f"{name}.onnx" for name in HELD_OUT}
    for name, path in found.items():
        if not path.exists():
            import warnings

            import torch
            import torchvision
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = getattr(torchvision.models, name)(weights=None).eval()
                torch.onnx.export(model, (torch.randn(1, 3, 224, 224),), str(path), input_names=["input"],
                                  output_names=["out"], opset_version=17,
                                  dynamic_axes={"input": {0: "batch"}, "out": {0: "batch"}}, dynamo=False)
    return {name: str(path) for name, path in found.items()}


def defaults(models, batches, train_batch):
    """The arena, and its transient part over LOAD's, of the former default (bestfit, pooled workspace) and of the
    default (auto, auto) for each model's inference at `batches` and training step at `train_batch`, with
    planning seconds."""
    before = {"strategy": "bestfit", "config": planner.Config(workspace_mode="pool")}
    print(f"{'model':<14} {'step':<9} {'bestfit MiB':>11} {'x LOAD':>7} {'auto MiB':>9} {'x LOAD':>7} "
          f"{'bestfit s':>9} {'auto s':>7}  auto's placement")
    ratios = {"bestfit": [], "auto": []}
    for name, model in models.items():
        for batch, training in [(b, False) for b in batches] + [(train_batch, True)] * (train_batch > 0):
            inputs = shapes_of(name, model, batch)
            plans, took = {}, {}
            try:
                for label, options in (("bestfit", before), ("auto", {})):
                    start = time.perf_counter()
                    plans[label] = planner.compile(model, inputs, training=training, **options)
                    took[label] = time.perf_counter() - start
            except planner.MemplanError as e:
                print(f"{name:<14} {'train' if training else 'infer'}@{batch:<3} left out: {e}"[:160])
                continue
            cells = []
            for label in ("bestfit", "auto"):
                arena, load = transient(plans[label])
                ratios[label].append(arena / load if load else 1.0)
                cells.append(f"{plans[label].arena_bytes / MiB:>{11 if label == 'bestfit' else 9}.1f} "
                             f"{ratios[label][-1]:>7.4f}")
            proof = plans["auto"].stats.get("allocator_proof", {})
            print(f"{name:<14} {'train' if training else 'infer'}@{batch:<3} {' '.join(cells)} {took['bestfit']:>9.2f} "
                  f"{took['auto']:>7.2f}  {proof.get('by')}, workspace {plans['auto'].stats['workspace']['mode']}")
    for label, values in ratios.items():
        print(f"{label}: transient arena / LOAD, geometric mean over {len(values)} plans: "
              f"{math.exp(sum(map(math.log, values)) / len(values)):.4f}")


def shapes_of(name, model, batch):
    """The input shapes of a zoo model (a ModelProto) or an exported image model (a path) at `batch`."""
    if isinstance(model, str):
        return {"input": (batch, 3, 224, 224)}
    return shapes(name, batch) or {"input": (batch, *_image(model))}


def compile_times(chain_nodes):
    print(f"\n{'compile of an ONNX model (bestfit, auto)':<40} {'nodes':>7} {'seconds':>8}")
    for label, model, input_shapes in (("gpt2_small batch 8, seq 128", zoo.build("gpt2_small"), {"input_ids": (8, SEQ)}),
                                       (f"chain of {chain_nodes:,} nodes", chain(chain_nodes), {"x": (8, 64)})):
        start = time.perf_counter()
        plan = planner.compile(model, input_shapes)
        print(f"{label:<40} {len(plan.steps):>7,} {time.perf_counter() - start:>8.2f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(zoo.NAMES))
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 32])
    parser.add_argument("--optimal-seconds", type=float, default=10.0)
    parser.add_argument("--chain", type=int, default=50_000)
    parser.add_argument("--defaults", action="store_true", help="the default plan against the former default")
    parser.add_argument("--held-out", metavar="DIR", help="with --defaults: also torchvision's models, exported here")
    parser.add_argument("--train-batch", type=int, default=8, help="with --defaults: training at this batch (0: none)")
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, python {platform.python_version()}")
    if args.defaults:
        models = {name: zoo.build(name) for name in args.models}
        defaults({**models, **(held_out(args.held_out) if args.held_out else {})}, args.batches, args.train_batch)
        return
    quality(args.models, args.batches, args.optimal_seconds)
    compile_times(args.chain)


if __name__ == "__main__":
    main()
