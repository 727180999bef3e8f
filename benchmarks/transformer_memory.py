"""Activation memory of a GPT-2 small training step: memplan's plans against PyTorch with SDPA attention.

    python benchmarks/transformer_memory.py [--seqs 512 1024 2048] [--explain 12] [--device cpu|cuda|none]

The model: transformers' GPT2LMHeadModel from GPT2Config() defaults (n_positions raised to the longest
sequence), attn_implementation="sdpa", random weights (seeded; the 1-D ones moved off their constant
initial values so that the exporter merges no two of them), in eval mode: no dropout, as its export. One
training step at batch 1: forward to the (1, seq, vocab) logits, cross-entropy (mean) against (1, seq)
random labels, backward.

Activation memory, one definition on both sides: the most bytes held at one moment of the step by
everything that is not a parameter, a parameter's gradient or optimizer state: the forward values kept
for backward, the logits and the loss's buffers, backward's gradients of activations (and the partial
gradient of the tied embedding / LM-head weight before the two uses are summed), op scratch.
- PyTorch: torch.profiler (profile_memory=True) records each allocation and free on the step's device
  (the CPU, or CUDA's caching allocator with --device cuda, where SDPA picks its fused GPU kernels), with its address,
  over forward + loss + backward (after a warm-up step, the gradients set to None). The peak of their
  running sum, leaving out the allocations that end the step as a parameter's .grad.
- memplan: breakdown.peak over the io, saved and activations fields (the most bytes the planned step
  holds outside params, gradients and optimizer state at one step) plus the pooled workspace slot. Two
  plans (bestfit, sgd, default passes): "export", torch.onnx's dynamo export of the same module (its
  logits), planned with training=True and loss cross_entropy (classes on the last dim, as the language
  model rule finds), the initializers that are no parameter frozen (none are, for GPT-2); "zoo", the
  zoo's gpt2_small (an untied LM head; otherwise the same layers).
--explain N lists, for each side, the N largest groups of the buffers live at its peak: by the op that
made them and their size (and memplan's category). Progress goes to stderr.
"""
import argparse
import contextlib
import copy
import json
import os
import sys
import tempfile
import time
import warnings

import numpy as np
import onnx

import planner
from frontends import zoo
from planner.breakdown import category, peak

MiB = 2 ** 20
FIELDS = ("io", "saved", "activations")
START = time.perf_counter()


def log(message):
    print(f"[{time.perf_counter() - START:7.1f}s] {message}", file=sys.stderr, flush=True)


def gpt2(positions):
    """The causal LM (eval mode, seeded, no key/value cache: its logits are its one output, as exported)."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_positions=positions, attn_implementation="sdpa", use_cache=False)
    lm = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for p in lm.parameters():
            if p.ndim == 1:
                p.add_(0.02 * torch.randn_like(p))
    return lm


def feeds(vocab, seq):
    """(input ids, labels), each (1, seq), seeded by the length."""
    rng = np.random.default_rng(seq)
    return rng.integers(0, vocab, (1, seq)), rng.integers(0, vocab, (1, seq))


def torch_activations(lm, seq, top, device="cpu"):
    """PyTorch's activation bytes over one step on `device` (see the module doc), and the `top` largest groups
    of the allocations live at that peak (`grouped`) by the op that made them."""
    import torch
    from torch.nn.functional import cross_entropy
    lm = copy.deepcopy(lm).to(device)
    ids, labels = (torch.as_tensor(a, device=device) for a in feeds(lm.config.vocab_size, seq))
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)

    def step():
        cross_entropy(lm(input_ids=ids, use_cache=False).logits.flatten(0, 1), labels.flatten()).backward()
        for p in lm.parameters():
            grads.append(p.grad)
            p.grad = None

    grads = []
    step()
    grads.clear()
    with torch.profiler.profile(activities=activities, profile_memory=True) as prof:
        step()
        if device == "cuda":
            torch.cuda.synchronize()
    kept = {g.untyped_storage().data_ptr() for g in grads}
    with tempfile.TemporaryDirectory() as folder:
        prof.export_chrome_trace(os.path.join(folder, "trace.json"))
        with open(os.path.join(folder, "trace.json")) as f:
            trace = json.load(f)["traceEvents"]
    kind = 1 if device == "cuda" else 0  # the profiler's device types: 0 the CPU, 1 CUDA
    memory = sorted((e for e in trace if e.get("name") == "[memory]" and e["args"]["Device Type"] == kind),
                    key=lambda e: e["args"]["Ev Idx"])
    last = {}
    for k, e in enumerate(memory):
        if e["args"]["Bytes"] > 0:
            last[e["args"]["Addr"]] = k
        else:
            last.pop(e["args"]["Addr"], None)
    grad_allocations = {k for addr, k in last.items() if addr in kept}
    live, running, most, at_most = {}, 0, 0, {}
    for k, e in enumerate(memory):
        addr, nbytes = e["args"]["Addr"], e["args"]["Bytes"]
        if nbytes > 0 and k not in grad_allocations:
            live[addr] = (nbytes, e["ts"])
            running += nbytes
        elif nbytes < 0 and addr in live:
            running -= live.pop(addr)[0]
        if running > most:
            most, at_most = running, dict(live)
    ops = sorted((e["ts"], e["ts"] + e["dur"], e["name"]) for e in trace if e.get("cat") == "cpu_op")
    return most, grouped(((nbytes, _op_at(ops, ts)) for nbytes, ts in at_most.values()), top)


def grouped(buffers, top):
    """The `top` largest groups of (bytes, *what made them) buffers of one size and maker, as (total bytes,
    how many, the size in MiB, *what)."""
    groups = {}
    for nbytes, *what in buffers:
        key = (round(nbytes / MiB, 2), *what)
        total, count = groups.get(key, (0, 0))
        groups[key] = (total + nbytes, count + 1)
    return sorted(((total, count, *key) for key, (total, count) in groups.items()), reverse=True)[:top]


def _op_at(ops, ts):
    """The innermost (shortest) op running at time `ts`."""
    running = [(end - start, name) for start, end, name in ops if start <= ts <= end]
    return min(running)[1] if running else "?"


def export(module, seq, path):
    """The dynamo ONNX export of `module` at (1, seq) input ids, and the float initializers of more than one
    element that are no parameter of it (folded buffers and computed tables, to freeze)."""
    import torch
    ids = torch.as_tensor(feeds(module.config.vocab_size, seq)[0])
    with warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr):  # the exporter's progress
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (ids,), path, input_names=["input_ids"], output_names=["logits"], dynamo=True)
    names = {name for name, _ in module.named_parameters(remove_duplicate=False)}  # a tied weight's both names
    inits = onnx.load(path, load_external_data=False).graph.initializer
    found, wanted = sum(i.name in names for i in inits), len(list(module.parameters()))
    if found != wanted:
        raise SystemExit(f"the export stores {found} of the {wanted} parameters under their names")
    return [i.name for i in inits if i.name not in names and i.data_type == onnx.TensorProto.FLOAT
            and int(np.prod(i.dims)) > 1]


def memplan_activations(plan, top):
    """memplan's activation bytes (see the module doc), and the `top` largest groups of the buffers live at
    that step (`grouped`) by their category and the op that wrote them."""
    most, step = peak(plan, FIELDS)
    members = {}
    for t in plan.tensors.values():
        if t.lifetime is not None and t.lifetime[0] <= step:
            members.setdefault(t.alias_of or t.name, []).append(t)
    held = {root: max(ts, key=lambda t: t.lifetime) for root, ts in members.items()
            if plan.tensors[root].lifetime is not None and max(t.lifetime[1] for t in ts) >= step}
    writer = {out: s.op for s in plan.steps for out in s.outputs}
    largest = grouped(((plan.tensors[root].nbytes, category(t), writer.get(root, "input")) for root, t in held.items()
                       if category(t) in ("io", "saved", "activation", "recomputed")), top)
    return most + plan.breakdown["workspace"], largest


def measure(seq, positions, top, device):
    """{column: (bytes, the largest buffers at its peak)} for one sequence length."""
    lm = gpt2(positions)
    row = {}
    if device != "none":
        log(f"seq {seq}: PyTorch sdpa forward + loss + backward on {device}, profiled")
        row["torch"] = torch_activations(lm, seq, top, device)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "gpt2.onnx")
        log(f"seq {seq}: torch.onnx dynamo export")
        frozen = export(lm, seq, path)
        log(f"seq {seq}: planning the export's training step ({len(frozen)} initializers frozen)")
        plan = planner.compile(path, {"input_ids": (1, seq)}, training=True, loss="cross_entropy",
                               optimizer="sgd", frozen=frozen)
    log(f"seq {seq}: export planned: {len(plan.training['params'])} params trained, "
        f"{plan.stats.get('fused_attention', 0)} attentions fused")
    row["export"] = memplan_activations(plan, top)
    log(f"seq {seq}: planning the zoo gpt2_small's training step")
    plan = planner.compile(zoo.build("gpt2_small", max_positions=positions), {"input_ids": (1, seq)},
                           training=True, loss="cross_entropy", optimizer="sgd")
    row["zoo"] = memplan_activations(plan, top)
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seqs", nargs="+", type=int, default=[1024])
    parser.add_argument("--explain", type=int, default=0, metavar="N",
                        help="list the N largest groups of buffers live at each side's peak")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "none"],
                        help="where PyTorch's step runs (none: plan only)")
    args = parser.parse_args()
    positions = max(1024, *args.seqs)
    rows = {seq: measure(seq, positions, args.explain, args.device) for seq in args.seqs}
    print("GPT-2 small training step, batch 1, activation memory (MiB; params, grads, optimizer state excluded); "
          f"PyTorch on {args.device}")
    print(f"{'seq':>6} {'torch sdpa':>11} {'memplan export':>15} {'export/torch':>13} {'memplan zoo':>12} "
          f"{'zoo/torch':>10}")
    for seq, row in rows.items():
        theirs = row["torch"][0] if "torch" in row else None
        cells = [f"{theirs / MiB:11.1f}" if theirs else f"{'-':>11}"]
        for key, width in (("export", 15), ("zoo", 12)):
            ours = row[key][0]
            cells += [f"{ours / MiB:{width}.1f}", f"{ours / theirs:{13 if key == 'export' else 10}.2f}" if theirs
                      else f"{'-':>{13 if key == 'export' else 10}}"]
        print(f"{seq:>6} " + " ".join(cells))
    for seq, row in rows.items():
        for key, (_, largest) in row.items():
            if largest:
                print(f"\nseq {seq}, {key}: the buffers live at its peak, by maker and size (MiB)")
                for total, count, size, *what in largest:
                    print(f"  {total / MiB:9.2f} = {count:3d} x {size:7.2f}  {' '.join(what)}")


if __name__ == "__main__":
    main()
