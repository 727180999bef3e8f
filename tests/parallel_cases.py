"""What the tensor- and pipeline-parallel tests share: the zoo's transformers planned for training, their token
feeds, and transformers' exports trained by a rank of a gloo group."""
import numpy as np
import pytest

import planner
from executor import Executor
from zoo_cases import input_shapes, small_model

BATCH, STEPS, VOCAB, CLASSES = 4, 3, 100, 64  # bert's classes: its hidden features


def compiled(model, batch, parallel=None, optimizer="momentum", **options):
    m = small_model(model)
    return planner.compile(m, input_shapes(m, batch), training=True, optimizer=optimizer, parallel=parallel, **options)


def batches(model, seed=0):
    """STEPS batches of token ids and (gpt2's next tokens, bert's tags) labels; bert's attention mask too."""
    rng = np.random.default_rng(seed)
    shape = input_shapes(small_model(model), BATCH)["input_ids"]
    feeds = []
    for _ in range(STEPS):
        feed = {"input_ids": rng.integers(0, VOCAB, shape), "labels": rng.integers(0, CLASSES, shape)}
        if model == "bert_base":
            feed["attention_mask"] = (rng.random(shape) < 0.8).astype(np.int64)
        feeds.append(feed)
    return feeds


def exported(build, tmp_path):
    """(path, feeds): the transformers model a builder makes (`build`, or test_transformers_exports' builder of
    that name) exported by the dynamo exporter, and STEPS batches of its inputs and labels."""
    pytest.importorskip("onnxscript")
    import test_transformers_exports as exports
    import torch
    torch.manual_seed(0)
    model, inputs = (build if callable(build) else getattr(exports, build))()
    path = str(tmp_path / f"{getattr(build, '__name__', build)}.onnx")
    torch.onnx.export(model.eval(), tuple(inputs.values()), path, input_names=list(inputs), output_names=["out"],
                      dynamo=True)
    rng = np.random.default_rng(0)
    shape = tuple(inputs["input_ids"].shape)
    return path, [{"input_ids": rng.integers(0, 64, shape), "labels": rng.integers(0, 64, shape)}
                  for _ in range(STEPS)]


def trained_alone(path, feeds):
    """The losses and params of the plain plan of the export at `path` after training on `feeds`."""
    ex = Executor(planner.compile(path, {"input_ids": feeds[0]["input_ids"].shape}, training=True,
                                  optimizer="momentum"), backend="numpy")
    return [ex.train_step(f) for f in feeds], ex.parameters()


def export_rank(rank, port, results, path, feeds, parallel):
    """One rank of a gloo group of parallel.world: `parallel`'s plan of the export at `path` (its pipeline
    stage's) trained on `feeds`; its losses, every param its arena holds and its training facts."""
    import dataclasses

    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=parallel.world)
    try:
        stage = dataclasses.replace(parallel, stage=rank // (parallel.dp * parallel.tp))
        plan = planner.compile(path, {"input_ids": feeds[0]["input_ids"].shape}, training=True, optimizer="momentum",
                               parallel=stage)
        ex = Executor(plan, backend="numpy", poison=True)
        losses = [ex.train_step(f) for f in feeds]
        held = {n: ex.arena.view(n).copy() for n, t in plan.tensors.items() if t.kind == "param"}
        results.put((rank, losses, held, plan.training))
    finally:
        dist.destroy_process_group()


def gpt2():
    """transformers' GPT-2 of 64 features, 2 layers of 4 heads and a vocabulary of 128 (`exported`'s builder), and
    its input: a batch of 2 sequences of 16 tokens."""
    import torch
    import transformers
    from exports import Output
    config = transformers.GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=64, use_cache=False)
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    return Output(transformers.GPT2LMHeadModel(config), ["input_ids"], "logits", use_cache=False), {"input_ids": ids}
