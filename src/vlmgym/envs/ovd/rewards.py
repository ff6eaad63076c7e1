"""ovd's rewards: the default, a matching F1 that junk cannot farm, and VLM-R1's three OVD rewards as published
(vlm_r1.py). Every option gives a reward in [0, 1] for any text and never raises.

`f1` (the default): detections and true boxes are matched one to one regardless of label, greedily by IoU
(highest first; a tie goes to the earlier detection, then the earlier true box), a pair only at IoU >= 0.5; a
matched pair pays its IoU when the detection's label is the true one (lower case, whitespace collapsed), nothing
otherwise. With n_items the items of the answer's list (every one, a box or not) and n_truth the true boxes:

    reward = 2 x sum(IoU of matched pairs with the right label) / (n_items + n_truth)

a soft F1: 1 for exactly the true boxes, each labelled right; 0 for no list, an empty list, boxes that overlap
nothing, or labels that are all wrong. A duplicate of a right box matches nothing (its true box is taken) and
only adds to n_items; listing a box under every named category matches it once, under the first label listed,
so hedging over k labels earns at most 2 / (k + 1) of the box where committing to the right one earns all of it;
categories that are absent from the image have no true box, so their boxes only add to n_items. An empty truth
(not generated, possible in hand-made data) pays 1 for an empty list and 0 otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence

from vlmgym.envs.ovd.metrics import Labelled
from vlmgym.envs.ovd.parse import Detection
from vlmgym.envs.rec.boxes import iou

MATCH_IOU = 0.5
OPTIONS = ("f1", "odLength", "weighted_sum", "cosine")


def match(detections: Sequence[Detection], truths: Sequence[Labelled],
          threshold: float = MATCH_IOU) -> list[tuple[int, int, float]]:
    """One-to-one (detection index, truth index, IoU) pairs, label-blind, greedy by IoU (module docstring)."""
    pairs = sorted(((iou(d.box, box), i, j) for i, d in enumerate(detections) if d.box is not None
                    for j, (_, box) in enumerate(truths)), key=lambda p: (-p[0], p[1], p[2]))
    used_d, used_t, out = set(), set(), []
    for overlap, i, j in pairs:
        if overlap < threshold:
            break
        if i in used_d or j in used_t:
            continue
        used_d.add(i)
        used_t.add(j)
        out.append((i, j, overlap))
    return out


def f1_reward(detections: Sequence[Detection], n_items: int, read: bool,
              truths: Sequence[Labelled]) -> tuple[float, int]:
    """(the soft F1 of the module docstring, how many true boxes were found with the right label)."""
    if not truths:
        return (1.0 if read and n_items == 0 else 0.0), 0
    right = [(i, j, overlap) for i, j, overlap in match(detections, truths)
             if detections[i].label == truths[j][0]]
    total = sum(overlap for _, _, overlap in right)
    return min(1.0, 2.0 * total / (n_items + len(truths))), len(right)
