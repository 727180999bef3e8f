"""`memplan report`: the arena each strategy needs for one model, beside the lower bound LOAD, the
dynamic-pool baselines, both workspace modes and, for a training step, both update orders and the
recomputation strategies."""
import math
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from . import pools
from .breakdown import dtype_line, fields, fullest_step_line, peak
from .config import Config
from .errors import MemplanError, MissingDependencyError, say
from .training import constant_kind
from .units import format_bytes

ROWS = (  # label, strategy, Config changes
    ("naive", "naive", {}),
    ("inplace", "inplace", {}),
    ("share", "share", {}),
    ("share (auto search)", "share", {"auto_search_match_range": True}),
    ("bestfit", "bestfit", {}),
    ("auto", "auto", {}),
    ("optimal", "optimal", {}),
)


@dataclass
class Report:
    """The plans of one typed graph: one row per strategy, the bestfit plan under each workspace mode
    and, for a training step, each update order and recomputation (an error where none fits); `notes`
    say which rows were left out and why."""

    graph: object
    rows: list
    modes: dict
    updates: dict | None = None
    remats: dict | None = None
    budget: int | None = None
    notes: list = field(default_factory=list)
    precisions: dict | None = None
    unsharded: object = None
    stages: list | None = None

    @property
    def lower_bound(self):
        """LOAD: the smallest lower bound among the plans that reuse memory."""
        return min(plan.lower_bound_bytes for _, plan in self.rows if plan.strategy != "naive")

    def plan(self, label):
        return dict(self.rows)[label]

    def as_dict(self):
        """The report as plain data (JSON)."""
        from .remat import dtr
        load, naive = self.lower_bound, self.rows[0][1].arena_bytes
        first = self.rows[0][1]
        doc = {"model": self.graph.name, "inputs": {n: list(self.graph.tensors[n].shape) for n in self.graph.inputs},
               "weights_absent": len(first.weights_absent), "notes": self.notes}
        if self.updates:
            doc.update(training=first.training["optimizer"], trained_params=len(first.training["params"]),
                       trained_values=sum(math.prod(first.tensors[n].shape) for n in first.training["params"]),
                       constants=first.training["constants"], criterion=first.training["criterion"],
                       exported_params=first.training.get("exported_params"),
                       parallel=_parallel(first, self.unsharded, self.stages),
                       offload=_offload(min((p for _, p in self.rows), key=lambda p: p.arena_bytes)),
                       forward_flops=first.stats["forward_flops"], backward_flops=first.stats["backward_flops"],
                       update_modes={m: {"strategy": p.strategy, "arena_bytes": p.arena_bytes, "breakdown": p.breakdown}
                                     for m, p in self.updates.items()})
        elif first.training.get("tensor_parallel"):
            doc["tensor_parallel"] = _inference_parallel(first, self.unsharded)
        if self.remats:
            step = first.stats["forward_flops"] + first.stats["backward_flops"]
            doc["remat"] = [_remat_row(label, p, load, step) for label, p in self.remats.items()]
            if self.budget is not None:
                none = self.remats["none"]
                result = dtr.simulate(none, self.budget - none.stats["persistent_bytes"])
                doc["dtr"] = {"budget_bytes": self.budget, "feasible": result.feasible, "evictions": result.evictions,
                              "recompute_flops": result.recompute_flops, "recompute_share": result.recompute_flops / step}
        if self.precisions:
            fp32 = self.precisions["fp32"].arena_bytes
            doc["precisions"] = [{"precision": name, "arena_bytes": p.arena_bytes, "x_fp32": p.arena_bytes / fp32,
                                  "breakdown": p.breakdown} for name, p in self.precisions.items()]
        bestfit = self.plan("bestfit")
        doc.update(lower_bound_bytes=load, baselines={p: asdict(pools.simulate(bestfit, p)) for p in pools.POOLS},
                   workspace_modes={m: {"strategy": p.strategy, "arena_bytes": p.arena_bytes, "lower_bound_bytes": p.lower_bound_bytes,
                                        "workspace_bytes": p.breakdown["workspace"],
                                        "slots": p.stats["workspace"].get("slots", [])} for m, p in self.modes.items()},
                   rows=[{"strategy": label, "arena_bytes": p.arena_bytes, "x_load": p.arena_bytes / load,
                          "saving_vs_naive": 1 - p.arena_bytes / naive, "plan_seconds": p.stats["plan_seconds"],
                          "schedule": p.schedule, "fullest_step": p.stats["fullest_step"], "breakdown": p.breakdown}
                         for label, p in self.rows])
        return doc

    def csv_rows(self):
        """One flat dict per strategy row, the breakdown as `FIELD_bytes` columns."""
        return [{**{k: v for k, v in r.items() if k != "breakdown"},
                 **{f"{k}_bytes": v for k, v in r["breakdown"].items()}} for r in self.as_dict()["rows"]]

    def table(self):
        """The report as aligned text; sizes in B, KiB, MiB or GiB."""
        d = self.as_dict()
        training = bool(self.updates)
        parts = fields(training) if training else []
        lines = [_title(self.graph, d, training),
                 f"{'strategy':<21} {'arena':>13} {'x LOAD':>7} {'saving':>7} {'plan s':>7}  {'schedule':<8}"
                 + "".join(f" {p:>12}" for p in parts)]
        for r in d["rows"]:
            lines.append(f"{r['strategy']:<21} {format_bytes(r['arena_bytes']):>13} {r['x_load']:>7.3f} "
                         f"{r['saving_vs_naive']:>7.1%} {r['plan_seconds']:>7.2f}  {r['schedule']:<8}"
                         + "".join(f" {format_bytes(r['breakdown'][p]):>12}" for p in parts))
        lines.append(f"{'LOAD (lower bound)':<21} {format_bytes(d['lower_bound_bytes']):>13} {1:>7.3f}")
        lines.append("LOAD is the least memory any placement of these buffers needs: the most bytes live at one "
                     "step. naive gives every tensor its own bytes for the whole run (views share them).")
        lines += [f"note: {n}" for n in d["notes"]]
        lines.append(_pools_line(d))
        lines.append(_breakdown_line(self))
        lines.append(dtype_line(self.plan("bestfit")))
        lines.append(_workspace_line(d))
        if training:
            lines += _training_lines(self, d)
        lines += _inference_parallel_lines(d)
        if self.precisions:
            lines += _precision_lines(d, parts or fields(False))
        return "\n".join(line.rstrip() for line in lines)


def report(graph, config=None, time_limit=None, schedule="auto", strategies=None, memory_budget=None,
           precisions=None, **training):
    """The Report of a typed graph. `optimal` (the allocator, and each try of remat="optimal") searches
    for at most `time_limit` seconds (default the Config's, MEMPLAN_TIME_LIMIT). `strategies`
    keeps only those rows, and always naive and bestfit, which the savings and the baselines are
    measured against. `training` (training=True, loss=, optimizer=, ...) plans training steps, and then
    each update order and recomputation, under `memory_budget` (bytes) too when given. `precisions`
    adds the bestfit plan in each of those precisions (planner.precision), side by side. A row whose
    optional dependency is missing, or whose planning fails (but naive's, bestfit's and the training step's
    without recomputation, which the others are measured against), is left out, with a note."""
    from .compiler import compile, compile_stages
    config = config or Config.from_env()
    time_limit = config.time_limit if time_limit is None else time_limit
    notes = []

    def plan(label, needed=False, **options):
        try:
            return compile(graph, schedule=schedule, **{**training, **options})
        except MemplanError as e:
            if needed and not isinstance(e, MissingDependencyError):
                raise
            notes.append(f"row {label!r} left out: {e}")
            return None

    rows = []
    for label, strategy, changes in ROWS:
        if strategies is not None and strategy not in {*strategies, "naive", "bestfit"}:
            continue
        changes = {**changes, "time_limit": time_limit} if strategy == "optimal" else changes
        if strategy == "share" and not changes and config.auto_search_match_range:
            changes = {"auto_search_match_range": False}
        rows.append((label, plan(label, strategy in ("naive", "bestfit"), strategy=strategy,
                                 config=replace(config, **changes))))
    modes = {mode: compile(graph, schedule=schedule, config=replace(config, workspace_mode=mode), **training)
             for mode in ("pool", "tensor")}
    updates = remats = None
    if training.get("training"):
        updates = {mode: compile(graph, schedule=schedule, config=config, **{**training, "update": mode})
                   for mode in ("eager", "after_backward")}
        timed = replace(config, time_limit=time_limit)
        remats = _remats(lambda label, needed, **o: plan(label, needed, config=timed if o["remat"] == "optimal"
                                                         else config, **o), memory_budget)
    chosen = {name: plan(f"precision {name}", name == "fp32", config=config, precision=name)
              for name in precisions or ()}
    chosen = {name: p for name, p in chosen.items() if p is not None}
    parallel = training.get("parallel")
    unsharded = parallel and compile(graph, schedule=schedule, config=config,
                                     **{**training, "parallel": None, "strategy": "bestfit"})
    stages = parallel and parallel.pp > 1 and [
        p.arena_bytes for p in compile_stages(graph, schedule=schedule, config=config, **training)]
    return Report(graph, [(label, p) for label, p in rows if p is not None], modes, updates, remats, memory_budget,
                  notes, chosen or None, unsharded or None, stages or None)


def _parallel(plan, unsharded, stages=None):
    """A parallel rank's facts (planner.parallel), with the plain plan of the same batch beside them, its
    model states beside the ZeRO paper's count, and each pipeline stage's arena bytes (`stages`); None for a
    plan of one device."""
    from .parallel import model_states
    from .optimizers import OPTIMIZERS
    facts = plan.training.get("parallel")
    if not facts:
        return None
    trained = [plan.tensors[n] for n in plan.training["params"]]
    sharded = set(facts.get("sharded", ()))  # ZeRO-3's params: their wholes (a tensor-parallel piece's too)
    wholes = [plan.data[t.name].value if t.name in sharded else None for t in trained]
    values = sum(math.prod(np.shape(w) if w is not None else t.shape) for t, w in zip(trained, wholes))
    itemsize = max((np.dtype(t.dtype).itemsize for t in trained), default=4)
    states = len(OPTIMIZERS[plan.training["optimizer"]][2])
    ours = {"params": sum(t.nbytes for t in trained), "optimizer": plan.breakdown["optimizer"],
            "gradients_at_peak": plan.breakdown["grads"]}
    paper = model_states(values, itemsize, states * itemsize, facts["dp"], facts["zero"])
    return {**facts, "unsharded": {"arena_bytes": unsharded.arena_bytes, "breakdown": unsharded.breakdown},
            "model_states": {"plan": ours, "zero_paper": paper},
            "tensor_parallel": plan.training.get("tensor_parallel"),
            "pipeline": plan.training.get("pipeline") and {**plan.training["pipeline"], "arena_bytes": stages},
            "batch_norms": _batch_norms(plan)}


def _offload(plan):
    """An offloaded optimizer's facts (planner/passes/offload.py) with the host arena and the device's bytes of the
    trained params; None where the optimizer stays on the device."""
    facts = plan.training.get("offload")
    if not facts:
        return None
    device = sum(plan.tensors[n].nbytes for n in plan.training["params"])
    return {**{k: v for k, v in facts.items() if k != "masters"}, "masters": len(facts["masters"]),
            "host_arena_bytes": plan.host_arena_bytes, "device_param_bytes": device,
            "device_optimizer_bytes": plan.breakdown["optimizer"]}


def _inference_parallel(plan, unsharded):
    """A tensor-parallel rank's inference facts, with the bestfit plan of one device beside them and the bytes
    its all-reduces send a run."""
    from .ops.collectives import sent_by_group
    sent = sum(sent_by_group(plan.steps, plan.tensors).values())
    return {**plan.training["tensor_parallel"], "unsharded_arena_bytes": unsharded.arena_bytes, "collective_bytes": sent}


def _batch_norms(plan):
    """{"alone": training BatchNormalizations normalising a data rank's own rows, "synchronised": those
    normalising by the statistics of all the data ranks (planner/passes/sync_batchnorm.py)}."""
    alone = sum(1 for s in plan.steps
                if s.op == "BatchNormalization" and not s.domain and s.attrs.get("training_mode"))
    return {"alone": alone, "synchronised": (plan.training.get("sync_batchnorm") or {}).get("layers", 0)}


def _remats(plan, memory_budget):
    """{label: bestfit plan} of a training step without recomputation, under mirror and sublinear, and
    under `memory_budget` by the budget planner and the optimal solver (the error where none fits or the
    planning fails); `plan(label, needed, **options)` plans one, or None where it was left out."""
    modes = {"none": None, "mirror": "mirror", "sublinear": "sublinear"}
    if memory_budget is not None:
        modes.update({f"{remat}({format_bytes(memory_budget)})": remat for remat in ("budget", "optimal")})
    plans = {}
    for label, remat in modes.items():
        budget = memory_budget if remat in ("budget", "optimal") else None
        try:
            result = plan(f"remat {label}", remat is None or budget is not None, remat=remat, memory_budget=budget)
        except MemplanError as e:
            if budget is None:
                raise
            result = e
        if result is not None:
            plans[label] = result
    return plans


def _precision_lines(d, parts):
    """The bestfit arena in each precision, its breakdown beside it."""
    lines = ["", f"{'precision':<21} {'arena':>13} {'x fp32':>7}" + "".join(f" {p:>12}" for p in parts)]
    for r in d["precisions"]:
        lines.append(f"{r['precision']:<21} {format_bytes(r['arena_bytes']):>13} {r['x_fp32']:>7.3f}"
                     + "".join(f" {format_bytes(r['breakdown'][p]):>12}" for p in parts))
    lines.append("fp16 and bf16 hold every float in 16 bits; amp-* keep float32 master weights (and optimizer "
                 "state) and make 16-bit copies each step, as torch.autocast does.")
    return lines


def _remat_row(label, plan, load, step):
    if isinstance(plan, Exception):
        return {"remat": label, "error": str(plan)}
    row = {"remat": label, "arena_bytes": plan.arena_bytes, "x_load": plan.arena_bytes / load,
           "saved_bytes": plan.breakdown["saved"], "saved_most_bytes": peak(plan, ("saved",))[0],
           "recompute_flops": plan.stats["recompute_flops"],
           "recompute_share": plan.stats["recompute_flops"] / step, "plan_seconds": plan.stats["plan_seconds"]}
    if "solver" in plan.training["remat"]:
        row["gap"] = plan.training["remat"]["solver"]["gap"]
    return row


def _title(graph, d, training):
    inputs = ", ".join(f"{n} {tuple(s)} {graph.tensors[n].dtype} {format_bytes(graph.tensors[n].nbytes)}"
                       for n, s in d["inputs"].items())
    absent = (f"; weights absent ({d['weights_absent']} planned from their shapes alone, so the plan cannot run)"
              if d["weights_absent"] else "")
    if not training:
        return f"{graph.name}: {inputs}{absent}"
    return (f"{graph.name}: {inputs}; training step with {d['training']} ({d['trained_params']} params trained), "
            f"forward {d['forward_flops'] / 1e9:.2f} GFLOP, backward {d['backward_flops'] / 1e9:.2f} GFLOP{absent}")


def _pools_line(d):
    naive, rounded = d["baselines"]["naive"], d["baselines"]["round"]
    bestfit = next(r for r in d["rows"] if r["strategy"] == "bestfit")
    return (f"dynamic pools on the same schedule: Naive {format_bytes(naive['reserved_bytes'])} "
            f"({naive['device_allocs']} device allocations), Round {format_bytes(rounded['reserved_bytes'])} "
            f"({rounded['device_allocs']} device allocations); the bestfit arena saves "
            f"{1 - bestfit['arena_bytes'] / naive['reserved_bytes']:.1%} against Naive")


def _breakdown_line(report):
    """The smallest plan's breakdown at its fullest step, and the graph inputs already freed by then."""
    return fullest_step_line(*min(report.rows, key=lambda row: row[1].arena_bytes))


def _workspace_line(d):
    pool, tensor = d["workspace_modes"]["pool"], d["workspace_modes"]["tensor"]
    slots = len(pool["slots"])
    below = tensor["arena_bytes"] < d["lower_bound_bytes"]
    flag = say('workspace_mode="tensor"', "--workspace-mode tensor")
    return (f"{pool['strategy']} with the workspace as {slots} pooled slot{'s' if slots != 1 else ''} of "
            f"{format_bytes(pool['workspace_bytes'])}: arena {format_bytes(pool['arena_bytes'])}; as one-step "
            f"tensors ({flag}): arena "
            f"{format_bytes(tensor['arena_bytes'])}"
            + (", below LOAD, because each op's scratch then lives one step instead of the whole run: other "
               f"buffers, whose LOAD is {format_bytes(tensor['lower_bound_bytes'])}" if below else ""))


def _params_line(d):
    """How many params train and which initializers stay constants, grouped by why, a few names each."""
    line = f"trains {d['trained_params']} params ({_count(d['trained_values'])} values)"
    if not d["constants"]:
        return line
    groups = {}
    for name, why in d["constants"].items():
        label = constant_kind(why)
        groups.setdefault(label, []).append(name)
    parts = [f"{len(names)} {many if len(names) > 1 else one} ({', '.join(names[:3])}{', ...' * (len(names) > 3)})"
             for (one, many), names in sorted(groups.items(), key=lambda g: -len(g[1]))]
    return f"{line}; {len(d['constants'])} initializers stay constants: {', '.join(parts)}"


def _offload_line(d):
    """Where an offloaded optimizer's bytes are, a value's, beside ZeRO-Offload's count (Ren et al. 2021: with mixed
    precision the device holds 2 bytes a value, the host 12 and the gradients)."""
    o, values = d.get("offload"), d["trained_values"]
    if not o:
        return []
    low = f"; {len(o['low'])} of amp's in 16 bits alone" if o["low"] else ""
    return [f"optimizer offloaded to the host (ZeRO-Offload): host arena {format_bytes(o['host_arena_bytes'])}, of it "
            f"masters and state {format_bytes(o['host_bytes'])} ({o['host_bytes'] / values:.2f} bytes a value); the "
            f"device holds the params in {format_bytes(o['device_param_bytes'])} ({o['device_param_bytes'] / values:.2f}"
            f" bytes a value{low})"
            f" and {format_bytes(o['device_optimizer_bytes'])}"
            f" of optimizer state; each step copies {format_bytes(o['link_bytes'])} of params back (ZeRO-Offload's "
            "count with mixed precision: 2 bytes a value on the device, 12 on the host, divided by the data ranks "
            "from ZeRO-1 on)"]


def _tp_line(tp):
    return (f"tensor parallelism (Megatron's) splits {tp['column_layers']} of the model's linear layers by columns and "
            f"{tp['row_layers']} by rows: {len(tp['split'])} params split, {tp['replicated_params']} whole on every "
            "rank" + (f"; {tp['whole_regions']} region(s) it cannot split run whole (an LM head, a layer read "
                      "elsewhere)" if tp["whole_regions"] else ""))


def _inference_parallel_lines(d):
    """Which tensor-parallel rank's inference plan this is, beside the plan of one device."""
    tp = d.get("tensor_parallel")
    if not tp:
        return []
    bestfit = next(r["arena_bytes"] for r in d["rows"] if r["strategy"] == "bestfit")
    return [f"one of {tp['tp']} tensor-parallel ranks: the arena is one rank's, bestfit {format_bytes(bestfit)} "
            f"against {format_bytes(tp['unsharded_arena_bytes'])} on one device; its all-reduces send "
            f"{format_bytes(tp['collective_bytes'])} a run", _tp_line(tp)]


def _parallel_line(d):
    """Which rank's plan this is, under data parallelism (planner.parallel), beside the plain plan of its
    batch, and its model states beside the ZeRO paper's count."""
    p = d.get("parallel")
    if not p:
        return []
    ours, paper = p["model_states"]["plan"], p["model_states"]["zero_paper"]
    bestfit = next(r["arena_bytes"] for r in d["rows"] if r["strategy"] == "bestfit")
    rules = "".join([", shards in rows of the first dim (FSDP2's)" if p.get("shard") == "dim0" else "",
                     f", gathers {p['prefetch']} ahead" if p.get("prefetch") else "",
                     f", gradients reduced in {p['buckets']} bucket{'s' * (p['buckets'] > 1)} of "
                     f"{format_bytes(p['bucket_bytes'])}" if p.get("buckets") else ""])
    tp = p.get("tensor_parallel")
    pipe = p.get("pipeline")
    parts = [f"{p['dp']} data-parallel ranks, ZeRO-{p['zero']}{rules} (its own share of the batch)"
             if p["dp"] > 1 or p["zero"] or not (tp or pipe) else "",
             f"{tp['tp']} tensor-parallel ranks" if tp else "", f"{pipe['pp']} pipeline stages" if pipe else ""]
    ranks = ", and of ".join(part for part in parts if part)
    sent = ", ".join(f"{format_bytes(size)} over the {_GROUPS[group]} ranks"
                     for group, size in sorted(p.get("collective_bytes_by_group", {}).items()))
    lines = [f"one of {ranks}: the arena is one rank's, bestfit {format_bytes(bestfit)} against "
             f"{format_bytes(p['unsharded']['arena_bytes'])} for the same batch on one device; its collectives "
             f"send {sent or '0 B'} a step"]
    if tp:
        lines.append(_tp_line(tp))
    if pipe:
        arenas = pipe["arena_bytes"] or []
        parts = [f"pipeline stage {pipe['stage']} of {pipe['pp']}, {pipe['microbatches']} microbatch"
                 f"{'es' * (pipe['microbatches'] > 1)} a step in 1F1B order, {pipe['in_flight']} in flight here",
                 f"it sends {format_bytes(pipe['sent_bytes'])} a step to other stages",
                 *([f"every stage's arena: {', '.join(format_bytes(a) for a in arenas)} (the largest sets the "
                    "device memory a step needs; --stage S plans stage S)"] if arenas else []),
                 f"each stage's share of the step's FLOPs: {_shares([s['flops'] for s in pipe['stages']])}"]
        lines.append("; ".join(parts))
    return [*lines, f"model states of the rank: params {format_bytes(ours['params'])}, optimizer state "
            f"{format_bytes(ours['optimizer'])}, gradients {format_bytes(ours['gradients_at_peak'])} at the fullest "
            f"step; the ZeRO paper's count (DeepSpeed's estimators) of its "
            f"{'tensor-parallel piece' if tp else 'model'}: {format_bytes(paper['params'])}, "
            f"{format_bytes(paper['optimizer'])}, {format_bytes(paper['gradients'])} held throughout",
            *_batch_norm_line(p)]


def _batch_norm_line(p):
    """Whether the data ranks' BatchNormalizations normalise by their own rows or by the whole batch's."""
    norms, dp = p.get("batch_norms") or {}, p["dp"]
    if dp == 1 or not (norms.get("alone") or norms.get("synchronised")):
        return []
    if norms["synchronised"]:
        return [f"BatchNormalization: {norms['synchronised']} layers normalise by the statistics of the whole batch "
                f"of the {dp} data-parallel ranks, all-reduced (PyTorch's SyncBatchNorm)"]
    flag = say("Parallel(sync_batchnorm=True)", "--sync-batchnorm")
    return [f"warning: BatchNormalization: each of the {dp} data-parallel ranks normalises its own rows "
            f"({norms['alone']} layers, as DDP without SyncBatchNorm), so the ranks do not train as one process on "
            f"the whole batch; {flag} all-reduces the statistics"]


_GROUPS = {"dp": "data-parallel", "tp": "tensor-parallel", "pp": "pipeline", "world": "step's"}


def _shares(parts):
    """Each of `parts` as a percentage of their sum."""
    total = max(1, sum(parts))
    return ", ".join(f"{part / total:.0%}" for part in parts)


def _export_line(d):
    """A warning when a torch.export signature lists another number of nn.Parameters than train: the
    exporter folds buffers (rotary tables, causal masks) into initializers that look like weights."""
    listed, trained = d.get("exported_params"), d["trained_params"]
    if listed is None or listed == trained:
        return []
    frozen = say("frozen=[names]", "--frozen NAME")
    return [f"warning: the export's torch signature lists {listed} nn.Parameters but {trained} initializers train; "
            f"those folded from buffers (rotary tables, masks) or tied weights may differ: freeze buffers with {frozen}"]


def _loss_line(d):
    c = d["criterion"]
    if c["kind"] != "cross_entropy":
        return f"loss: {c['kind']} on {c['output']!r}"
    ignore = say("ignore_index", "--ignore-index")
    return (f"loss: cross_entropy over dim {c['class_axis']} of {c['output']!r} ({c['rule']}), "
            + (f"no {ignore}" if c["ignore_index"] is None else f"{ignore} {c['ignore_index']}"))


def _count(n):
    """A count of values as people read it: '9,216', '13.6 K', '1.2 M'."""
    for unit, scale in (("G", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= max(scale, 10**4):
            return f"{n / scale:.1f} {unit}"
    return f"{n:,}"


def _training_lines(report, d):
    eager, after = d["update_modes"]["eager"], d["update_modes"]["after_backward"]
    lines = [_params_line(d), *_export_line(d), *_parallel_line(d), *_offload_line(d), _loss_line(d),
             f"params updated as each gradient completes: arena {format_bytes(eager['arena_bytes'])} (gradients "
             f"{format_bytes(eager['breakdown']['grads'])} at the fullest step); all gradients, then the step: "
             f"{format_bytes(after['arena_bytes'])} (gradients {format_bytes(after['breakdown']['grads'])}) ({after['strategy']})",
             f"{'remat':<21} {'arena':>13} {'x LOAD':>7} {'saved at peak':>13} {'saved, most':>12} {'recompute':>10} "
             f"{'plan s':>7}"]
    for r in d["remat"]:
        if "dtr" in d and r["remat"].startswith("optimal"):
            t = d["dtr"]
            lines.append(f"dtr({format_bytes(t['budget_bytes'])}), simulated on the plan without recomputation: "
                         + (f"recomputes {t['recompute_share']:.1%} of the step's FLOPs ({t['evictions']} "
                            "evictions)" if t["feasible"] else "does not fit"))
        if "error" in r:
            lines.append(f"{r['remat']:<21} {r['error']}")
            continue
        lines.append(f"{r['remat']:<21} {format_bytes(r['arena_bytes']):>13} {r['x_load']:>7.3f} "
                     f"{format_bytes(r['saved_bytes']):>13} {format_bytes(r['saved_most_bytes']):>12} "
                     f"{r['recompute_share']:>10.1%} {r['plan_seconds']:>7.2f}"
                     + (f"  gap {r['gap']:.1%}" if "gap" in r else ""))
    lines.append("saved at peak: the forward values kept for the backward pass that the arena holds at its fullest "
                 "step (recomputed ones count as activations); saved, most: the most it holds at any step; "
                 "recompute: the share of the step's FLOPs computed again")
    return lines
