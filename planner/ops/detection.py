"""NonMaxSuppression, whose number of boxes depends on the scores: planned at its bound (every class of
every batch keeping max_output_boxes_per_class boxes), rows past the boxes kept filled with -1, and the
number kept given beside it as the graph output `<name>.length`. Its kernel is greedy and sequential, so
it runs on the host over a copy of the boxes and scores (small beside the model that scored them)."""
import numpy as np

from .registry import schema
from .base import Schema, no_flops
from ..errors import ShapeError

LENGTH = ".length"
"""Suffix of the graph output holding how many rows of a bounded output are real."""


@schema("NonMaxSuppression")
class NonMaxSuppression(Schema):
    """Greedy non-maximum suppression per batch and class: boxes by descending score (ties: the lower
    index first), above score_threshold, each kept unless its IoU with a kept one exceeds iou_threshold,
    at most max_output_boxes_per_class of them; rows (batch, class, box)."""

    attr_inputs = (("max_output_boxes_per_class", 2, 10),)
    defaults = {"max_output_boxes_per_class": 0, "center_point_box": 0}
    bounded = True
    mirror = False
    flops = staticmethod(no_flops)

    def bound(self, node, boxes, scores):
        keep = int(np.ravel(self.attr(node, "max_output_boxes_per_class") or [0])[0])
        return boxes[0] * scores[1] * min(max(keep, 0), boxes[1])

    def infer(self, node, ins):
        boxes, scores = ins[0].shape, ins[1].shape
        if len(boxes) != 3 or boxes[2] != 4:
            raise ShapeError(f"boxes must be (batches, boxes, 4), got {boxes}")
        if len(scores) != 3 or (scores[0], scores[2]) != boxes[:2]:
            raise ShapeError(f"scores must be (batches, classes, boxes) = ({boxes[0]}, classes, {boxes[1]}), got {scores}")
        return [((self.bound(node, boxes, scores), 3), np.dtype(np.int64)), ((), np.dtype(np.int64))]

    def kernel(self, xp, step, ins, outs, ws):
        host = [None if a is None else (a if xp is np else xp.asnumpy(a)) for a in ins]
        rows = self.select(step, *host)
        outs[0].fill(-1)
        outs[0][:len(rows)] = xp.asarray(rows)
        if len(outs) > 1 and outs[1] is not None:
            outs[1].fill(len(rows))

    def select(self, node, boxes, scores, _=None, iou_threshold=None, score_threshold=None):
        """The kept rows (batch, class, box) as an int64 array, computed by NumPy."""
        keep = int(np.ravel(self.attr(node, "max_output_boxes_per_class") or [0])[0])
        iou_limit = float(np.ravel(iou_threshold)[0]) if iou_threshold is not None and iou_threshold.size else 0.0
        low = float(np.ravel(score_threshold)[0]) if score_threshold is not None and score_threshold.size else None
        corners = _corners(boxes.astype(np.float64), self.attr(node, "center_point_box"))
        rows = []
        for b in range(boxes.shape[0]):
            area = np.prod(corners[b, :, 2:] - corners[b, :, :2], axis=1)
            for c in range(scores.shape[1]):
                order = np.argsort(-scores[b, c], kind="stable")
                if low is not None:
                    order = order[scores[b, c, order] > low]
                kept = []
                for i in order:
                    if len(kept) >= keep:
                        break
                    if all(_iou(corners[b], area, i, j) <= iou_limit for j in kept):
                        kept.append(i)
                rows += [(b, c, i) for i in kept]
        return np.array(rows, np.int64).reshape(-1, 3)


def _corners(boxes, center_point_box):
    """Boxes as (y_min, x_min, y_max, x_max) from ONNX's corner (either diagonal) or centre form."""
    if center_point_box:
        x, y, w, h = np.moveaxis(boxes, -1, 0)
        return np.stack([y - h / 2, x - w / 2, y + h / 2, x + w / 2], -1)
    y1, x1, y2, x2 = np.moveaxis(boxes, -1, 0)
    return np.stack([np.minimum(y1, y2), np.minimum(x1, x2), np.maximum(y1, y2), np.maximum(x1, x2)], -1)


def _iou(corners, area, i, j):
    """Intersection over union of boxes i and j (0 where either is empty or they do not meet)."""
    low, high = np.maximum(corners[i, :2], corners[j, :2]), np.minimum(corners[i, 2:], corners[j, 2:])
    inter = np.prod(np.clip(high - low, 0, None))
    union = area[i] + area[j] - inter
    return 0.0 if inter <= 0 or area[i] <= 0 or area[j] <= 0 else inter / union
