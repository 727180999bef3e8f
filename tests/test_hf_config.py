"""Models planned without their weights: transformers configs built on the meta device and exported weightless
(frontends/hf_config.py), ONNX files whose weights are typed and shaped but hold no data, and external data that
is not there. Each plans as the model with its weights does, trains its params as params, and no Executor runs it."""
import json
import pickle
import subprocess
import sys

import numpy as np
import onnx
import pytest

import planner
from planner.allocators import align
from planner.plan import ALIGNMENT
from executor import Executor
from frontends import hf_config, onnx_frontend
from exports import Output
from hf_configs import CONFIGS

pytest.importorskip("transformers")
pytest.importorskip("onnxscript")
torch = pytest.importorskip("torch")

SHAPES = {"input_ids": (2, 24)}


@pytest.fixture
def cache(tmp_path_factory, monkeypatch):
    """One export cache for the session's workers, so that a config exported once serves every test."""
    path = tmp_path_factory.getbasetemp().parent / "memplan-hf-cache"
    monkeypatch.setenv("MEMPLAN_CACHE", str(path))
    return path


def _config(tmp_path, family):
    path = tmp_path / f"{family}.json"
    path.write_text(json.dumps(CONFIGS[family]))
    return str(path)


def _shapes(family):
    return {**SHAPES, "decoder_input_ids": SHAPES["input_ids"]} if family == "t5" else SHAPES


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_every_family_trains_from_its_config(family, tmp_path, cache):
    """A training step of each family from its config alone: every weight absent, every nn.Parameter the export's
    signature lists trained as a param (its buffers not), the plan verified, and no Executor runs it."""
    path = _config(tmp_path, family)
    plan = planner.compile(path, _shapes(family), training=True, optimizer="adam")
    exported = onnx.load(hf_config.exported(path, training=True))  # from the cache
    kinds = {i.name: {p.key: p.value for p in i.metadata_props}.get(onnx_frontend.TORCH_INPUT_KIND)
             for i in exported.graph.input}
    assert sorted(plan.training["params"]) == sorted(n for n, kind in kinds.items() if kind == "PARAMETER")
    assert plan.weights_absent == sorted(n for n, kind in kinds.items() if kind in onnx_frontend.WEIGHT_INPUTS)
    params = plan.training["params"]
    assert plan.breakdown["optimizer"] == 2 * sum(align(plan.tensors[p].nbytes, ALIGNMENT) for p in params)
    with pytest.raises(planner.MemplanError, match="without the model's weights"):
        Executor(plan)


@pytest.mark.parametrize("family", ["llama3", "mixtral", "t5", "bert"])
def test_inference_from_a_config(family, tmp_path, cache):
    """Inference plans of an eval-mode export, at two sequence lengths of the one export (its dims are free)."""
    path = _config(tmp_path, family)
    short = planner.compile(path, _shapes(family))
    longer = planner.compile(path, {n: (2, 96) for n in _shapes(family)})
    assert short.weights_absent and longer.arena_bytes > short.arena_bytes
    assert [s.op for s in short.steps] == [s.op for s in longer.steps]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A small LLaMA exported with random weights by torch.onnx (dynamo, its defaults): (its path, the model)."""
    import transformers
    config = transformers.LlamaConfig(**{k: v for k, v in CONFIGS["llama2"].items() if k != "model_type"})
    model = transformers.LlamaForCausalLM(config)
    ids = torch.zeros((2, 16), dtype=torch.int64)
    dims = {0: torch.export.Dim("batch"), 1: torch.export.Dim("sequence", max=1024)}
    path = tmp_path_factory.mktemp("llama") / "model.onnx"
    program = torch.onnx.export(Output(model, ["input_ids"], "logits", use_cache=False).eval(), (ids,), dynamo=True,
                                input_names=["input_ids"], output_names=["logits"], dynamic_shapes=((dims,),))
    program.save(str(path))
    return path, onnx.load(str(path))


def _weights(model):
    """The float initializers of more than one element."""
    return [i for i in model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT and np.prod(i.dims) > 1]


def _same(a, b):
    assert (a.arena_bytes, a.breakdown, a.lower_bound_bytes) == (b.arena_bytes, b.breakdown, b.lower_bound_bytes)
    assert [(s.op, s.inputs, s.outputs) for s in a.steps] == [(s.op, s.inputs, s.outputs) for s in b.steps]
    places = [{n: (t.offset, t.nbytes) for n, t in plan.tensors.items()} for plan in (a, b)]
    assert places[0] == places[1]


@pytest.mark.parametrize("training", [False, True])
def test_weightless_file_plans_as_with_its_weights(training, exported):
    """The same export with its weights' data cleared (typed, shaped initializers without data) plans to the byte
    as with them, inference and training, and names every cleared weight absent."""
    model = exported[1]
    cleared = onnx.ModelProto()
    cleared.CopyFrom(model)
    names = [i.name for i in _weights(cleared)]
    for init in _weights(cleared):
        init.ClearField("raw_data")
        init.ClearField("float_data")
    options = {"training": True, "optimizer": "adamw"} if training else {}
    full = planner.compile(model, SHAPES, **options)
    weightless = planner.compile(cleared, SHAPES, **options)
    _same(full, weightless)
    assert not full.weights_absent and weightless.weights_absent == sorted(names)
    if training:
        assert weightless.training["params"] == full.training["params"]


def test_missing_external_data_takes_an_explicit_option(exported, tmp_path):
    """External data that is not there is an error that names the option; with weights=False it is not read
    (there or not), and the plan is the one with the weights."""
    model = exported[1]
    onnx.save(model, tmp_path / "model.onnx", save_as_external_data=True, location="model.data")
    full = planner.compile(str(tmp_path / "model.onnx"), SHAPES)
    _same(full, planner.compile(str(tmp_path / "model.onnx"), SHAPES, weights=False))
    (tmp_path / "model.data").unlink()
    with pytest.raises(planner.ModelError, match="is missing .*weights=False"):
        planner.compile(str(tmp_path / "model.onnx"), SHAPES)
    weightless = planner.compile(str(tmp_path / "model.onnx"), SHAPES, weights=False)
    _same(full, weightless)
    saved = onnx.load(str(tmp_path / "model.onnx"), load_external_data=False).graph.initializer
    external = [i.name for i in saved if onnx.external_data_helper.uses_external_data(i)]
    assert weightless.weights_absent == sorted(external)


def test_weightless_plan_file_round_trip(tmp_path, cache):
    """A weightless plan written and read back (or pickled, as fit's workers do) keeps its absent weights, and is
    still refused by the Executor."""
    plan = planner.compile(_config(tmp_path, "gpt2"), SHAPES)
    plan.to_json(tmp_path / "plan.json")
    back = planner.Plan.from_json(tmp_path / "plan.json")
    assert back.weights_absent == plan.weights_absent and back.arena_bytes == plan.arena_bytes
    assert pickle.loads(pickle.dumps(plan)).weights_absent == plan.weights_absent
    with pytest.raises(planner.MemplanError, match="without the model's weights"):
        Executor(back)


def _cli(*argv, **env):
    import os
    return subprocess.run([sys.executable, "-m", "planner.cli", *argv], capture_output=True, text=True,
                          env={**os.environ, **env})


def test_report_of_a_config_on_the_command_line(tmp_path, cache):
    done = _cli("report", _config(tmp_path, "qwen2"), "--input", "input_ids:2x24", "--training", "--strategy",
                "bestfit", MEMPLAN_CACHE=str(cache))
    assert done.returncode == 0, done.stderr
    assert "Qwen2ForCausalLM: input_ids (2, 24)" in done.stdout
    assert "weights absent (27 planned from their shapes alone" in done.stdout


@pytest.mark.parametrize("text, says", [
    ('{"a": 1}', "neither a transformers config .* nor an ONNX model"),
    ("{not json", "is not readable JSON"),
    ('{"model_type": "no_such_model"}', "knows no model_type 'no_such_model'"),
])
def test_bad_json_is_one_line(text, says, tmp_path):
    path = tmp_path / "model.json"
    path.write_text(text)
    with pytest.raises(planner.ModelError, match=says):
        planner.compile(str(path), SHAPES)
    done = _cli("report", str(path), "--input", "input_ids:1x8")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_hub_model_id_from_the_local_cache(tmp_path, cache, monkeypatch):
    """hf:<model id> reads config.json alone, here from the Hub's local cache with the network off; an id that is
    not there is one line."""
    snapshot = tmp_path / "hub" / "models--tiny--llama" / "snapshots" / "0123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(CONFIGS["llama2"]))
    (tmp_path / "hub" / "models--tiny--llama" / "refs").mkdir()
    (tmp_path / "hub" / "models--tiny--llama" / "refs" / "main").write_text("0123")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    import huggingface_hub.constants
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    plan = planner.compile("hf:tiny/llama", SHAPES)
    assert plan.weights_absent
    with pytest.raises(planner.ModelError, match="hf:tiny/nothing: cannot fetch its config.json"):
        planner.compile("hf:tiny/nothing", SHAPES)


def test_an_export_is_cached_by_the_config(tmp_path, monkeypatch):
    """A config is exported once: the second compile reads the cached file; another config is another file."""
    monkeypatch.setenv("MEMPLAN_CACHE", str(tmp_path / "cache"))
    path = _config(tmp_path, "gpt_neox")
    planner.compile(path, SHAPES)
    files = sorted((tmp_path / "cache" / "hf").glob("*.onnx"))
    planner.compile(path, SHAPES)
    assert sorted((tmp_path / "cache" / "hf").glob("*.onnx")) == files and len(files) == 1
    changed = tmp_path / "wider.json"
    changed.write_text(json.dumps({**CONFIGS["gpt_neox"], "intermediate_size": 256}))
    planner.compile(str(changed), SHAPES)
    assert len(list((tmp_path / "cache" / "hf").glob("*.onnx"))) == 2


@pytest.mark.parametrize("family, window", [("llama2", 0), ("mistral", 8)])
def test_masks_too_large_to_fold_are_read_by_rows(family, window, tmp_path, cache, monkeypatch):
    """A causal mask built from index comparisons that planning cannot fold whole (8,192 tokens make 67 M elements)
    is read a block of rows at a time: the attention gets the same causal band, or sliding window, and the plan
    the same arena as where the mask folds whole."""
    from planner.passes import mask_rows
    fuse_attention = sys.modules["planner.passes.fuse_attention"]
    path, shapes = _config(tmp_path, family), {"input_ids": (2, 200)}  # a mask past shape inference's fold limit
    whole = planner.compile(path, shapes, training=True)
    monkeypatch.setattr(fuse_attention, "PROBE_LIMIT", 16)
    monkeypatch.setattr(mask_rows, "ROWS", 64)
    by_rows = planner.compile(path, shapes, training=True)
    for plan in (whole, by_rows):
        attention = [s for s in plan.steps if s.op == "ScaledDotProductAttention"]
        assert attention and all(s.attrs["causal"] == 1 and s.attrs["window"] == window and len(s.inputs) == 3
                                 for s in attention)
    assert by_rows.arena_bytes == whole.arena_bytes
    monkeypatch.setattr(mask_rows, "ROWS", 1 << 23)
    monkeypatch.setattr(fuse_attention, "PROBE_LIMIT", 0)
    assert planner.compile(path, shapes, training=True).arena_bytes == whole.arena_bytes
