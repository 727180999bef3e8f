"""Digests of plans and outputs, to show that a refactor changes no plan: for every zoo model at full
size (bestfit, share, naive; batch 1) and every small test case (inference at batch 1 and 3, training
with sgd/adam/momentum under no recomputation, mirror and sublinear), the arena and LOAD bytes, a digest
of every tensor's (name, offset, bytes, alias, lifetime, kind, role) and of the steps, and the bytes of
the outputs, losses and trained params on NumPy.

    python benchmarks/plan_digests.py before.json      # on the old tree
    python benchmarks/plan_digests.py after.json       # on the new one
    python benchmarks/plan_digests.py --diff before.json after.json
    MEMPLAN_WORKSPACE_MODE=pool python benchmarks/plan_digests.py --strategy bestfit old-defaults.json

--strategy plans the small cases under that strategy instead of the default (with the environment's
workspace mode, the former defaults: a change of the defaults set aside).

Names compare without a "memplan." prefix: memplan's own ops were once named "memplan.SGD" and are now
SGD of the memplan domain, which renames the nodes and tensors training adds and nothing else.
"""
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def digest(obj):
    text = json.dumps(obj, sort_keys=True, default=str).replace("memplan.", "")
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def plan_digest(plan):
    def name(x):
        return x and x.replace("memplan.", "")
    tensors = sorted((name(t.name), t.offset, t.nbytes, name(t.alias_of), t.lifetime and list(t.lifetime), t.kind,
                      t.role, t.view) for t in plan.tensors.values())
    steps = [(s.name, f"{s.domain}.{s.op}" if getattr(s, "domain", "") else s.op, list(s.inputs), list(s.outputs),
              s.workspace, s.phase) for s in plan.steps]
    return {"arena": plan.arena_bytes, "load": plan.lower_bound_bytes, "schedule": plan.schedule,
            "tensors": digest(tensors), "steps": digest(steps), "n": len(plan.steps)}


def array_digest(a):
    return hashlib.sha1(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]


def collect(strategy=None):
    import planner
    import zoo_cases
    from executor import Executor
    from frontends import zoo
    found, options = {}, {} if strategy is None else {"strategy": strategy}
    for name in zoo.NAMES:
        model = zoo.build(name)
        for strategy in ("bestfit", "share", "naive"):
            found[f"full/{name}/{strategy}"] = plan_digest(
                planner.compile(model, zoo_cases.input_shapes(model, 1), strategy=strategy))
    for case in zoo_cases.CASES:
        model = zoo_cases.small_model(case)
        for batch in (1, 3):
            plan = planner.compile(model, zoo_cases.input_shapes(model, batch), **options)
            found[f"small/{case}/{batch}"] = plan_digest(plan)
            outputs = Executor(plan, backend="numpy").run(zoo_cases.feeds(model, batch))
            found[f"small/{case}/{batch}/out"] = {k: array_digest(v) for k, v in outputs.items()}
        if case in ("bert_base", "gpt2_small", "unet_resize"):
            continue
        for optimizer in ("sgd", "adam", "momentum"):
            for remat in (None, "mirror", "sublinear"):
                plan = planner.compile(model, zoo_cases.input_shapes(model, 2), training=True, optimizer=optimizer,
                                       remat=remat, **options)
                key = f"train/{case}/{optimizer}/{remat}"
                found[key] = plan_digest(plan)
                if remat is None or optimizer == "adam":
                    ex = Executor(plan, backend="numpy")
                    feeds = zoo_cases.feeds(model, 2)
                    labels = plan.tensors[plan.training["labels"]]
                    fill = np.zeros if np.dtype(labels.dtype).kind in "iu" else np.ones
                    feeds[labels.name] = fill(labels.shape, labels.dtype)
                    found[key + "/loss"] = [float(ex.train_step(feeds)).hex() for _ in range(2)]
                    found[key + "/params"] = digest({k: array_digest(v) for k, v in ex.parameters().items()})
    return found


def diff(before, after):
    a, b = (json.loads(Path(p).read_text()) for p in (before, after))
    differ = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    for key in differ:
        print(key, a.get(key), b.get(key))
    print(f"{len(differ)} of {len(a)} differ")


if __name__ == "__main__":
    if sys.argv[1] == "--diff":
        diff(*sys.argv[2:4])
    elif sys.argv[1] == "--strategy":
        Path(sys.argv[3]).write_text(json.dumps(collect(sys.argv[2]), indent=0, sort_keys=True))
    else:
        Path(sys.argv[1]).write_text(json.dumps(collect(), indent=0, sort_keys=True))
