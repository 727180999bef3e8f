"""The zoo models at reduced sizes that the tests plan and run, with their input shapes, feeds and
onnxruntime's outputs."""
import traceback
from functools import lru_cache

import numpy as np

from executor import Executor
from frontends import zoo

SEQ = 16
CASES = {
    "mlp": ("mlp", dict(in_features=32, hidden=(16, 8), classes=5)),
    "lenet": ("lenet", {}),
    "resnet18": ("resnet18", dict(resolution=32, width=8, classes=10)),
    "resnet50": ("resnet50", dict(resolution=64, width=16, classes=10)),
    "mobilenet_v2": ("mobilenet_v2", dict(resolution=32, width_mult=0.25, classes=10)),
    "vgg16": ("vgg16", dict(resolution=32, classes=10)),
    "densenet121": ("densenet121", dict(growth=8, blocks=(2, 3), init_features=16, resolution=32, classes=10)),
    "unet": ("unet", dict(depth=3, channels=8, resolution=32)),
    "unet_resize": ("unet", dict(depth=2, channels=8, resolution=16, upsample="resize")),
    "bert_base": ("bert_base", dict(layers=2, hidden=64, heads=4, intermediate=128, vocab=100,
                                    max_positions=32, pooler=True)),
    "gpt2_small": ("gpt2_small", dict(layers=2, hidden=64, heads=4, vocab=100, max_positions=32)),
    "resnet_deep": ("resnet_deep", dict(depth=8, channels=16, resolution=16)),
}
BATCHES = (1, 3)


@lru_cache(maxsize=None)
def small_model(case):
    """The ONNX model of a case (cached: tests must not change it)."""
    name, options = CASES[case]
    return zoo.build(name, **options)


def input_shapes(model, batch):
    """Each graph input's concrete shape: "batch" -> batch, "seq" -> SEQ."""
    dims = {"batch": batch, "seq": SEQ}
    return {vi.name: tuple(dims[d.dim_param] if d.dim_param else d.dim_value for d in vi.type.tensor_type.shape.dim)
            for vi in model.graph.input}


def feeds(model, batch):
    rng = np.random.default_rng(batch)
    feeds = {}
    for name, shape in input_shapes(model, batch).items():
        if name == "input_ids":
            feeds[name] = rng.integers(0, 100, shape, dtype=np.int64)
        elif name == "attention_mask":
            feeds[name] = (np.arange(SEQ) < rng.integers(SEQ // 2, SEQ + 1, (shape[0], 1))).astype(np.int64)
        else:
            feeds[name] = rng.standard_normal(shape, dtype=np.float32)
    return feeds


def reference(case, batch=2):
    """The case's model, its feeds at `batch`, and onnxruntime's outputs {name: array} on them."""
    import onnxruntime as ort
    model = small_model(case)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    inputs = feeds(model, batch)
    names = [o.name for o in model.graph.output]
    return model, inputs, dict(zip(names, session.run(None, inputs)))


def rel_l2(got, want):
    """||got - want|| / ||want||, in float64."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)


def run_on(backend, plan, feeds, **options):
    """Run `plan` once on `backend` ("numpy" or "cupy") with poison on; its outputs as NumPy arrays."""
    outputs = Executor(plan, backend=backend, poison=True, **options).run(feeds)
    return {name: host(value) for name, value in outputs.items()}


def host(array):
    """A NumPy array of a NumPy or CuPy array (CuPy's copy to the host)."""
    return array if isinstance(array, np.ndarray) else array.get()


def assert_program_allocates_nothing(cupy, ex):
    """Run every kernel of a CuPy executor's program once under an allocator that raises, naming the
    step that allocated and the innermost lines of memplan's code it was in."""
    def refuse(size):
        frames = [f for f in traceback.extract_stack() if "/executor/" in f.filename or "/planner/" in f.filename]
        ours = [f"{'/'.join(f.filename.split('/')[-2:])}:{f.lineno} {f.line}" for f in frames]
        raise AssertionError(f"the executor allocated {size} bytes while running, at {' <- '.join(ours[::-1][:3])}")

    with cupy.cuda.using_allocator(refuse):
        for bound in filter(None, ex.program):
            fn, step, ins, outs, ws = bound
            try:
                fn(ex.runtime.xp, step, ins, outs, ws)
            except AssertionError as e:
                raise AssertionError(f"step {step.name!r} ({step.op}): {e}") from None

