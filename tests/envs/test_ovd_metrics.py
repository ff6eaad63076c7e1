"""ovd's COCO-style metrics (vlmgym.envs.ovd.metrics) on hand-computed cases, their bootstrap through the shared
evaluation, and, where pycocotools happens to be installed, against COCOeval itself."""

from __future__ import annotations

import numpy as np
import pytest

from vlmgym.envs.ovd.metrics import IOU_THRESHOLDS, ap_statistics, coco_iou, dataset_ap, match_image

G1, G2 = (0, 0, 100, 100), (200, 200, 300, 300)
IOU_72 = (0, 0, 100, 72)  # IoU 0.72 with G1: a hit at the thresholds 0.5-0.7, a miss at 0.75-0.95
FAR = (500, 500, 600, 600)


def test_coco_iou_is_plain_intersection_over_union():
    assert coco_iou(G1, G1) == 1.0 and coco_iou(G1, IOU_72) == pytest.approx(0.72)
    assert coco_iou(G1, (50, 0, 150, 100)) == pytest.approx(5000 / 15000)
    assert coco_iou(G1, (100, 0, 200, 100)) == 0.0  # touching edges: no overlap (no +1 pixel)


def test_a_detection_takes_the_best_unmatched_true_box_per_threshold():
    hits = match_image([IOU_72, G1], [G1])
    # the 0.72 box comes first and takes G1 where it may; the exact box is then left without one there
    assert hits[:, 0].tolist() == [True] * 5 + [False] * 5
    assert hits[:, 1].tolist() == [False] * 5 + [True] * 5


def test_map_of_a_hand_computed_case():
    # one category, two true boxes, answers: a miss then a 0.72 hit. Where the hit counts (5 of 10 thresholds):
    # recall [0, 0.5], precision [0, 0.5] -> made monotone [0.5, 0.5]; the 51 recall points 0..0.5 read 0.5, the
    # other 50 read 0: AP = 51 x 0.5 / 101. Elsewhere AP = 0.
    ap = 51 * 0.5 / 101
    images = [([("cat", G1), ("cat", G2)], [("cat", FAR), ("cat", IOU_72)])]
    mean_ap, ap50 = dataset_ap(images)
    assert ap50 == pytest.approx(ap) and mean_ap == pytest.approx(ap / 2)
    # a second category found exactly (AP 1 everywhere) averages in; a category with no true box is left out
    images = [([("cat", G1), ("cat", G2), ("dog", FAR)], [("cat", FAR), ("cat", IOU_72), ("dog", FAR),
                                                          ("bird", G1)])]
    mean_ap, ap50 = dataset_ap(images)
    assert mean_ap == pytest.approx((ap / 2 + 1) / 2) and ap50 == pytest.approx((ap + 1) / 2)


def test_tied_scores_rank_image_by_image_as_cocoeval_does():
    # every box scores 1, so the order decides: a hit then a miss reads precision 1 up to recall 0.5, the other
    # way round 0.5
    hit, miss = ([("cat", G1)], [("cat", G1)]), ([("cat", G2)], [("cat", FAR)])
    assert dataset_ap([hit, miss])[1] == pytest.approx(51 / 101)
    assert dataset_ap([miss, hit])[1] == pytest.approx(51 * 0.5 / 101)


def test_no_detections_and_no_truth():
    assert dataset_ap([([("cat", G1)], [])]) == (0.0, 0.0)
    assert all(np.isnan(dataset_ap([([], [("cat", G1)])])))
    duplicates = [([("cat", G1)], [("cat", G1)] * 3)]  # precision 1 at recall 1 first: duplicates cost nothing
    assert dataset_ap(duplicates) == (pytest.approx(1.0), pytest.approx(1.0))


def test_the_statistics_rescore_each_resample_as_a_dataset():
    hit, miss = ([("cat", G1)], [("cat", G1)]), ([("cat", G2)], [("cat", FAR)])
    stats = ap_statistics([hit, miss])
    assert stats["ap50"].point() == pytest.approx(51 / 101) and len(stats["map"].values) == 2
    rows = stats["ap50"].on(np.array([[0, 0], [1, 1], [1, 0]]))
    assert rows.tolist() == pytest.approx([1.0, 0.0, 51 * 0.5 / 101])
    from vlmgym.stats.bootstrap import bootstrap_intervals

    interval = bootstrap_intervals(stats, n_resamples=200)["map"]
    assert 0 <= interval.low <= interval.estimate <= interval.high <= 1


def test_thresholds_are_cocos():
    assert len(IOU_THRESHOLDS) == 10 and IOU_THRESHOLDS[0] == 0.5 and IOU_THRESHOLDS[-1] == pytest.approx(0.95)


def test_against_pycocotools():
    """Only where pycocotools happens to be installed: it is no dependency (importorskip, not an import)."""
    import contextlib
    import io

    COCO = pytest.importorskip("pycocotools.coco").COCO
    COCOeval = pytest.importorskip("pycocotools.cocoeval").COCOeval

    rng = np.random.default_rng(0)
    images, gt, dt = [], {"images": [], "annotations": [], "categories": [{"id": 1, "name": "a"},
                                                                         {"id": 2, "name": "b"}]}, []
    for i in range(6):
        truths, detections = [], []
        gt["images"].append({"id": i, "width": 1000, "height": 1000})
        for _ in range(3):
            x, label = rng.uniform(0, 800, 2), ("a", "b")[int(rng.integers(2))]
            box = (x[0], x[1], x[0] + rng.uniform(50, 200), x[1] + rng.uniform(50, 200))
            truths.append((label, box))
            gt["annotations"].append({"id": len(gt["annotations"]) + 1, "image_id": i, "iscrowd": 0,
                                      "category_id": 1 + (label == "b"), "area": (box[2] - box[0]) * (box[3] - box[1]),
                                      "bbox": [box[0], box[1], box[2] - box[0], box[3] - box[1]]})
            jitter = tuple(v + rng.normal(0, 15) for v in box)
            detections.append((label, jitter))
            dt.append({"image_id": i, "category_id": 1 + (label == "b"), "score": 1.0,
                       "bbox": [jitter[0], jitter[1], jitter[2] - jitter[0], jitter[3] - jitter[1]]})
        images.append((truths, detections))
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO()
        coco.dataset = gt
        coco.createIndex()
        evaluator = COCOeval(coco, coco.loadRes(dt), "bbox")
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    assert dataset_ap(images) == (pytest.approx(evaluator.stats[0]), pytest.approx(evaluator.stats[1]))
