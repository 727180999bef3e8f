"""A property test of the attention fusion: hypothesis draws exported attention (tests/attention_graphs.py) in
its forms and near misses (scales, softcaps, 3-D scores, one K/V head, band masks with every kind of fill set
or added, masks one cell off the band, biases and masks from inputs, an op after the masks, the IsNaN guard),
with NaN, inf, huge and tiny values in the feeds, and holds the plans with and without the fusion to
onnxruntime (tests/pass_properties.py): a fusion never changes an answer."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from attention_graphs import Attention, causal
from pass_properties import SETTINGS, Case, seeds, values

pytest.importorskip("onnxruntime")
LOWEST = float(np.finfo(np.float32).min)
FILLS = [-np.inf, LOWEST, -1e30, -1e4, 0.0, 5.0]
TERMS = ["band where", "band where not", "band add", "near band", "bias", "mask", "input bias", "input mask"]
FUSES = {"band where", "band where not", "band add", "bias", "input bias"}
"""Terms the fusion takes alone whatever the fill (Where masks of other shapes only with a fill at most -1e30)."""


@st.composite
def attentions(draw):
    rng = draw(seeds())
    layout = draw(st.sampled_from(["4d", "3d"]))
    b, h, s, t = draw(st.integers(1, 2)), draw(st.sampled_from([1, 2, 4])), draw(st.integers(1, 7)), draw(st.integers(1, 7))
    kv = h if layout == "3d" else draw(st.sampled_from([h, 1]))
    g = Attention(b, h, s, t, d=draw(st.sampled_from([1, 3, 4])), kv_heads=kv, layout=layout)
    scale = draw(st.sampled_from([None, ("Div", 2.0), ("Mul", 0.3), ("Div", -1.5)]))
    softcap = draw(st.sampled_from([None, None, 2.0]))
    terms, inputs, labels, fuses = [], {}, [], True
    for k in range(draw(st.integers(0, 2))):
        kind, window, fill = draw(st.sampled_from(TERMS)), draw(st.sampled_from([0, 0, 1, 2])), draw(st.sampled_from(FILLS))
        band = causal(s, t, window)
        shape = draw(st.sampled_from([(s, t), (b, 1, s, t), (1, h, s, t)]))
        if kind == "band where" or kind == "band where not":
            terms.append(("where", band if kind == "band where" else ~band, fill, kind == "band where"))
        elif kind == "band add":
            terms.append(("add", np.where(band, 0, fill).astype(np.float32)))
        elif kind == "near band":
            off = band.copy()
            off[rng.integers(s), rng.integers(t)] ^= True
            terms.append(("where", off, fill, True))
        elif kind == "bias":
            terms.append(("add", values(rng, shape, 0.05)))
        elif kind == "mask":
            terms.append(("where", rng.random(shape) < 0.6, fill, True))
        else:
            name = f"{kind.split()[1]}{k}"
            inputs[name] = (shape, np.float32 if kind == "input bias" else np.bool_)
            terms.append(("add", name) if kind == "input bias" else ("where", name, fill, True))
        labels.append(f"{kind} window={window} fill={fill} {shape}")
        fuses = fuses and (kind in FUSES or fill <= -1e30)
    guard = draw(st.booleans())
    after = draw(st.sampled_from([None] * 4 + [("Mul", 3.0), ("Add", 1.0)]))
    model = g.model(scale, softcap, terms, guard, inputs=inputs, after=after)
    feeds = {n: values(rng, shape, 0.05) if np.dtype(dtype) != np.bool_ else rng.random(shape) < 0.6
             for n, (shape, dtype) in g.inputs.items()}
    fires = (fuses and after != ("Mul", 3.0) and len(terms) <= 1) or None
    label = f"{layout} b={b} h={h} kv={kv} s={s} t={t} scale={scale} softcap={softcap} guard={guard} after={after} " \
            f"terms={labels}"
    return Case(model, feeds, fires, label)


@settings(SETTINGS, max_examples=150)
@given(case=attentions())
def test_attention_fusion_keeps_ieee_results(case):
    case.check("fuse_attention", rtol=2e-4, atol=2e-5)
