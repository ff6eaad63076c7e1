"""VLM-R1's three OVD rewards, ported as published, quirks included (never ovd's default: see rewards.py).

Reference: github.com/om-ai-lab/VLM-R1, src/open-r1-multimodal/src/open_r1/grpo_jsonl.py at commit
90052f478646e38bc67363862f699b7afca6b337 (its README's 2025-04-03 note names `odLength`, `weighted_sum` and
`cosine` as the OVD rewards): odLength_reward -> map_reward(length_reward=True) -> calculate_map (COCOeval on one
image), the `weighted_sum` branch of accuracy_reward -> detection_score (with its own `iou`), and cosine_rewards ->
cosine_reward. The solution string is built as VLM-R1's OVD data holds it (solution()): the true list in a
```json fence inside <answer> tags, or `<answer>None</answer>` when nothing named is in the image.

The answer: VLM-R1 reads the last <answer> block of the completion (odLength: no block, reward 0). vlmgym's think
option already hands the env the answer block's text, so the text scored here is that block's content (the
answer as it is without the think option); where the text itself holds <answer> blocks, the last one is read.

What each pays for junk (and the quirks it keeps):
- odLength: COCO mAP@[.5:.95] of the LAST ```json block's items against the truth, every box at score 1.0, times
  min(1, n_truth / n_items). No fence: no items, 0 (1.0 when the truth is empty: any answer without a ```json
  block then pays in full). Items whose label is not exactly (case-sensitive) a true label, or whose bbox_2d is not
  four numbers, are dropped from the mAP (VLM-R1's try/except) but still count in n_items. Duplicates of a right
  box cost only through the length factor (half the reward for each box listed twice).
- weighted_sum (detection_score, alpha 0.7, beta 0, gamma 0.3): reads the FIRST ```json block (after lower-casing
  the text), greedy IoU matching at >= 0.5 with VLM-R1's +1-pixel IoU; a matched pair with the wrong label still
  counts as matched (IoU 0 in the position score, but it fills the completeness term), so right boxes with any
  labels pay 0.3; a matched box without a label reuses the previous match's label (its `except` assigns a typo'd
  variable; VLM-R1 raises when that happens on the first match, which here counts as a wrong label). Empty list or
  no fence: 0; any box list on an empty truth: 0, the text `None`: 1. A non-finite IoU (NaN or Infinity in the
  JSON) counts as 0 here, so the reward stays in [0, 1].
- cosine (cosine_reward): VLM-R1 overwrites the accuracy with 1.0 before using it, so the reward depends on the
  answer's length alone: 1 - 0.5 x (1 - cos(pi x tokens / 1024)) / 2, in [0.5, 1]. The empty answer pays 1.0,
  the maximum; any junk pays at least 0.5. Tokens: the env's tokenizer's encode of the text, else its UTF-8 bytes.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from vlmgym.envs.ovd.metrics import Labelled, dataset_ap

ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
JSON_BLOCK = re.compile(r"```json(.*?)```", re.DOTALL)
COSINE_MAX_LEN = 1024
AREA_MAX = 1e5 ** 2  # COCOeval's areaRng `all`


def solution(truths: Sequence[Labelled]) -> str:
    """VLM-R1's solution text of a sample: the true list fenced inside <answer> tags, or None inside them."""
    if not truths:
        return "<answer>None</answer>"
    items = [{"bbox_2d": [int(v) for v in box], "label": label} for label, box in truths]
    return f"<answer>```json\n{json.dumps(items)}\n```</answer>"


def _answer(text: str) -> str:
    blocks = ANSWER.findall(text)
    return blocks[-1].strip() if blocks else text.strip()


def _items(text: str, last: bool) -> list:
    """`[item for item in json.loads(block)]` of the last (or first) ```json block; [] where that fails."""
    blocks = JSON_BLOCK.findall(text)
    if not blocks:
        return []
    try:
        return [item for item in json.loads((blocks[-1] if last else blocks[0]).strip())]
    except (ValueError, TypeError, RecursionError):
        return []


def _numbers(box: Any) -> list[float] | None:
    try:
        values = [box[0], box[1], box[2], box[3]]
    except (TypeError, KeyError, IndexError):
        return None
    ok = all(isinstance(v, int | float) and math.isfinite(v) for v in values)
    return [float(v) for v in values] if ok else None


def calculate_map(predictions: list, truths: list) -> float:
    """calculate_map(score_type=0): COCO mAP of one image, categories = the true labels, every box at score 1."""
    labels = {item["label"] for item in truths}
    detections = []
    for item in predictions:
        try:
            label, box = item["label"], _numbers(item["bbox_2d"])
            area = None if box is None else (box[2] - box[0]) * (box[3] - box[1])
            # outside COCOeval's area range `all` an unmatched box is ignored, and such a box matches nothing
            if box is not None and isinstance(label, str) and label in labels and 0 <= area <= AREA_MAX:
                detections.append((label, box))
        except (TypeError, KeyError, IndexError):
            pass
    if not detections:
        return 0.0
    mean_ap, _ = dataset_ap([([(t["label"], t["bbox_2d"]) for t in truths], detections)])
    return mean_ap


def od_length(text: str, truths: Sequence[Labelled]) -> float:
    """odLength_reward (module docstring)."""
    student, ground = _answer(text), solution(truths)
    ground = ANSWER.search(ground).group(1).strip()
    if ground == "None" and student == "None":
        return 1.0
    gt = _items(ground, last=True)
    predicted = _items(student, last=True)
    if predicted and gt:
        reward = calculate_map(predicted, gt)
    elif not predicted and not gt:
        reward = 1.0
    else:
        reward = 0.0
    return reward * (1.0 if len(gt) >= len(predicted) else len(gt) / len(predicted))


def clean_text(text: str) -> str:
    """VLM-R1's clean_text: the last <answer> block, newlines as spaces, stripped, trailing dots off, lower case."""
    blocks = ANSWER.findall(text)
    if blocks:
        text = blocks[-1]
    for char in ("\n", "\r"):
        text = re.sub(r"(?<=\s)" + re.escape(char), "", text)
        text = re.sub(r"(?<!\s)" + re.escape(char), " ", text)
    return text.strip().rstrip(".").lower()


def r1_iou(box1: Any, box2: Any) -> float:
    """grpo_jsonl.iou: the +1-pixel intersection over the plain union."""
    inter_x1, inter_y1 = max(box1[0], box2[0]), max(box1[1], box2[1])
    inter_x2, inter_y2 = min(box1[2] - 1, box2[2] - 1), min(box1[3] - 1, box2[3] - 1)
    if inter_x1 < inter_x2 and inter_y1 < inter_y2:
        inter = (inter_x2 - inter_x1 + 1) * (inter_y2 - inter_y1 + 1)
    else:
        inter = 0
    union = (box1[2] - box1[0]) * (box1[3] - box1[1]) + (box2[2] - box2[0]) * (box2[3] - box2[1]) - inter
    return float(inter) / union


def detection_score(content: str, sol: str, iou_threshold: float = 0.5, alpha: float = 0.7, beta: float = 0.0,
                    gamma: float = 0.3) -> float:
    """detection_score, as published (its label quirk: module docstring)."""
    pred_boxes, gt_boxes = _items(clean_text(content), last=False), _items(clean_text(sol), last=False)
    if not gt_boxes:
        return 1.0 if not pred_boxes else 0.0
    if not pred_boxes:
        return 0.0
    matrix = []
    for pred in pred_boxes:
        row = []
        for gt in gt_boxes:
            try:
                value = r1_iou(pred["bbox_2d"], gt["bbox_2d"])
                row.append(value if math.isfinite(value) else 0.0)
            except Exception:  # noqa: BLE001 - the reference's bare except: anything unreadable overlaps nothing
                row.append(0.0)
        matrix.append(row)
    matches, preds, gts = [], list(range(len(pred_boxes))), list(range(len(gt_boxes)))
    pred_label: Any = _UNSET
    while preds and gts:
        best, bi, bj = -1.0, -1, -1
        for i in preds:
            for j in gts:
                if matrix[i][j] > best:
                    best, bi, bj = matrix[i][j], i, j
        if best < iou_threshold:
            break
        # the reference's `except: pred_box = ""` (a typo for pred_label): a label it cannot read leaves the
        # previous match's
        with contextlib.suppress(Exception):
            pred_label = pred_boxes[bi]["label"].lower()
        try:
            gt_label = gt_boxes[bj]["label"].lower()
        except Exception:  # noqa: BLE001
            gt_label = ""
        correct = pred_label is not _UNSET and pred_label == gt_label
        matches.append((best if correct else 0.0, correct))
        preds.remove(bi)
        gts.remove(bj)
    position = sum(m[0] for m in matches) / len(gt_boxes) if matches else 0.0
    label = sum(1.0 for m in matches if m[1]) / len(gt_boxes) if matches else 0.0
    completeness = 1.0 - (len(gts) / len(gt_boxes) + len(preds) / len(pred_boxes)) / 2.0
    return (alpha * position + beta * label + gamma * completeness) / (alpha + beta + gamma)


_UNSET = object()


def weighted_sum(text: str, truths: Sequence[Labelled]) -> float:
    """accuracy_reward's `weighted_sum` branch."""
    content, sol = clean_text(text), clean_text(solution(truths))
    if sol == "none":
        return 1.0 if content == "none" else 0.0
    return detection_score(content, sol)


def cosine(text: str, count_tokens: Callable[[str], int]) -> float:
    """cosine_reward with its accuracy hard-coded to 1 (module docstring)."""
    gen_len = count_tokens(text)
    min_value, max_value = 0.5, 1.0  # the "correct" branch: max_len_value_correct, min_len_value_correct
    return max_value - (max_value - min_value) * (1 - math.cos(gen_len * math.pi / COSINE_MAX_LEN)) / 2
