"""Conv and FusedConv steps through cuDNN (`nvidia-cudnn-frontend` graphs), each graph built once when the
executor binds the step and run on the arena's bytes: its workspace is the step's planned workspace, so
cuDNN only chooses among the engines that fit it and the plan stays the device's bytes. FusedConv's bias,
residual and activation run in the same graph where cuDNN fuses them, or after the conv alone in one pass of
memplan's, whichever runs faster on this device (timed when the step is bound: some fp32 fusions, ReLU6's
clip among them, fall to engines tens of times slower than the conv alone). A step cuDNN does not take
keeps the im2col kernel."""
from functools import partial

import numpy as np

from ..kernels import nn
from .cupy_conv import as_2d, epilogue
from .cupy_fused import elements

ACTIVATIONS = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh"}
"""FusedConv's activations as cuDNN pointwise ops (Clip is relu's clipped form; HardSigmoid runs after the conv)."""


class Convolutions:
    """One cuDNN handle; `bind` makes a step's kernel, or None when cuDNN does not take the step. fp32 convs
    keep off the engines that round to TF32 unless `tf32`."""

    def __init__(self, cupy, tf32=False):
        import cudnn
        self.cupy, self.cudnn, self.tf32 = cupy, cudnn, tf32
        self.handle = cudnn.create_handle()
        self.types = {np.dtype(np.float32): cudnn.data_type.FLOAT, np.dtype(np.float16): cudnn.data_type.HALF}
        self.declined = {}
        """{step name: why cuDNN did not take it}, for the report of what ran where."""
        self.after = epilogue(cupy)

    def bind(self, step, ins, outs, workspace):
        """The kernel running `step` (Conv, or com.microsoft FusedConv) by a cuDNN graph over these views, with
        `workspace` (a uint8 view, or None) as its scratch; None when cuDNN cannot run it here."""
        x, w, b, z = [*ins, None, None][:4]
        y = outs[0]
        if y.dtype not in self.types or x.dtype != y.dtype or w.dtype != y.dtype or not 3 <= x.ndim <= 5:
            self.declined[step.name] = f"{x.ndim - 2}-D {y.dtype}"
            return None
        limit = 0 if workspace is None else workspace.nbytes
        errors, candidates = [], []
        for fused in (True, False) if _has_epilogue(step, b, z) else (True,):
            try:
                graph, pointers = self._graph(step, x, w, b if fused else None, z if fused else None, y, limit, fused)
            except Exception as e:  # the frontend's many ways of declining: unsupported, no engine fits the limit
                errors.append(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
                continue
            run = partial(self._execute, graph, pointers, 0 if workspace is None else workspace.data.ptr)
            candidates.append(run if fused else _then(run, self.after(step, b, z, y) or _epilogue(b, z)))
        if not candidates:
            self.declined[step.name] = "; ".join(errors)
            return None
        return candidates[0] if len(candidates) == 1 else self._fastest(candidates, step, ins, outs)

    def _fastest(self, candidates, step, ins, outs):
        """The candidate kernel of `step` taking the least time over a few runs on the device. Bound before any
        run, it may write the step's output (the step's own bytes; a conv overwrites none of its inputs)."""
        cupy, timed = self.cupy, []
        for run in candidates:
            run(cupy, step, ins, outs, {})
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record()
            for _ in range(3):
                run(cupy, step, ins, outs, {})
            end.record()
            end.synchronize()
            timed.append(cupy.cuda.get_elapsed_time(start, end))
        return candidates[timed.index(min(timed))]

    def _execute(self, graph, pointers, workspace, xp, step, ins, outs, ws):
        self.cudnn.set_stream(self.handle, self.cupy.cuda.get_current_stream().ptr)
        graph.execute(pointers, workspace, handle=self.handle)

    def _graph(self, step, x, w, b, z, y, limit, fused):
        """(built graph, {tensor: device pointer}) of y = conv(x, w) (+ b + z, activation when `fused`)."""
        cudnn, dtype = self.cudnn, self.types[y.dtype]
        flat = x.ndim == 3  # 1-D convs as 2-D ones of height 1
        graph = cudnn.pygraph(io_data_type=dtype, intermediate_data_type=cudnn.data_type.FLOAT,
                              compute_data_type=cudnn.data_type.FLOAT, handle=self.handle)
        pointers = {}

        def tensor(name, array, shape=None):
            array = array if shape is None else array.reshape(shape)
            shape = list(array.shape)
            strides = unit_spatial(shape, elements(array))
            if flat and len(shape) == 3:
                shape, strides = [*shape[:2], 1, shape[2]], [*strides[:2], shape[2] * strides[2], strides[2]]
            t = graph.tensor(name=name, dim=shape, stride=strides, data_type=dtype)
            pointers[t] = array.data.ptr
            return t

        win = nn.conv_window(step, x, w, y)
        out = graph.conv_fprop(image=tensor("x", x), weight=tensor("w", w), pre_padding=as_2d(flat, win.begin, 0),
                               post_padding=as_2d(flat, win.end, 0), stride=as_2d(flat, win.strides, 1),
                               dilation=as_2d(flat, win.dilations, 1), compute_data_type=cudnn.data_type.FLOAT,
                               name="conv")
        if fused:
            out = self._epilogue(graph, tensor, step, out, b, z, y)
        # the output's layout is the arena's (cuDNN would make it channels-last)
        out.set_output(True).set_data_type(dtype).set_dim(list(y.shape))
        out.set_stride(unit_spatial(list(y.shape), elements(y)))
        pointers[out] = y.data.ptr
        graph.validate()
        graph.build_operation_graph()
        graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        graph.deselect_workspace_greater_than(limit)
        if y.dtype == np.float32 and not self.tf32:
            graph.deselect_numeric_notes([cudnn.numerical_note.TENSOR_CORE, cudnn.numerical_note.DOWN_CONVERT_INPUTS])
        graph.check_support()
        graph.build_plans()
        if graph.get_workspace_size() > limit:
            raise ValueError(f"workspace {graph.get_workspace_size()} > {limit} bytes planned")
        return graph, pointers

    def _epilogue(self, graph, tensor, step, out, b, z, y):
        """The bias, residual and activation of a FusedConv as graph ops after the conv."""
        if b is not None:
            out = graph.bias(input=out, bias=tensor("b", b, [1, b.shape[0], *[1] * (y.ndim - 2)]), name="bias")
        if z is not None:
            out = graph.add(a=out, b=tensor("z", z), name="residual")
        activation, params = step.attrs.get("activation") or "", step.attrs.get("activation_params") or ()
        if activation == "Clip":
            return graph.relu(input=out, lower_clip=float(params[0]), upper_clip=float(params[1]), name="act")
        if activation:
            return getattr(graph, ACTIVATIONS[activation])(input=out, name="act")
        return out


def unit_spatial(shape, strides):
    """The strides cuDNN is given for a tensor of `shape`: where every spatial dim is 1 and the channels are
    contiguous, those of channels-last ([C, 1, C, C]), which the arena's bytes also are. Given the arena's
    [C, 1, 1, 1], cuDNN's fp16 fused graphs left NaN in all but the first image (mobilenet_v2's fp16 plan)."""
    if len(shape) >= 3 and strides[1] == 1 and all(n == 1 for n in shape[2:]):
        return [strides[0], 1, *[shape[1]] * (len(shape) - 2)]
    return strides


def _has_epilogue(step, b, z):
    return b is not None or z is not None or bool(step.attrs.get("activation"))


def _then(run, finish):
    """The conv by `run`, then FusedConv's epilogue (bias, residual, activation) over Y by the kernel `finish`."""
    def kernel(xp, step, ins, outs, ws):
        run(xp, step, ins, outs, ws)
        finish(xp, step, ins, outs, ws)
    return kernel


def _epilogue(b, z):
    """FusedConv's epilogue by the shared kernels' calls, a pass over Y each."""
    def kernel(xp, step, ins, outs, ws):
        nn.epilogue(xp, step, b, z)(outs[0])
    return kernel
