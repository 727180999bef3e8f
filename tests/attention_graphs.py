"""Exported attention written by hand as ONNX: the scores MatMul(Q, K^T) scaled, soft-capped, biased and
masked by a list of terms, softmax, an optional guard and dropout, MatMul(P, V); 4-D, or 3-D batched products
reshaped to 4-D around the terms (BLOOM). What the attention fusion tests (and its property test) build."""
import numpy as np
from onnx import helper, numpy_helper


class Attention:
    """Builds one model. Terms are ("add", value) and ("where", cond, fill, attends); a value or cond is an
    array (an initializer) or a graph input's name with its shape in `inputs`; "add3" adds to the 3-D scores
    before they are reshaped to 4-D."""

    def __init__(self, b=2, h=4, s=6, t=6, d=4, kv_heads=None, layout="4d", dtype=np.float32):
        self.b, self.h, self.s, self.t, self.d, self.layout, self.dtype = b, h, s, t, d, layout, np.dtype(dtype)
        self.kv = h if kv_heads is None else kv_heads
        self.nodes, self.inits, self.inputs, self.count = [], [], {}, 0

    def _name(self, prefix):
        self.count += 1
        return f"{prefix}{self.count}"

    def _op(self, op, *inputs, **attrs):
        out = self._name(op.lower())
        self.nodes.append(helper.make_node(op, list(inputs), [out], **attrs))
        return out

    def value(self, x, dtype=None):
        """An initializer of `x`, or the graph input `x` (a str)."""
        if isinstance(x, str):
            return x
        name = self._name("c")
        self.inits.append(numpy_helper.from_array(np.asarray(x, dtype or (x.dtype if isinstance(x, np.ndarray)
                                                                            and x.dtype == bool else self.dtype)), name))
        return name

    def shapes(self):
        b, h, s, t, d, kv = self.b, self.h, self.s, self.t, self.d, self.kv
        if self.layout == "3d":
            return {"q": (b * h, s, d), "kt": (b * h, d, t), "v": (b * h, t, d)}
        return {"q": (b, h, s, d), "kt": (b, kv, d, t), "v": (b, kv, t, d)}

    def model(self, scale=("Div", 2.0), softcap=None, terms=(), guard=False, dropout=None, inputs=None, after=None,
              params=(), rng=None):
        """The model: scale (op, factor), softcap c, the terms, a guard, dropout (ratio, seed), `after` an op
        applied to the masked scores (a near miss), extra graph `inputs` {name: (shape, dtype)}; `params`
        names those of q, kt, v that are initializers (drawn by `rng`), not inputs."""
        self.nodes, self.inits, self.count = [], [], 0
        self.inputs = {**{n: (s, self.dtype) for n, s in self.shapes().items() if n not in params}, **(inputs or {})}
        self.inits += [numpy_helper.from_array(rng.standard_normal(s).astype(self.dtype), n)
                       for n, s in self.shapes().items() if n in params]
        x = self._op("MatMul", "q", "kt")
        if scale:
            x = self._op(scale[0], x, self.value(np.array(scale[1])))
        if softcap:
            x = self._op("Mul", self._op("Tanh", self._op("Div", x, self.value(np.array(softcap)))),
                         self.value(np.array(softcap)))
        four = (self.b, self.h, self.s, self.t)
        for term in terms:
            if term[0] == "add3":
                x = self._op("Add", x, self.value(term[1]))
        if self.layout == "3d":
            x = self._op("Reshape", x, self.value(np.array(four, np.int64), np.int64))
        for term in terms:
            if term[0] == "add":
                x = self._op("Add", x, self.value(term[1]))
            elif term[0] == "where":
                _, cond, fill, attends = term
                fill = self.value(fill if isinstance(fill, str) else np.array(fill))
                x = self._op("Where", self.value(cond), *((x, fill) if attends else (fill, x)))
        if after:
            x = self._op(after[0], x, self.value(np.array(after[1])))
        p = self._op("Softmax", x, axis=-1)
        if guard:
            p = self._op("Where", self._op("IsNaN", p), self.value(np.array(0.0)), p)
        if dropout:
            out = self._name("dropout")
            self.nodes.append(helper.make_node("Dropout", [p, self.value(np.array(dropout[0])),
                                                           self.value(np.array(True))], [out], seed=dropout[1]))
            p = out
        if self.layout == "3d":
            p = self._op("Reshape", p, self.value(np.array((self.b * self.h, self.s, self.t), np.int64), np.int64))
        self.nodes.append(helper.make_node("MatMul", [p, "v"], ["y"]))
        kind = helper.np_dtype_to_tensor_dtype
        graph = helper.make_graph(self.nodes, "attention",
                                  [helper.make_tensor_value_info(n, kind(np.dtype(t)), s) for n, (s, t) in self.inputs.items()],
                                  [helper.make_tensor_value_info("y", kind(self.dtype), None)], self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    def feeds(self, rng, scale=1.0):
        """Random values of the inputs (bools at random, floats normal times `scale`)."""
        return {n: (rng.random(s) < 0.5 if np.dtype(t) == bool else (rng.standard_normal(s) * scale).astype(t))
                for n, (s, t) in self.inputs.items()}


def causal(s, t, window=0):
    """The (S, T) causal mask (True: attend), the last query seeing the last key, within `window` (0: all)."""
    i, j = np.arange(s)[:, None], np.arange(t)[None, :]
    return (j <= i + t - s) & ((j > i + t - s - window) if window else True)

