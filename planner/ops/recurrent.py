"""The recurrent ops LSTM, GRU and RNN, one schema each over a shared base. Their kernel walks the
sequence one time step after the other, the gates of a step computed by two matmuls into scratch of
the workspace and activated in place, so that nothing is allocated; sequences shorter than the input
(sequence_lens) run batch element by batch element. Training differentiates through `decompose`,
the recurrence unrolled into ops memplan knows (planner/ops/recurrent_parts.py)."""
from dataclasses import replace

from .registry import schema
from .base import Layout, Schema, same_dtype
from .control_flow import check_unrolled
from .recurrent_parts import (ACTIVATIONS, Built, Settings, Torch, activations, batch_major, gru_cell, lstm_cell,
                              rnn_cell, time_major, unroll)
from ..errors import ModelError, ShapeError

DIRECTIONS = {"forward": (False,), "reverse": (True,), "bidirectional": (False, True)}


def _activate(xp, s, x, act, scratch, clip=True):
    """The activation `act` (name, alpha, beta) of x in place, x clipped first where the node clips."""
    if clip and s.clip is not None:
        xp.clip(x, -s.clip, s.clip, out=x)
    name, alpha, beta = act
    ACTIVATIONS[name][1](xp, x, scratch, alpha, beta)


def _chunks(x, n, size):
    """The n column blocks of `size` of the matrix x, as views."""
    return [x[:, k * size:(k + 1) * size] for k in range(n)]


class Recurrent(Schema):
    """What the three ops share: inputs X, W, R, B, sequence_lens, initial_h (and LSTM's initial_c, P),
    outputs Y, Y_h (and LSTM's Y_c); `gates` blocks of H rows in W and R, `acts` activations per
    direction, `cell` the step in an algebra (planner/ops/recurrent_parts.py); for the kernel's `step`,
    `recurrent` the width of the recurrent product it takes at once (in hidden sizes), `states` the
    (B, H) states it carries (h, and LSTM's c) and `temporaries` the (B, H) scratch it needs."""

    autocast = "low"
    gates = acts = recurrent = states = temporaries = 1
    cell = None
    mirror = False
    default_acts = ()
    defaults = {"activation_alpha": None, "activation_beta": None, "activations": None, "clip": None,
                "direction": "forward", "hidden_size": None, "layout": 0}

    def settings(self, attrs, x, r):
        """The Settings of a node with attributes `attrs` (every one of `defaults`) and X and R of these
        shapes; ShapeError for a bad attribute."""
        direction, layout = attrs["direction"], attrs["layout"]
        if direction not in DIRECTIONS:
            raise ShapeError(f"direction must be one of {', '.join(DIRECTIONS)}, got {direction!r}")
        if layout not in (0, 1):
            raise ShapeError(f"layout must be 0 (time first) or 1 (batch first), got {layout}")
        if len(x) != 3 or len(r) != 3:
            raise ShapeError(f"X {tuple(x)} and R {tuple(r)} must have rank 3")
        hidden = attrs["hidden_size"] or r[-1]
        if hidden < 1:
            raise ShapeError(f"hidden_size must be positive, got {hidden}")
        reverse = DIRECTIONS[direction]
        names = attrs["activations"] or list(self.default_acts) * len(reverse)
        if len(names) != self.acts * len(reverse):
            raise ShapeError(f"{direction} {self.op} takes {self.acts * len(reverse)} activations "
                             f"({self.acts} per direction), got {len(names)}")
        acts = activations(names, attrs["activation_alpha"], attrs["activation_beta"])
        clip = attrs["clip"]
        if clip is not None and not clip > 0:
            raise ShapeError(f"clip must be positive, got {clip}")
        (t, b), i = (x[:2] if layout == 0 else x[1::-1]), x[2]
        return Settings(t, b, i, hidden, len(reverse), reverse,
                        tuple(acts[k * self.acts:(k + 1) * self.acts] for k in range(len(reverse))), clip, layout,
                        bool(attrs.get("input_forget")), bool(attrs.get("linear_before_reset")))

    def infer(self, node, ins):
        x, w, r, bias, lengths, h0, c0, p = [*ins, *[None] * 8][:8]
        s = self.settings(self.arguments(node), x.shape, r.shape)
        g, h, d = self.gates * s.H, s.H, s.D
        state = (d, s.B, h) if s.layout == 0 else (s.B, d, h)
        expected = {"W": (w, (d, g, s.I)), "R": (r, (d, g, h)), "B": (bias, (d, 2 * g)), "initial_h": (h0, state),
                    "initial_c": (c0, state), "P": (p, (d, 3 * h)), "sequence_lens": (lengths, (s.B,))}
        for name, (info, shape) in expected.items():
            if info is not None and tuple(info.shape) != shape:
                raise ShapeError(f"{name} must have shape {shape} (hidden size {h}, {d} direction(s), batch {s.B}, "
                                 f"input size {s.I}), got {tuple(info.shape)}")
        dtype = same_dtype([x, w, r, bias, h0, c0, p])
        y = (s.T, d, s.B, h) if s.layout == 0 else (s.B, s.T, d, h)
        return [(y, dtype)] + [(state, dtype)] * self.states

    def workspace(self, node, ins, outs, limit):
        """The gates of one step, the recurrent product, the (B, H) temporaries and states."""
        s, dtype = self.settings(self.arguments(node), ins[0].shape, ins[2].shape), ins[0].dtype
        rows = [(name, (s.B, s.H), dtype) for name in ("t1", "t2")[:self.temporaries] + ("h", "c")[:self.states]]
        return Layout.pack(("gates", (s.B, self.gates * s.H), dtype), ("rec", (s.B, self.recurrent * s.H), dtype),
                           *rows)

    def flops(self, node, ins, outs):
        """Per direction and time step: the two matmuls (2 B H' (I + H), H' the gate rows), and about
        three operations per gate value and three per hidden value."""
        s = self.settings(self.arguments(node), ins[0].shape, ins[2].shape)
        g = self.gates * s.H
        return s.D * s.T * s.B * (2 * g * (s.I + s.H) + 3 * g + 3 * s.H)

    def kernel(self, xp, step, ins, outs, ws):
        x, w, r, bias, lengths, h0, c0, p = [*ins, *[None] * 8][:8]
        y, y_h, y_c = [*outs, None, None][:3]
        s = self.settings(self.arguments(step), x.shape, r.shape)
        g = self.gates * s.H
        if s.layout:
            x, h0, c0 = (None if t is None else t.transpose(1, 0, 2) for t in (x, h0, c0))
            y = None if y is None else y.transpose(1, 2, 0, 3)
            y_h, y_c = (None if t is None else t.transpose(1, 0, 2) for t in (y_h, y_c))
        host = None if lengths is None else lengths.tolist()
        if host is not None and not all(0 <= n <= s.T for n in host):
            raise ValueError(f"sequence_lens {host} must lie in [0, {s.T}], the sequence length")
        for d in range(s.D):
            k = {"wt": w[d].T, "rt": r[d].T, "wb": None if bias is None else bias[d, :g],
                 "rb": None if bias is None else bias[d, g:],
                 "p": None if p is None else [p[d, j * s.H:(j + 1) * s.H] for j in range(3)]}
            for state, first in (("h", h0), ("c", c0)):
                if state in ws and first is None:
                    ws[state].fill(0)
                elif state in ws:
                    xp.copyto(ws[state], first[d])
            yd = None if y is None else y[:, d]
            if host is None or min(host) == s.T:
                self.run(xp, s, d, x, yd, k, ws, s.B)
            else:
                for b, n in enumerate(host):
                    one = {name: v[b:b + 1] if name in ("h", "c") else v[:1] for name, v in ws.items()}
                    self.run(xp, s, d, x[:n, b:b + 1], None if yd is None else yd[:n, b:b + 1], k, one, 1)
                    if yd is not None:
                        yd[n:, b].fill(0)
            for out, state in ((y_h, "h"), (y_c, "c")):
                if out is not None:
                    xp.copyto(out[d], ws[state])

    def run(self, xp, s, d, xs, ys, k, ws, n):
        """Direction d over the time-major steps xs (T', n, I), each h written to ys (T', n, H) if any."""
        scratch = {name: v[:n] for name, v in ws.items()}
        for t in (range(len(xs) - 1, -1, -1) if s.reverse[d] else range(len(xs))):
            self.step(xp, s, s.acts[d], xs[t], k, scratch)
            if ys is not None:
                xp.copyto(ys[t], scratch["h"])

    def step(self, xp, s, acts, x, k, ws):
        """One time step: the state in ws["h"] (and ws["c"]) updated in place from x (n, I)."""
        raise NotImplementedError

    def gates_of(self, xp, x, k, ws):
        """x W^T + h R^T (+ Wb + Rb) into ws["gates"]: the gates of LSTM and RNN before activation."""
        gates = ws["gates"]
        xp.matmul(x, k["wt"], out=gates)
        xp.matmul(ws["h"], k["rt"], out=ws["rec"])
        xp.add(gates, ws["rec"], out=gates)
        if k["wb"] is not None:
            xp.add(gates, k["wb"], out=gates)
            xp.add(gates, k["rb"], out=gates)
        return gates

    def decompose(self, b, node):
        """The recurrence unrolled into MatMul, Add, Mul, the activations, Split and Concat, which
        training differentiates through (the op's kernel runs it otherwise)."""
        x, w, r, bias, lengths, h0, c0, p = [*(i or None for i in node.inputs), *[None] * 8][:8]
        if lengths is not None:
            raise ModelError(f"node {node.name!r} ({self.op}) has no gradient with sequence_lens; leave the input "
                             "out where every sequence has the full length")
        s = self.settings(self.arguments(node), b.shape(x), b.shape(r))
        check_unrolled(s.T * s.D, f"node {node.name!r} ({self.op}): unrolling its recurrence over {s.T:,} time steps "
                                  f"in {s.D} direction(s) makes at least")
        m = Built(b, x)
        x, h0, c0 = time_major(m, s, x, h0, c0)
        want = [bool(o) for o in node.outputs]
        outs = batch_major(m, s, *unroll(m, self.cell, s, x, w, r, bias, h0, c0, p, want_y=want[0]))
        return [o if wanted else None for o, wanted in zip(outs, want)]

    def torch(self, torch, *inputs, **attrs):
        """The recurrence in PyTorch, batch element by batch element where sequence_lens shortens any."""
        x, w, r, bias, lengths, h0, c0, p = [*inputs, *[None] * 8][:8]
        s = self.settings(attrs, x.shape, r.shape)
        m = Torch(torch, x)
        x, h0, c0 = time_major(m, s, x, h0, c0)
        if lengths is None or int(lengths.min()) == s.T:
            return batch_major(m, s, *unroll(m, self.cell, s, x, w, r, bias, h0, c0, p))
        parts = []
        for b, n in enumerate(lengths.tolist()):
            one = [None if t is None else t[:, b:b + 1] for t in (h0, c0)]
            y, y_h, y_c = unroll(m, self.cell, replace(s, T=n, B=1), x[:n, b:b + 1], w, r, bias, *one, p)
            parts.append((torch.cat([y, y.new_zeros(s.T - n, *y.shape[1:])]), y_h, y_c))
        y, y_h, y_c = zip(*parts)
        return batch_major(m, s, torch.cat(y, 2), torch.cat(y_h, 1), None if y_c[0] is None else torch.cat(y_c, 1))


@schema("LSTM")
class LSTM(Recurrent):
    """LSTM: gates i, o, f, c; peepholes P, input_forget (f = 1 - i), cell state c beside h."""

    gates, acts, recurrent, states = 4, 3, 4, 2
    cell = staticmethod(lstm_cell)
    default_acts = ("Sigmoid", "Tanh", "Tanh")
    defaults = {**Recurrent.defaults, "input_forget": 0}

    def step(self, xp, s, acts, x, k, ws):
        f_act, g_act, h_act = acts
        h, c, t1 = ws["h"], ws["c"], ws["t1"]
        i, o, f, g = _chunks(self.gates_of(xp, x, k, ws), 4, s.H)
        if k["p"] is not None:
            for gate, peep in [(i, k["p"][0])] + ([] if s.input_forget else [(f, k["p"][2])]):
                xp.multiply(c, peep, out=t1)
                xp.add(gate, t1, out=gate)
        _activate(xp, s, i, f_act, t1)
        if s.input_forget:
            xp.subtract(1, i, out=f)
        else:
            _activate(xp, s, f, f_act, t1)
        _activate(xp, s, g, g_act, t1)
        xp.multiply(c, f, out=c)
        xp.multiply(i, g, out=t1)
        xp.add(c, t1, out=c)
        if k["p"] is not None:
            xp.multiply(c, k["p"][1], out=t1)
            xp.add(o, t1, out=o)
        _activate(xp, s, o, f_act, t1)
        xp.copyto(h, c)
        _activate(xp, s, h, h_act, t1, clip=False)
        xp.multiply(h, o, out=h)


@schema("GRU")
class GRU(Recurrent):
    """GRU: gates z, r, h; linear_before_reset applies the reset gate after the recurrent product."""

    gates, acts, recurrent, temporaries = 3, 2, 2, 2
    cell = staticmethod(gru_cell)
    default_acts = ("Sigmoid", "Tanh")
    defaults = {**Recurrent.defaults, "linear_before_reset": 0}

    def step(self, xp, s, acts, x, k, ws):
        f_act, g_act = acts
        h, t1, t2, H = ws["h"], ws["t1"], ws["t2"], s.H
        gates, rec, rt = ws["gates"], ws["rec"], k["rt"]
        xp.matmul(x, k["wt"], out=gates)
        xp.matmul(h, rt[:, :2 * H], out=rec)
        if k["wb"] is not None:
            xp.add(gates, k["wb"], out=gates)
            xp.add(rec, k["rb"][:2 * H], out=rec)
        z, r, candidate = _chunks(gates, 3, H)
        xp.add(gates[:, :2 * H], rec, out=gates[:, :2 * H])
        _activate(xp, s, z, f_act, t1)
        _activate(xp, s, r, f_act, t1)
        if not s.linear_before_reset:
            xp.multiply(r, h, out=t1)
        xp.matmul(h if s.linear_before_reset else t1, rt[:, 2 * H:], out=t2)
        if k["rb"] is not None:
            xp.add(t2, k["rb"][2 * H:], out=t2)
        if s.linear_before_reset:
            xp.multiply(t2, r, out=t2)
        xp.add(candidate, t2, out=candidate)
        _activate(xp, s, candidate, g_act, t1)
        xp.subtract(h, candidate, out=t1)
        xp.multiply(t1, z, out=t1)
        xp.add(candidate, t1, out=h)


@schema("RNN")
class RNN(Recurrent):
    """RNN: one gate, h = f(x W^T + h R^T + Wb + Rb)."""

    cell = staticmethod(rnn_cell)
    default_acts = ("Tanh",)

    def step(self, xp, s, acts, x, k, ws):
        gates = self.gates_of(xp, x, k, ws)
        _activate(xp, s, gates, acts[0], ws["t1"])
        xp.copyto(ws["h"], gates)
