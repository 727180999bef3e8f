"""Plan files refused with one clear PlanError: broken JSON, files too large to be a plan, fields of the wrong
type, plans that verify() rejects (negative or inconsistent sizes, unknown dtypes, names without a place,
tensors outside the arena), plans changed after they were written, steps that do not fit their op, and
params' values missing, incomplete, with headers that do not fit, or from another plan."""
import io
import json
import re
import shutil
import time
import zipfile
from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import planner
from executor import Executor
from isolation import isolated
from planner import Plan, PlanError
from planner import plan as plan_module
from planner.plan import PlannedTensor, Step, document_digest


@pytest.fixture(scope="module")
def mlp():
    return planner.compile("zoo:mlp", {"input": (2, 784)}, pretranspose=False)  # its params keep their names


@pytest.fixture
def saved(mlp, tmp_path):
    return mlp.to_json(tmp_path / "plan.json")


def edit(path, change, signed=False):
    """Rewrite the JSON at `path` with `change(doc)` applied; `signed`: with its digest made anew, as a plan
    written by hand would have."""
    doc = json.loads(path.read_text())
    change(doc)
    if signed:
        doc["digest"] = document_digest(doc)
    path.write_text(json.dumps(doc))
    return path


def tensor(doc, name):
    return next(t for t in doc["tensors"] if t["name"] == name)


def feed():
    return {"input": np.random.default_rng(0).standard_normal((2, 784), dtype=np.float32)}


def test_round_trip_keeps_tensors_steps_and_values(mlp, saved):
    again = Plan.from_json(saved)
    assert again.tensors == mlp.tensors and again.steps == mlp.steps and again.arena_bytes == mlp.arena_bytes
    assert again.data.keys() == mlp.data.keys()
    for name, value in mlp.data.items():
        np.testing.assert_array_equal(again.data[name], value)
    assert saved.with_suffix(".npz").is_file()


def test_an_unused_negative_tensor_no_longer_hides_an_overlap(mlp, saved):
    # The second layer's Gemm output is moved onto the third layer's bias, which the last Gemm still
    # reads; an unused "ghost" of -256 bytes at the same offset, sorting between them, used to keep
    # the sweep from comparing the two, and the plan ran with wrong outputs.
    bias = mlp.tensors["layers.2.bias"].offset

    def overlap(doc):
        for name in ("/layers/1/Gemm_output_0", "/layers/1/Relu_output_0"):
            tensor(doc, name)["offset"] = bias

    def ghost(doc):
        overlap(doc)
        doc["tensors"].append(dict(tensor(doc, "/layers/1/Gemm_output_0"), name="ghost", shape=[-64], nbytes=-256,
                                   lifetime=[1, 4]))

    with pytest.raises(PlanError, match="overlap"):
        Plan.from_json(edit(saved, overlap))
    with pytest.raises(PlanError, match=r"plan.json: tensor 'ghost': shape \(-64,\) and nbytes -256 must not be "
                                        "negative"):
        Plan.from_json(edit(saved, ghost))


@pytest.mark.parametrize("change,message", [
    (lambda d: d.pop("arena_bytes"), "field 'arena_bytes' is missing"),
    (lambda d: d.update(arena_bytes="12"), "field 'arena_bytes' must be an int, got '12'"),
    (lambda d: d.update(arena_bytes=True), "field 'arena_bytes' must be an int, got True"),
    (lambda d: d.update(inputs="input"), "field 'inputs' must be a list of strings"),
    (lambda d: d.update(colour="red"), "unknown field 'colour'"),
    (lambda d: d.update(tensors={}), "field 'tensors' must be a list"),
    (lambda d: d["tensors"].__setitem__(0, 5), r"tensors\[0\] must be an object, got 5"),
    (lambda d: d["tensors"][0].update(shape=["a"]), r"tensors\[0\]: field 'shape' must be a list of ints"),
    (lambda d: d["tensors"][0].update(shape=[2.5]), r"tensors\[0\]: field 'shape' must be a list of ints"),
    (lambda d: d["tensors"][0].update(dtype=5), "field 'dtype' must be a string"),
    (lambda d: d["tensors"][6].update(lifetime=[1]), "field 'lifetime' must be null or two ints"),
    (lambda d: d["tensors"][6].update(lifetime="always"), "field 'lifetime' must be null or two ints"),
    (lambda d: d["tensors"][0].update(view="no"), "field 'view' must be true or false"),
    (lambda d: d["tensors"][0].pop("role"), r"tensors\[0\]: field 'role' is missing"),
    (lambda d: d["tensors"].append(d["tensors"][0]), "a second tensor named 'layers.0.weight'"),
    (lambda d: d["steps"][0].update(inputs=[1]), r"steps\[0\]: field 'inputs' must be a list of strings"),
    (lambda d: d["steps"][0].update(attrs=[]), r"steps\[0\]: field 'attrs' must be an object"),
    (lambda d: d["steps"][0].update(phase="sideways"), "field 'phase' must be one of"),
    (lambda d: d["steps"][0].update(attrs={"value": {"ndarray": [1, 2], "dtype": "float99", "shape": [2]}}),
     r"steps\[0\]: attribute 'value' is not an encoded array"),
    (lambda d: d["steps"][0].update(attrs={"value": {"ndarray": [1, 2], "dtype": "<f4", "shape": [3]}}),
     "attribute 'value' is not an encoded array"),
    (lambda d: d["steps"][0]["inputs"].__setitem__(2, "nope"), "uses 'nope', which the plan does not place"),
    (lambda d: d["steps"][0].update(scratch=[{"name": "rows"}]),
     r"steps\[0\]: scratch\[0\]: field 'offset' is missing"),
    (lambda d: d["steps"][0].update(scratch=[{"name": "rows", "offset": 0, "shape": [4], "dtype": "float32"}]),
     r"scratch 'rows' \(float32, bytes 0 to 16\) does not lie in its workspace of 0 bytes"),
    (lambda d: d["tensors"][0].update(kind="weight"), "tensor 'layers.0.weight': kind 'weight' is not one of"),
    (lambda d: d["tensors"][6].update(role="hero"), "tensor 'input': role 'hero' is not one of"),
    (lambda d: d["tensors"][0].update(dtype="float33"), "dtype 'float33' is not a numeric or bool NumPy dtype"),
    (lambda d: d["tensors"][0].update(dtype="object"), "dtype 'object' is not a numeric or bool NumPy dtype"),
    (lambda d: d["tensors"][0].update(nbytes=d["tensors"][0]["nbytes"] - 4), "nbytes 1605628 differs from its "
                                                                              r"shape \(512, 784\) of float32"),
    (lambda d: d["tensors"][6].update(lifetime=[0, 99]), r"lifetime \(0, 99\) is not within steps 0 to 5"),
    (lambda d: d.update(outputs=["ghost"]), "graph output 'ghost' has no place in the plan"),
    (lambda d: d.update(inputs=["ghost"]), "graph input 'ghost' has no place in the plan"),
    (lambda d: d.update(arena_bytes=d["arena_bytes"] - 256), "fall outside the arena"),
    (lambda d: d["stats"].update(persistent_bytes="all"), "stats.persistent_bytes 'all' must be an int"),
    (lambda d: d.update(format="memplan-plan/2"), "not a memplan plan of format 'memplan-plan/7'"),
    (lambda d: d.update(values_digest=5), "field 'values_digest' must be null or a string"),
    (lambda d: d.pop("digest"), "field 'digest' is missing"),
])
def test_a_broken_field_is_named(saved, change, message):
    with pytest.raises(PlanError, match=message) as caught:
        Plan.from_json(edit(saved, change))
    assert str(caught.value).startswith(str(saved))


def test_an_unused_tensor_must_lie_inside_the_arena(saved):
    def unused(doc):
        doc["tensors"].append(dict(tensor(doc, "input"), name="unused", offset=doc["arena_bytes"]))

    with pytest.raises(PlanError, match=r"tensor 'unused': bytes \[\d+, \d+\) fall outside the arena"):
        Plan.from_json(edit(saved, unused))


def test_training_names_are_checked(tmp_path):
    plan = planner.compile("zoo:mlp", {"input": (2, 784)}, training=True)
    path = plan.to_json(tmp_path / "step.json")
    with pytest.raises(PlanError, match="training loss 'nope' has no place in the plan"):
        Plan.from_json(edit(path, lambda d: d["training"].update(loss="nope")))
    with pytest.raises(PlanError, match="training args .* must give the learning rate 'lr' as a number"):
        Plan.from_json(edit(path, lambda d: d["training"].update(args={})))
    with pytest.raises(PlanError, match="training params must be a list of names"):
        Plan.from_json(edit(path, lambda d: d["training"].update(params=3)))
    sharded = edit(plan.to_json(tmp_path / "sharded.json"),
                   lambda d: d["training"].update(parallel={"sharded": ["layers.0.bias"]}), signed=True)
    with pytest.raises(PlanError, match=r"sharded.npz: the plan's training facts do not say how 'layers.0.bias' is "
                                        r"split or sharded \(KeyError: 'dp'\)"):
        Plan.from_json(sharded)


@pytest.mark.parametrize("content,message", [
    (None, r"cannot read the plan \(No such file or directory\)"),
    ("dir", r"cannot read the plan \(Is a directory\)"),
    (b"\xff\xfe\x00", "not UTF-8 text"),
    ("", "invalid JSON: Expecting value at line 1 column 1"),
    ("{", "invalid JSON"),
    ("[" * 100000, "invalid JSON"),
    ("[]", "not a memplan plan of format 'memplan-plan/7' \\(found 'list'\\)"),
    ('{"format": "memplan-plan/7"}', "field 'strategy' is missing"),
])
def test_an_unreadable_file_is_a_plan_error(tmp_path, content, message):
    path = tmp_path / "plan.json"
    if content == "dir":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(PlanError, match=message):
        Plan.from_json(path)


def test_verify_rejects_sizes_and_dtypes_in_memory(mlp):
    t = mlp.tensors["input"]
    for bad, message in [(replace(t, nbytes=-256, shape=(-64,)), "must not be negative"),
                         (replace(t, nbytes=t.nbytes * 2), "differs from its shape"),
                         (replace(t, dtype="float33"), "dtype 'float33'"),
                         (replace(t, name="other"), "filed under the name 'input'")]:
        with pytest.raises(PlanError, match=message):
            replace(mlp, tensors={**mlp.tensors, "input": bad}).verify()


def chain_plan(n):
    """n Relu steps over (1, 64) float32 rows that ping-pong between two 256-byte buffers."""
    names = [f"t{k}" for k in range(n + 1)]
    kinds = ["input", *["activation"] * (n - 1), "output"]
    tensors = {name: PlannedTensor(name, (1, 64), "float32", kind, 256, 256 * (k % 2), (max(k - 1, 0), min(k, n)))
               for k, (name, kind) in enumerate(zip(names, kinds))}
    tensors[names[-1]] = replace(tensors[names[-1]], lifetime=(n - 1, n))
    steps = tuple(Step(f"s{k}", "Relu", (names[k],), (names[k + 1],), {}) for k in range(n))
    return Plan("naive", "file", 512, 512, {}, tensors, steps, (names[0],), (names[-1],))


def test_verify_stays_fast_on_100k_tensors():
    plan = chain_plan(100_000)
    start = time.perf_counter()
    plan.verify()
    assert time.perf_counter() - start < 10


def npz_of(path):
    with np.load(path.with_suffix(".npz")) as npz:
        return {k: npz[k] for k in npz.files}


def test_missing_values_file(saved):
    saved.with_suffix(".npz").unlink()
    with pytest.raises(PlanError, match=r"plan.npz: missing; it holds the values of the plan's params"):
        Plan.from_json(saved)


@pytest.mark.parametrize("change,message", [
    (lambda v: v.pop("layers.0.weight"), "plan.npz: no value for param 'layers.0.weight'"),
    (lambda v: v.update({"layers.0.bias": np.zeros(3, np.float32)}),
     r"param 'layers.0.bias' is \(3,\) float32, but the plan places it as \(512,\) float32"),
    (lambda v: v.update({"layers.0.bias": np.zeros(512)}), r"param 'layers.0.bias' is \(512,\) float64"),
    (lambda v: v.update(extra=np.zeros(1)), "holds a value for 'extra', which is not a param or const"),
    (lambda v: v.update({"layers.0.bias": v["layers.0.bias"] + 1}), "these values do not belong to .*plan.json"),
])
def test_incomplete_or_stale_values_are_refused(saved, change, message):
    values = npz_of(saved)
    change(values)
    np.savez(saved.with_suffix(".npz"), **values)
    with pytest.raises(PlanError, match=message):
        Plan.from_json(saved)


def test_values_of_another_plan_are_refused(mlp, saved, tmp_path):
    other = replace(mlp, data={k: v * 2 for k, v in mlp.data.items()}).to_json(tmp_path / "other.json")
    shutil.copy(other.with_suffix(".npz"), saved.with_suffix(".npz"))
    with pytest.raises(PlanError, match="digest differs"):
        Plan.from_json(saved)


@pytest.mark.parametrize("content", [b"not a zip", b"PK\x03\x04broken"])
def test_an_unreadable_values_file(saved, content):
    saved.with_suffix(".npz").write_bytes(content)
    with pytest.raises(PlanError, match="plan.npz: cannot read the values"):
        Plan.from_json(saved)


def test_a_npy_in_place_of_the_npz(saved):
    with open(saved.with_suffix(".npz"), "wb") as f:
        np.save(f, np.zeros(3))
    with pytest.raises(PlanError, match="cannot read the values .*not an .npz archive"):
        Plan.from_json(saved)


def test_a_plan_saved_without_values_cannot_run(saved):
    with pytest.raises(PlanError, match=r"saved without values\): no value for param 'layers.0.weight' "
                                        r"\(and 5 more\)"):
        Plan.from_json(edit(saved, lambda d: d.update(values_digest=None), signed=True))


def test_a_plan_path_ending_in_npz_is_refused(mlp, tmp_path):
    with pytest.raises(PlanError, match="must not end in .npz; name it .json"):
        mlp.to_json(tmp_path / "plan.npz")
    assert not list(tmp_path.iterdir())


def test_values_must_be_complete_to_save_or_run(mlp, tmp_path):
    partial = replace(mlp, data={k: v for k, v in mlp.data.items() if k != "layers.1.bias"})
    with pytest.raises(PlanError, match="Plan.data: no value for param 'layers.1.bias'"):
        partial.to_json(tmp_path / "plan.json")
    with pytest.raises(PlanError, match="no value for param 'layers.1.bias'"):
        Executor(partial, backend="numpy")


def test_attributes_and_scratch_round_trip(tmp_path):
    """A step keeps every attribute, its ONNX defaults included, and the named slices of its workspace."""
    plan = planner.compile("zoo:lenet", {"input": (2, 1, 28, 28)}, fuse_conv=False)
    conv = next(s for s in plan.steps if s.op == "Conv")
    assert planner.ops.get("Conv").defaults.keys() <= conv.attrs.keys()
    assert [c.name for c in conv.scratch] == ["columns"] and conv.scratch[0].dtype == "uint8"
    assert Plan.from_json(plan.to_json(tmp_path / "lenet.json")).steps == plan.steps


def test_a_reloaded_plan_runs_like_the_original(mlp, saved):
    want = Executor(mlp, backend="numpy").run(feed())["output"]
    np.testing.assert_array_equal(Executor(Plan.from_json(saved), backend="numpy").run(feed())["output"], want)


def test_bfloat16_values_round_trip(tmp_path):
    # .npz stores bfloat16 as raw 2-byte voids; reading views them as bfloat16 again.
    x = helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.BFLOAT16, None)
    w = np.arange(6, dtype=np.float32).reshape(2, 3).astype(ml_dtypes.bfloat16)
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "bf16", [x], [y],
                              [numpy_helper.from_array(w, "w")])
    plan = planner.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    again = Plan.from_json(plan.to_json(tmp_path / "bf16.json"))
    assert again.data["w"].dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(again.data["w"], w)


def relu_to(op, **changes):
    """An edit of the first Relu step (step 1 of zoo:mlp) into `op`, its other fields changed as given."""
    return lambda d: d["steps"][1].update(op=op, **changes)


def moved_output(doc):
    """The graph output moved to the end of an arena grown for it: a plan verify() accepts."""
    tensor(doc, "output")["offset"] = doc["arena_bytes"]
    doc["arena_bytes"] += 256


@pytest.mark.parametrize("change", [relu_to("Sigmoid"), lambda d: d["steps"][0]["attrs"].update(alpha=2.0),
                                    lambda d: d["steps"][4]["inputs"].__setitem__(2, "layers.0.bias"),
                                    moved_output, lambda d: d.update(values_digest="0" * 32),
                                    lambda d: d["breakdown"].update(params=0)])
def test_a_plan_changed_after_it_was_written_is_refused(saved, change):
    with pytest.raises(PlanError, match=r"plan.json: the plan was changed after it was written \(its digest differs"):
        Plan.from_json(edit(saved, change))


@pytest.mark.parametrize("change,message", [
    (relu_to("Add"), r"steps\[1\]: Add needs input 1 \(B\), which the step leaves out"),
    (relu_to("Softmax"), r"steps\[1\]: Softmax needs attribute 'axis', which the step lacks"),
    (relu_to("Frobnicate"), r"steps\[1\]: op Frobnicate at version 17 is not one memplan has a schema for"),
    (relu_to("Relu", domain="memplan"), r"steps\[1\]: op memplan.Relu at version 17 is not one memplan has"),
    (relu_to("CumProd"), r"steps\[1\]: op CumProd at version 17 is not one memplan has a schema for"),
    (lambda d: d["steps"][1]["inputs"].append("input"), r"steps\[1\]: Relu takes at most 1 input\(s\), the step "
                                                         "gives 2"),
    (lambda d: d["steps"][1]["outputs"].append("output"), r"steps\[1\]: Relu takes at most 1 output\(s\)"),
    (lambda d: d["steps"][0]["attrs"].update(transB=0), r"step 0 \('/layers/0/Gemm'\): Gemm does not take these "
                                                        r"inputs \(ShapeError: .*\(2, 784\).*\(512, 784\)"),
    (lambda d: d["steps"][4]["attrs"].update(transA=1), r"step 4 \('/layers/2/Gemm'\): Gemm does not take"),
    (relu_to("Shape", attrs={"start": 0, "end": None}), r"step 1 \('/layers/0/Relu'\): Shape gives \(2,\) int64 "
                                                        r"for output 0 '/layers/0/Relu_output_0', which the plan "
                                                        r"places as \(2, 512\) float32"),
    (relu_to("Select", domain="memplan", version=1), r"step 1 \('/layers/0/Relu'\): memplan.Select does not take "
                                                     r"these inputs \(ValueError: not enough values to unpack"),
])
def test_a_written_step_must_fit_its_op(saved, change, message):
    """Even with its digest made anew (a plan written by hand), a step whose op memplan has no schema for,
    or that the op's schema, arity or shape rule refuses, is one line, not a TypeError in a kernel."""
    with pytest.raises(PlanError, match=message) as caught:
        Plan.from_json(edit(saved, change, signed=True))
    assert str(caught.value).startswith(str(saved)) and "\n" not in str(caught.value)


def test_a_plan_larger_than_the_cap_is_not_read(saved, tmp_path):
    endless = tmp_path / "endless.json"
    endless.symlink_to("/dev/zero")
    kind, detail = isolated(Plan.from_json, endless)
    assert kind == "error" and re.search(r"endless.json: not a plan \(it holds more than 268,435,456 bytes, the most "
                                         r"a plan may hold: planner.plan.MAX_PLAN_BYTES\)", detail), detail
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as f:  # sparse: its size alone refuses it
        f.truncate(plan_module.MAX_PLAN_BYTES + 1)
    with pytest.raises(PlanError, match=r"huge.json: not a plan \(it holds more than"):
        Plan.from_json(huge)


def npy(shape, dtype="<f4", data=b""):
    """The bytes of an .npy whose header says `shape` and `dtype`, followed by `data`."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": dtype, "fortran_order": False, "shape": shape})
    return header.getvalue() + data


@pytest.mark.parametrize("member,message", [
    (npy((2**40,)), r"param 'layers.0.bias' is \(1099511627776,\) float32, but the plan places it as \(512,\)"),
    (npy((512,), "<f8"), r"param 'layers.0.bias' is \(512,\) float64, but the plan places it as \(512,\) float32"),
    (npy((512,), data=b"\0" * 1000), r"'layers.0.bias' holds 1,000 bytes of values, where its shape \(512,\) and "
                                      r"dtype float32 take 2,048"),
    (npy((512,), data=b"\0" * 4096), r"'layers.0.bias' holds 4,096 bytes of values"),
    (b"\x93NUMPY\x03\x00" + b"\0" * 64, r"cannot read the values \(layers.0.bias.npy is an .npy of version \(3, 0\)"),
    (b"not an npy at all", r"cannot read the values \(.*magic"),
])
def test_a_values_member_is_checked_by_its_header_before_it_is_read(saved, member, message):
    values = npz_of(saved)
    with zipfile.ZipFile(saved.with_suffix(".npz"), "w") as archive:
        for name, value in values.items():
            if name == "layers.0.bias":
                archive.writestr(name + ".npy", member)
            else:
                with archive.open(name + ".npy", "w") as f:
                    np.lib.format.write_array(f, value)
    kind, detail = isolated(Plan.from_json, saved)
    assert kind == "error" and detail.startswith("PlanError: ") and re.search(message, detail), detail
