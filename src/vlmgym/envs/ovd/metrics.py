"""COCO-style detection metrics: mAP over IoU 0.5:0.95 and AP50, as pycocotools' COCOeval computes them for boxes
(area range all, at most 100 detections per image and category), and their bootstrap over images.

Answers carry no confidence, so every detection scores 1 and ranks where it stands: COCOeval sorts detections
by score with a stable sort, so tied ones keep their order, image by image in the order the images are given,
and within an image the answer's order (VLM-R1's reward gives every box the score 1.0 the same way). Per
category: a detection matches the unmatched true box of its category with the highest IoU >= the threshold (a
later true box wins a tie, as in COCOeval); precision is made monotone from the right and read at the 101 recall
points 0, 0.01, ..., 1 (0 past the last recall reached); AP is their mean, mAP the mean over the 10 thresholds
and the categories that have a true box (a category without one is left out, COCOeval's -1), AP50 the same at
0.5 alone. IoU is COCO's: corners (x1, y1, x2, y2) as [x, y, w, h], intersection over union, no +1 pixel.

DetectionAP is the split's mAP (or AP50) as a vlmgym.stats.bootstrap.Statistic: each bootstrap resample of the
images is scored afresh as a dataset, so its interval comes from the shared bootstrap like every other metric.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vlmgym.stats.bootstrap import Statistic

IOU_THRESHOLDS = np.linspace(0.5, 0.95, int(np.round((0.95 - 0.5) / 0.05)) + 1)  # COCOeval's Params.iouThrs
RECALL_POINTS = np.linspace(0.0, 1.00, int(np.round((1.00 - 0.0) / 0.01)) + 1)  # Params.recThrs
MAX_DETECTIONS = 100  # Params.maxDets[-1], per image and category

Box = Sequence[float]
Labelled = tuple[str, Box]  # (label, (x1, y1, x2, y2))


def coco_iou(d: Box, g: Box) -> float:
    """COCO's box IoU (maskApi bbIou) of two corner boxes, as [x, y, w, h]: 0 without a positive overlap."""
    dx, dy, dw, dh = d[0], d[1], d[2] - d[0], d[3] - d[1]
    gx, gy, gw, gh = g[0], g[1], g[2] - g[0], g[3] - g[1]
    iw = min(dx + dw, gx + gw) - max(dx, gx)
    if iw <= 0:
        return 0.0
    ih = min(dy + dh, gy + gh) - max(dy, gy)
    if ih <= 0:
        return 0.0
    return float(iw * ih / (dw * dh + gw * gh - iw * ih))


def match_image(detections: Sequence[Box], truths: Sequence[Box]) -> np.ndarray:
    """(thresholds, detections) bool: whether each detection (in rank order) is a true positive at each threshold
    (COCOeval.evaluateImg for one image and category)."""
    detections = list(detections)[:MAX_DETECTIONS]
    ious = [[coco_iou(d, g) for g in truths] for d in detections]
    hits = np.zeros((len(IOU_THRESHOLDS), len(detections)), bool)
    for t, threshold in enumerate(IOU_THRESHOLDS):
        taken = [False] * len(truths)
        for i in range(len(detections)):
            best, m = min(threshold, 1 - 1e-10), -1
            for j in range(len(truths)):
                if taken[j] or ious[i][j] < best:
                    continue
                best, m = ious[i][j], j
            if m > -1:
                taken[m] = True
                hits[t, i] = True
    return hits


def average_precision(hits: np.ndarray, n_truth: int) -> np.ndarray:
    """AP per threshold (COCOeval.accumulate) of detections in rank order: hits (thresholds, detections), out of
    n_truth true boxes (> 0)."""
    thresholds, count = hits.shape
    if count == 0:
        return np.zeros(thresholds)
    tp = np.cumsum(hits, axis=1, dtype=np.float64)
    fp = np.cumsum(~hits, axis=1, dtype=np.float64)
    recall = tp / n_truth
    precision = tp / (fp + tp + np.spacing(1))
    precision = np.flip(np.maximum.accumulate(np.flip(precision, axis=1), axis=1), axis=1)  # monotone from the right
    at = np.stack([np.searchsorted(recall[t], RECALL_POINTS, side="left") for t in range(thresholds)])
    read = np.take_along_axis(precision, np.minimum(at, count - 1), axis=1)
    return np.where(at < count, read, 0.0).mean(axis=1)


def dataset_ap(images: Sequence[tuple[Sequence[Labelled], Sequence[Labelled]]]) -> tuple[float, float]:
    """(mAP 0.5:0.95, AP50) of images given as (truths, detections in rank order), each a (label, box) list;
    nan when no image has a true box."""
    mean_ap, ap50 = DetectionTable.build(images).scores(np.arange(len(images))[None, :])[0]
    return float(mean_ap), float(ap50)


@dataclass
class DetectionTable:
    """Each category's detections of all images, their hits per threshold, and true-box counts per image."""

    categories: list[str]
    truths: np.ndarray  # (images, categories) true boxes
    counts: np.ndarray  # (images, categories) detections kept
    hits: list[np.ndarray]  # per category: (thresholds, its detections of every image, image by image)
    _cache: dict = field(default_factory=dict)

    @classmethod
    def build(cls, images: Sequence[tuple[Sequence[Labelled], Sequence[Labelled]]]) -> DetectionTable:
        categories = sorted({label for truths, _ in images for label, _ in truths})
        n_truth = np.zeros((len(images), len(categories)), np.int64)
        counts = np.zeros((len(images), len(categories)), np.int64)
        hits: list[list[np.ndarray]] = [[] for _ in categories]
        for i, (truths, detections) in enumerate(images):
            for k, c in enumerate(categories):
                true_boxes = [box for label, box in truths if label == c]
                boxes = [box for label, box in detections if label == c][:MAX_DETECTIONS]
                n_truth[i, k], counts[i, k] = len(true_boxes), len(boxes)
                hits[k].append(match_image(boxes, true_boxes))
        joined = [np.concatenate(h, axis=1) if h else np.zeros((len(IOU_THRESHOLDS), 0), bool) for h in hits]
        return cls(categories, n_truth, counts, joined)

    def scores(self, indices: np.ndarray) -> np.ndarray:
        """(rows, 2): mAP and AP50 of each row of image indices, its images in that order (nan: no true box)."""
        key = hashlib.blake2b(np.ascontiguousarray(indices).tobytes() + str(indices.shape).encode()).hexdigest()
        if key in self._cache:
            return self._cache[key]
        starts = np.concatenate([np.zeros((1, self.counts.shape[1]), np.int64), np.cumsum(self.counts, axis=0)])
        out = np.full((indices.shape[0], 2), np.nan)
        for r, row in enumerate(indices):
            n_truth = self.truths[row].sum(axis=0)
            counts = self.counts[row]
            # where each resampled image's detections of a category start in that category's column of hits
            shift = starts[row] - (np.cumsum(counts, axis=0) - counts)
            per_category = []
            for k in np.flatnonzero(n_truth):
                positions = np.repeat(shift[:, k], counts[:, k]) + np.arange(int(counts[:, k].sum()))
                per_category.append(average_precision(self.hits[k][:, positions], int(n_truth[k])))
            if per_category:
                ap = np.asarray(per_category)
                out[r] = ap.mean(), ap[:, 0].mean()
        self._cache.clear()
        self._cache[key] = out
        return out


@dataclass(frozen=True, eq=False)
class DetectionAP(Statistic):
    """A split's mAP (column 0) or AP50 (column 1) as a Statistic: each resample of images scored as a dataset."""

    table: Any = None
    column: int = 0

    def on(self, indices: np.ndarray) -> np.ndarray:
        return self.table.scores(np.asarray(indices))[:, self.column]


def ap_statistics(images: Sequence[tuple[Sequence[Labelled], Sequence[Labelled]]]) -> dict[str, Statistic]:
    """{"map": mAP 0.5:0.95, "ap50": AP50} over the images, for the shared bootstrap."""
    table = DetectionTable.build(images)
    placeholder = np.zeros(len(images))  # the sample count the bootstrap reads; the table holds the data
    return {"map": DetectionAP("mean", placeholder, table=table, column=0),
            "ap50": DetectionAP("mean", placeholder, table=table, column=1)}
