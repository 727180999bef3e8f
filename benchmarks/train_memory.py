"""Training-step memory: memplan's planned arena against PyTorch eager running the same graph.

    python benchmarks/train_memory.py [--batch 32] [--optimizer adam] [--models resnet50 bert_base]
                                      [--seq 128] [--device cuda|cpu|none] [--precision fp32|amp-fp16|amp-bf16]

For each zoo model at full size, one training step (forward, loss, backward, optimizer update):
resnet50 with cross_entropy on its logits, bert_base (sequence --seq) with mse on last_hidden_state.
memplan: the training plan's arena, its LOAD and its breakdown by purpose. PyTorch: to_torch's copy of
the graph with torch.optim's form of the optimizer; after one warm-up step (optimizer state, cuDNN
workspaces), the peak bytes of live tensors over one more step: torch.cuda.max_memory_allocated() on
CUDA; on the CPU, the tensors alive before the step plus the highest running sum of the allocations
and frees torch.profiler records during it (PyTorch has no CPU allocator statistics). `--device none`
prints the plans only. Progress goes to stderr.
"""
import argparse
import sys
import time

import numpy as np

import planner
from frontends import zoo
from planner.optimizers import OPTIMIZERS

MiB = 2 ** 20
LOSS_OF = {"resnet50": "cross_entropy", "bert_base": "mse"}
START = time.perf_counter()


def log(message):
    print(f"[{time.perf_counter() - START:7.1f}s] {message}", file=sys.stderr, flush=True)


def input_shapes(name, batch, seq):
    if name == "bert_base":
        return {"input_ids": (batch, seq), "attention_mask": (batch, seq)}
    return {"input": (batch, 3, 224, 224)}


def host_feeds(shapes, loss, output, rng):
    """The model's inputs (token ids with a full attention mask, or standard normal images) and the loss's
    target for an `output` of that shape (class labels, or standard normal values)."""
    feeds = {n: rng.integers(0, 1000, s) if n == "input_ids" else np.ones(s, np.int64) if n == "attention_mask"
             else rng.standard_normal(s, dtype=np.float32) for n, s in shapes.items()}
    if loss == "cross_entropy":
        return feeds, rng.integers(0, output[1], output[:1])
    return feeds, rng.standard_normal(output, dtype=np.float32)


def torch_step(model, shapes, loss, optimizer, feeds, target, device, precision="fp32"):
    """One training step of to_torch's copy on `device` with torch.optim (under torch.autocast for an amp-*
    precision, with a GradScaler for amp-fp16), as a function; and a function giving the bytes alive between
    steps (params, buffers, optimizer state, feeds, target)."""
    import torch
    from executor.torch_module import LOSSES, to_torch, torch_optimizer
    module = to_torch(model, shapes).to(device).train()
    opt = torch_optimizer(optimizer, list(module.graph_parameters().values()))
    feeds = {n: torch.as_tensor(v, device=device) for n, v in feeds.items()}
    target, output = torch.as_tensor(target, device=device), module.graph.outputs[0]
    low = {"amp-fp16": torch.float16, "amp-bf16": torch.bfloat16}.get(precision)
    scaler = torch.amp.GradScaler(device, enabled=low is torch.float16)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=low or torch.float32, enabled=low is not None):
            out = module(**feeds)[output]
        scaler.scale(LOSSES[loss](out.float(), target)).backward()
        scaler.step(opt)
        scaler.update()

    def resident():
        """Bytes of the tensors alive between steps, the gradients freed first (the profiler records no
        free of a block allocated before it started)."""
        opt.zero_grad(set_to_none=True)
        tensors = [*module.parameters(), *module.buffers(), *feeds.values(), target,
                   *(v for state in opt.state.values() for v in state.values() if torch.is_tensor(v))]
        return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())
    return step, resident


def torch_peak_bytes(*workload, device="cuda", precision="fp32"):
    """Peak bytes of PyTorch's live tensors over one training step, after a warm-up one."""
    import torch
    step, resident = torch_step(*workload, device, precision)
    step()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated()
    return profiled_peak(step, resident, warm=False)[0]


def profiled_peak(step, resident, warm=True):
    """(the peak bytes of live tensors over one `step` on the CPU, after a warm-up one where `warm`; the bytes
    alive before it): those `resident()` counts plus the highest running sum of the profiler's "[memory]"
    events (PyTorch has no CPU allocator statistics)."""
    from torch.profiler import ProfilerActivity, profile
    if warm:
        step()
    before = resident()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    live = peak = 0
    for e in events:
        live += e.nbytes()
        peak = max(peak, live)
    return before + peak, before


def measure(name, batch, optimizer, seq, device, precision):
    """The training plan of zoo model `name`, and PyTorch's peak bytes for the same step (None for "none")."""
    model, shapes, loss = zoo.build(name), input_shapes(name, batch, seq), LOSS_OF[name]
    log(f"{name}: planning one training step ({optimizer}, {precision}) at batch {batch}")
    plan = planner.compile(model, shapes, training=True, loss=loss, optimizer=optimizer, precision=precision)
    log(f"{name}: planned in {plan.stats['plan_seconds']:.1f}s, arena {plan.arena_bytes / MiB:,.1f} MiB")
    if device == "none":
        return plan, None
    log(f"{name}: PyTorch eager training steps on {device}")
    output = plan.tensors[model.graph.output[0].name].shape
    peak = torch_peak_bytes(model, shapes, loss, optimizer, *host_feeds(shapes, loss, output, np.random.default_rng(0)),
                            device=device, precision=precision)
    log(f"{name}: PyTorch peak {peak / MiB:,.1f} MiB")
    return plan, peak


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--optimizer", default="adam", choices=list(OPTIMIZERS))
    parser.add_argument("--models", nargs="+", default=list(LOSS_OF), choices=list(LOSS_OF))
    parser.add_argument("--seq", type=int, default=128, help="bert_base's sequence length")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu", "none"])
    parser.add_argument("--precision", default="fp32", choices=["fp32", "amp-fp16", "amp-bf16"],
                        help="amp-*: autocast's policy on both sides (torch.autocast, GradScaler for fp16)")
    args = parser.parse_args()
    if args.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            parser.error("PyTorch sees no CUDA device; --device cpu measures PyTorch on the CPU, none skips it")
    results = {name: measure(name, args.batch, args.optimizer, args.seq, args.device, args.precision)
               for name in args.models}

    print(f"training step, batch {args.batch}, {args.optimizer}, {args.precision}, "
          f"PyTorch eager on {args.device} (MiB)")
    print(f"{'model':<10} {'memplan arena':>14} {'LOAD':>10} {'torch peak':>11} {'ours/torch':>11}")
    for name, (plan, peak) in results.items():
        theirs = "-" if peak is None else f"{peak / MiB:,.1f}"
        ratio = "-" if peak is None else f"{plan.arena_bytes / peak:.2f}"
        print(f"{name:<10} {plan.arena_bytes / MiB:>14,.1f} {plan.lower_bound_bytes / MiB:>10,.1f} {theirs:>11} {ratio:>11}")

    keys = list(dict.fromkeys(k for plan, _ in results.values() for k in plan.breakdown))
    print(f"\nmemplan arena by purpose (MiB)\n{'':<12}" + "".join(f"{name:>12}" for name in results))
    for key in keys:
        print(f"{key:<12}" + "".join(f"{plan.breakdown.get(key, 0) / MiB:>12,.1f}" for plan, _ in results.values()))


if __name__ == "__main__":
    main()
