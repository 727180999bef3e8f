"""A transformers model from its config alone: built on PyTorch's meta device with transformers' own modeling
code, exported by torch.onnx (dynamo) without weights, its batch and sequence dims left free, and cached on
disk by the config's digest. memplan then plans it as it plans any weightless export (planner.deferred.Absent):
"will it fit?" asked of a 70B model on a laptop, without a byte of its weights.

    memplan report path/to/config.json --input input_ids:1x8192      (offline)
    memplan report hf:Qwen/Qwen2.5-7B --input input_ids:1x8192       (fetches config.json alone)

The model is built in float32 (`--precision` sets what a plan computes in), in eval mode for inference and
train mode for a training step (dropout as the config sets it), with the cache off; a mixture of experts
computes as frontends/hf_experts.py says. Needs the `memplan[hf]` extra (torch, transformers, onnxscript)."""
import contextlib
import hashlib
import io
import json
import os
import sys
import time
import warnings
from pathlib import Path

from planner.errors import ModelError, require

FORM = 2
"""The version of how this module builds and exports a model: part of the cache key, raised when that changes."""
HUB = "hf:"


def is_config(model):
    """Whether `model` names a transformers config: "hf:<model id>", or a .json file holding a config (a
    `model_type`); a .json file that holds neither that nor an ONNX model is refused in one line."""
    if isinstance(model, str) and model.startswith(HUB):
        return True
    if not (isinstance(model, (str, os.PathLike)) and os.fspath(model).lower().endswith(".json")
            and os.path.isfile(model)):
        return False
    doc = _json(model)
    if isinstance(doc, dict) and "model_type" in doc:
        return True
    if isinstance(doc, dict) and "graph" in doc:
        return False  # an ONNX model in JSON form, which onnx reads
    raise ModelError(f"{model} is JSON but neither a transformers config (no 'model_type') nor an ONNX model "
                     "(no 'graph')")


def exported(model, training=False, cache=None, step=None):
    """The path of the weightless ONNX export of the config `model` names (see is_config), in train mode for
    a `training` step: from the cache when this config was exported before, else exported now (a line on
    stderr says so and how long it took). `step` (tokens, length) exports it with a cache instead, for a step of
    generation (planner.Generation): past key/values of length - tokens positions in, present ones out, the
    batch dim free."""
    config = config_of(model)
    path = cache_path(config, training, cache, step)
    if path.is_file():
        return str(path)
    torch, transformers, _ = _modules()
    arch = _architecture(config, transformers)
    what = f"with a cache for {step[0]} tokens over {step[1]} positions" if step else \
        f"{'train' if training else 'eval'} mode"
    print(f"memplan: building {arch.__name__} from {model} on PyTorch's meta device and exporting it without "
          f"weights ({what}; once, cached in {path.parent})", file=sys.stderr, flush=True)
    start = time.perf_counter()
    proto = _export(arch, config, training, torch) if step is None else _export_with_cache(arch, config, step, torch)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.part")
    import onnx
    onnx.save(proto, partial)
    os.replace(partial, path)
    print(f"memplan: exported {len(proto.graph.node):,} nodes in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return str(path)


def cache_path(config, training=False, cache=None, step=None):
    """Where the export of a transformers `config` (in train mode for `training`; with a cache for a generation
    `step`) is cached: the file is there where it was exported before."""
    suffix = "" if step is None else f"-cache-{step[0]}-{step[1]}"
    return Path(cache or _cache_dir()) / f"{_digest(config, training)}{suffix}.onnx"


def config_of(model):
    """The transformers config `model` names (see is_config)."""
    return _config(_config_dict(model), model)


def _json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelError(f"{path} is not readable JSON ({type(e).__name__}: {e})") from None


def _config_dict(model):
    """The config's JSON object: the file's, or the Hub's config.json of "hf:<model id>" (nothing else of the
    repository is fetched; HF_HUB_OFFLINE=1 reads the local cache alone)."""
    if not model.startswith(HUB):
        return _json(model)
    repo = model[len(HUB):]
    hub = require("huggingface_hub", "a model from the Hub", "huggingface_hub", "hf")
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    try:
        return _json(hub.hf_hub_download(repo_id=repo, filename="config.json"))
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError, ValueError) as e:
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelError(f"{model}: cannot fetch its config.json from the Hugging Face Hub ({why}); a gated model "
                         "needs HF_TOKEN, and a machine off the network the path of a config.json") from None


def _config(doc, model):
    """The transformers config of the JSON object `doc`."""
    _, transformers, _ = _modules()
    kind = doc.get("model_type") if isinstance(doc, dict) else None
    if kind not in transformers.CONFIG_MAPPING:
        raise ModelError(f"{model}: transformers {transformers.__version__} knows no model_type {kind!r}")
    try:
        with _quiet(transformers):
            config = transformers.CONFIG_MAPPING[kind].from_dict(doc)
    except (TypeError, ValueError, KeyError) as e:
        raise ModelError(f"{model}: not a valid {kind} config ({type(e).__name__}: {e})") from None
    config.use_cache = False
    return config


def _architecture(config, transformers):
    """The model class the config names (its first `architectures` entry transformers has), else the causal LM
    of its type, else its bare model."""
    for name in getattr(config, "architectures", None) or ():
        if hasattr(transformers, name):
            return getattr(transformers, name)
    for auto in (transformers.AutoModelForCausalLM, transformers.AutoModel):
        if type(config) in auto._model_mapping:
            return auto._model_mapping[type(config)]
    raise ModelError(f"transformers has no model class for config {type(config).__name__}")


def _digest(config, training):
    """The cache key: the config as transformers reads it, the mode, and the versions that shape the export."""
    torch, transformers, onnxscript = _modules()
    text = json.dumps([FORM, training, torch.__version__, transformers.__version__, onnxscript.__version__,
                       config.to_dict()], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _cache_dir():
    """$MEMPLAN_CACHE/hf, by default ~/.cache/memplan/hf (XDG_CACHE_HOME's)."""
    base = os.environ.get("MEMPLAN_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "memplan")
    return os.path.join(base, "hf")


def _modules():
    """torch, transformers and onnxscript, which the `hf` extra brings."""
    return tuple(require(name, "a model from its config", name, "hf")
                 for name in ("torch", "transformers", "onnxscript"))


def _forward(model, names, torch):
    """A module of the token inputs `names` (positional, for the export) giving the model's first output: its
    logits, else its last hidden state."""
    class Forward(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *ids):
            out = self.model(**dict(zip(names, ids)))
            return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state
    return Forward()


def _with_cache(model, layers, torch, transformers):
    """A module of the tokens, attention mask, positions and each layer's past key and value (as tensors) giving
    the logits and each layer's present key and value: Optimum's decoder-with-past layout."""
    class WithCache(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, position_ids, *past):
            cache = transformers.DynamicCache()
            for i in range(layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             past_key_values=cache, use_cache=True)
            return (out.logits, *[t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)])
    return WithCache().eval()


def _export(arch, config, training, torch):
    """The ModelProto of `arch` built from `config` on the meta device, exported with its weights as typed inputs
    without data and onnxscript's optimizer run over it (what torch.onnx.export does by default, which it cannot
    do itself on meta tensors)."""
    names = ["input_ids", "decoder_input_ids"] if getattr(config, "is_encoder_decoder", False) else ["input_ids"]
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("sequence", max=1 << 20)

    def build(model):
        model.train(training)
        output = "logits" if _has_head(model) else "last_hidden_state"
        return (_forward(model, names, torch), tuple(torch.zeros((2, 16), dtype=torch.int64) for _ in names),
                dict(input_names=names, output_names=[output],
                     dynamic_shapes=(tuple({0: batch, 1: seq} for _ in names),)))
    return _onnx(arch, config, build, torch)


def _export_with_cache(arch, config, step, torch):
    """The ModelProto of `arch`'s causal LM with a cache (_with_cache) for a step of `tokens` positions over a cache
    of `length`, built and exported as _export does, every dim but the batch fixed."""
    import transformers
    tokens, length = step
    if getattr(config, "is_encoder_decoder", False) or not _has_head(arch):
        raise ModelError(f"{arch.__name__} is not a causal LM: generation plans a decoder with a cache")
    text = config.get_text_config()
    layers, heads = text.num_hidden_layers, text.num_attention_heads
    kv = getattr(text, "num_key_value_heads", None) or heads
    size = getattr(text, "head_dim", None) or text.hidden_size // heads
    pasts = [f"past_key_values.{i}.{kv_}" for i in range(layers) for kv_ in ("key", "value")]
    batch = torch.export.Dim("batch")

    def build(model):
        model.eval()
        ids, positions = torch.zeros((2, tokens), dtype=torch.int64), torch.zeros((2, tokens), dtype=torch.int64)
        past = tuple(torch.zeros((2, kv, length - tokens, size)) for _ in pasts)
        return (_with_cache(model, layers, torch, transformers), (ids, torch.ones((2, length), dtype=torch.int64),
                                                                  positions, *past),
                dict(input_names=["input_ids", "attention_mask", "position_ids", *pasts],
                     output_names=["logits", *(p.replace("past_key_values", "present") for p in pasts)],
                     dynamic_shapes=({0: batch}, {0: batch}, {0: batch}, tuple({0: batch} for _ in pasts))))
    return _onnx(arch, config, build, torch)


def _onnx(arch, config, build, torch):
    """The ModelProto of the module, example inputs and torch.onnx.export keywords `build(model)` gives for `arch`
    built from `config` on the meta device: its weights typed inputs without data, onnxscript's optimizer run over
    it (what torch.onnx.export does by default, which it cannot do itself on meta tensors)."""
    import onnxscript
    import transformers
    from . import hf_experts
    hf_experts.register()
    try:
        with torch.device("meta"), _quiet(transformers), contextlib.redirect_stdout(io.StringIO()):
            model = arch._from_config(config, dtype=torch.float32, experts_implementation=hf_experts.NAME)
            module, inputs, keywords = build(model)
            program = torch.onnx.export(module, inputs, dynamo=True, optimize=False, **keywords)
            buffer = io.BytesIO()
            program.save(buffer, include_initializers=False, keep_initializers_as_inputs=True)
    except ModelError:
        raise
    except Exception as e:  # torch.export's failures are many and deep; one line names the model and the first
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelError(f"torch.onnx could not export {arch.__name__} built from its config ({type(e).__name__}: "
                         f"{why})") from None
    import onnx
    proto = onnxscript.optimizer.optimize(onnx.load_from_string(buffer.getvalue()))
    proto.graph.name = arch.__name__
    return proto


@contextlib.contextmanager
def _quiet(transformers):
    """transformers' log lines and Python's warnings silenced: what memplan reports is its one line."""
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        transformers.logging.set_verbosity(verbosity)


def _has_head(model):
    """Whether the model (or model class) computes logits."""
    name = model.__name__ if isinstance(model, type) else type(model).__name__
    return hasattr(model, "lm_head") or name.endswith(("ForCausalLM", "ForMaskedLM", "ForConditionalGeneration"))
