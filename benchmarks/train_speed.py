"""Training-step time and device memory on the GPU: memplan's plans on CuPy against PyTorch eager.

    python benchmarks/train_speed.py [--models resnet50 bert_base] [--batch 32] [--seq 128] [--steps 10]
                                     [--strategies none mirror sublinear budget] [--no-graph] [--no-torch]

One Adam step (forward, loss, backward, update) of each zoo model at full size, fp32 with TF32 off on both
sides: resnet50 with cross_entropy on its logits, bert_base (sequence --seq) with mse on last_hidden_state.
memplan: per recomputation strategy ("budget": memory_budget halfway between none's and sublinear's arenas),
the arena, the median step time run step by step and, unless --no-graph, replayed as one CUDA graph
(cuda_graph=True), and the time against none's. PyTorch (torchvision's ResNet-50, transformers' BertModel
without pooler, the same shapes): the median eager step and torch.cuda.max_memory_allocated over a step, plain
and with activation checkpointing (checkpoint_sequential over 8 segments for resnet50, transformers' gradient
checkpointing of each layer for bert_base). Progress goes to stderr.
"""
import argparse
import statistics

import numpy as np

import planner
from frontends import zoo
from planner.timing import timings

from train_memory import LOSS_OF, input_shapes, log

MiB = 2 ** 20
STRATEGIES = ("none", "mirror", "sublinear", "budget")


def median_seconds(step, steps, sync=lambda: None):
    """Median wall time of `steps` calls of `step` after two warm-up ones, the device synchronised around each."""
    return statistics.median(timings(step, steps, sync, warmup=2))


def plans(name, batch, seq, strategies):
    """{strategy: training plan} of zoo model `name`, planned for CUDA."""
    model, shapes = zoo.build(name), input_shapes(name, batch, seq)
    options = {"training": True, "loss": LOSS_OF[name], "optimizer": "adam", "device": "cuda"}
    out = {}
    for strategy in ("none", "sublinear", *strategies):
        if strategy in out:
            continue
        extra = {"remat": None if strategy == "none" else strategy}
        if strategy == "budget":
            extra["memory_budget"] = (out["none"].arena_bytes + out["sublinear"].arena_bytes) // 2
        out[strategy] = planner.compile(model, shapes, **options, **extra)
        log(f"{name} {strategy}: planned in {out[strategy].stats['plan_seconds']:.1f}s, "
            f"arena {out[strategy].arena_bytes / MiB:,.1f} MiB")
    return {s: out[s] for s in strategies}


def feeds_of(plan, name):
    rng = np.random.default_rng(0)
    info = plan.training
    feeds = {}
    for n in plan.inputs:
        t = plan.tensors[n]
        if n in (info["lr"], info["step"]):
            continue
        if n == info["labels"]:
            feeds[n] = rng.integers(0, 1000, t.shape) if name == "resnet50" else \
                rng.standard_normal(t.shape, dtype=np.float32)
        elif n == "input_ids":
            feeds[n] = rng.integers(0, 30522, t.shape)
        elif n == "attention_mask":
            feeds[n] = np.ones(t.shape, np.int64)
        else:
            feeds[n] = rng.standard_normal(t.shape, dtype=np.float32)
    return feeds


def memplan_seconds(plan, name, steps, graph):
    """Median step time of `plan` on CuPy, step by step or replayed as one CUDA graph."""
    from executor import Executor
    ex, feeds = Executor(plan, backend="cupy", cuda_graph=graph), feeds_of(plan, name)
    return median_seconds(lambda: ex.train_step(feeds), steps)


def torch_row(name, batch, seq, steps, checkpoint):
    """(median step seconds, max_memory_allocated over a step) of PyTorch eager's Adam step."""
    import torch
    device = "cuda"
    if name == "resnet50":
        import torchvision
        net = torchvision.models.resnet50(num_classes=1000).to(device).train()
        x = torch.randn(batch, 3, 224, 224, device=device)
        target = torch.randint(0, 1000, (batch,), device=device)
        if checkpoint:  # a checkpointed segment must not overwrite its input, which ReLU(inplace=True) would
            for m in net.modules():
                if isinstance(m, torch.nn.ReLU):
                    m.inplace = False
        blocks = torch.nn.Sequential(net.conv1, net.bn1, net.relu, net.maxpool, *net.layer1, *net.layer2,
                                     *net.layer3, *net.layer4, net.avgpool, torch.nn.Flatten(), net.fc)

        def loss():
            out = torch.utils.checkpoint.checkpoint_sequential(blocks, 8, x, use_reentrant=False) if checkpoint \
                else blocks(x)
            return torch.nn.functional.cross_entropy(out, target)
    else:
        from transformers import BertConfig, BertModel
        net = BertModel(BertConfig(), add_pooling_layer=False).to(device).train()
        if checkpoint:
            net.gradient_checkpointing_enable({"use_reentrant": False})
        ids = torch.randint(0, 30522, (batch, seq), device=device)
        mask = torch.ones(batch, seq, dtype=torch.int64, device=device)
        target = torch.randn(batch, seq, 768, device=device)

        def loss():
            return torch.nn.functional.mse_loss(net(input_ids=ids, attention_mask=mask).last_hidden_state, target)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        loss().backward()
        opt.step()
    seconds = median_seconds(step, steps, torch.cuda.synchronize)
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return seconds, torch.cuda.max_memory_allocated()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(LOSS_OF), choices=list(LOSS_OF))
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=128, help="bert_base's sequence length")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per row, after two warm-up ones")
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=STRATEGIES)
    parser.add_argument("--no-graph", action="store_true", help="skip the CUDA-graph replays")
    parser.add_argument("--no-torch", action="store_true", help="skip PyTorch's rows")
    args = parser.parse_args()
    import cupy
    import torch
    if not torch.cuda.is_available():
        parser.error("this benchmark needs a CUDA GPU (and CuPy)")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    print(f"training step (adam, fp32, TF32 off), batch {args.batch}, {torch.cuda.get_device_name()}; "
          f"ms are medians of {args.steps} steps")
    print(f"{'model':<10} {'run':<26} {'device MiB':>11} {'step ms':>9} {'graph ms':>9} {'vs none':>8}")
    for name in args.models:
        base = None
        for strategy, plan in plans(name, args.batch, args.seq, args.strategies).items():
            log(f"{name} {strategy}: timing on CuPy")
            eager = memplan_seconds(plan, name, args.steps, False)
            cupy.get_default_memory_pool().free_all_blocks()
            graph = None
            if not args.no_graph:
                try:
                    graph = memplan_seconds(plan, name, args.steps, True)
                    cupy.get_default_memory_pool().free_all_blocks()
                except planner.MemplanError as e:
                    log(f"{name} {strategy}: no CUDA-graph replay: {e}")
            best = min(eager, graph or eager)
            base = best if strategy == "none" else base
            ratio = f"{best / base:.2f}x" if base else "-"
            replay = "-" if graph is None else f"{graph * 1e3:.1f}"
            print(f"{name:<10} {'memplan ' + strategy:<26} {plan.arena_bytes / MiB:>11,.1f} {eager * 1e3:>9.1f} "
                  f"{replay:>9} {ratio:>8}", flush=True)
        if args.no_torch:
            continue
        for checkpoint in (False, True):
            log(f"{name}: PyTorch eager{' with checkpointing' if checkpoint else ''}")
            seconds, peak = torch_row(name, args.batch, args.seq, args.steps, checkpoint)
            torch.cuda.empty_cache()
            label = "torch eager" + (" checkpoint_sequential(8)" if checkpoint and name == "resnet50" else
                                     " checkpointed layers" if checkpoint else "")
            print(f"{name:<10} {label:<26} {peak / MiB:>11,.1f} {seconds * 1e3:>9.1f} {'-':>9} {'-':>8}", flush=True)


if __name__ == "__main__":
    main()
