"""Time of planner.load (reading + static-shape inference + folding) on gpt2_small and a long synthetic chain.

    python benchmarks/load_time.py [--repeat 5] [--chain 50000]
"""
import argparse
import platform
import time

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import planner
from frontends import zoo


def chain(n):
    """An n-node chain alternating Relu and Add(bias), with the batch dim dynamic."""
    nodes, prev = [], "x"
    for i in range(n):
        out = "y" if i == n - 1 else f"t{i}"
        nodes.append(helper.make_node("Relu", [prev], [out]) if i % 2 == 0 else helper.make_node("Add", [prev, "b"], [out]))
        prev = out
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])],
                              [numpy_helper.from_array(np.zeros(64, np.float32), "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def best_of(repeat, fn):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), float(np.median(times)), result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--chain", type=int, default=50_000)
    args = parser.parse_args()
    cases = [("gpt2_small (12 layers, seq 128)", lambda: zoo.build("gpt2_small"),
              {"input_ids": (8, 128)}),
             (f"synthetic chain ({args.chain:,} nodes)", lambda: chain(args.chain), {"x": (8, 64)})]
    print(f"machine: {platform.processor() or platform.machine()}, python {platform.python_version()}")
    print(f"{'model':<34} {'build s':>8} {'nodes in':>9} {'nodes out':>9} {'load min s':>11} {'load median s':>14}")
    for name, build, shapes in cases:
        start = time.perf_counter()
        model = build()
        built = time.perf_counter() - start
        best, median, graph = best_of(args.repeat, lambda: planner.load(model, shapes))
        print(f"{name:<34} {built:>8.2f} {len(model.graph.node):>9,} {len(graph.nodes):>9,} {best:>11.3f} {median:>14.3f}")


if __name__ == "__main__":
    main()
