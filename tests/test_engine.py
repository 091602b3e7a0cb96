"""Training/eval building blocks: boxes, Hungarian matcher, set loss, metrics, optimiser."""
import itertools
import math

import pytest
import torch

from irpe.box_ops import box_cxcywh_to_xyxy, box_xyxy_to_cxcywh, generalized_box_iou
from irpe.models import create_model
from irpe.training.criterion import SetCriterion
from irpe.training.evaluate import coco_map, detections_to_coco, topk_accuracy
from irpe.training.matcher import HungarianMatcher
from irpe.training.optim import mixup_cutmix, param_groups, soft_cross_entropy, warmup_cosine


def test_generalized_iou_hand_values():
    a = torch.tensor([[0.0, 0.0, 1.0, 1.0]])
    b = torch.tensor([[0.0, 0.0, 1.0, 1.0], [2.0, 0.0, 3.0, 1.0], [0.5, 0.0, 1.5, 1.0]])
    # identical: 1; disjoint with hull 3, union 2: -1/3; half overlap: iou 1/3, hull = union
    assert torch.allclose(generalized_box_iou(a, b), torch.tensor([[1.0, -1 / 3, 1 / 3]]))
    with pytest.raises(ValueError):
        generalized_box_iou(torch.tensor([[1.0, 1.0, 0.0, 0.0]]), a)


def test_box_conversions_invert():
    boxes = torch.rand(10, 4)
    assert torch.allclose(box_xyxy_to_cxcywh(box_cxcywh_to_xyxy(boxes)), boxes, atol=1e-6)


def _brute_force(cost):
    """Optimal assignment by trying every injection of targets into predictions."""
    q, n = cost.shape
    best = min(itertools.permutations(range(q), n),
               key=lambda perm: sum(cost[p, j] for j, p in enumerate(perm)))
    return sorted(zip(best, range(n), strict=True))


def test_matcher_beats_greedy_on_hand_made_case():
    # L1 cost only. Greedy takes pred0->t0 (cost 0.1) and then pays 0.9 for pred1->t1;
    # the optimum is pred0->t1 (0.2) + pred1->t0 (0.2).
    preds = torch.tensor([[[0.5, 0.5, 0.2, 0.2], [0.7, 0.5, 0.2, 0.2], [0.1, 0.1, 0.1, 0.1]]])
    t0 = [0.6, 0.5, 0.2, 0.2]
    t1 = [0.3, 0.5, 0.2, 0.2]
    targets = [{"labels": torch.tensor([0, 1]), "boxes": torch.tensor([t0, t1])}]
    out = {"pred_logits": torch.zeros(1, 3, 3), "pred_boxes": preds}
    matcher = HungarianMatcher(cost_class=0, cost_bbox=1, cost_giou=0)
    (rows, cols), = matcher(out, targets)
    assert list(zip(rows.tolist(), cols.tolist(), strict=True)) == [(0, 1), (1, 0)]


def test_matcher_equals_brute_force_with_all_costs():
    gen = torch.Generator().manual_seed(3)
    for _ in range(5):
        q, n = 6, 4
        cxcy = torch.rand(1, q, 2, generator=gen) * 0.6 + 0.2
        preds = torch.cat([cxcy, torch.rand(1, q, 2, generator=gen) * 0.3 + 0.05], -1)
        boxes = torch.cat([torch.rand(n, 2, generator=gen) * 0.6 + 0.2,
                           torch.rand(n, 2, generator=gen) * 0.3 + 0.05], -1)
        target = {"labels": torch.randint(0, 3, (n,), generator=gen), "boxes": boxes}
        out = {"pred_logits": torch.randn(1, q, 4, generator=gen), "pred_boxes": preds}
        matcher = HungarianMatcher()
        (rows, cols), = matcher(out, [target])
        cost = matcher.cost_matrix(out["pred_logits"][0], preds[0], target)
        got = sorted(zip(rows.tolist(), cols.tolist(), strict=True))
        assert math.isclose(sum(cost[p, j] for p, j in got),
                            sum(cost[p, j] for p, j in _brute_force(cost)), rel_tol=1e-6)


def test_matcher_handles_image_without_objects():
    out = {"pred_logits": torch.zeros(1, 3, 3), "pred_boxes": torch.rand(1, 3, 4)}
    (rows, cols), = HungarianMatcher()(out, [{"labels": torch.zeros(0, dtype=torch.long),
                                              "boxes": torch.zeros(0, 4)}])
    assert rows.numel() == cols.numel() == 0


def _perfect_outputs(targets, queries=5, classes=3):
    logits = torch.full((len(targets), queries, classes + 1), -20.0)
    logits[..., classes] = 20.0  # every query says "no object" ...
    boxes = torch.full((len(targets), queries, 4), 0.5)
    for i, t in enumerate(targets):  # ... except one query per object, exactly right
        n = len(t["labels"])
        logits[i, :n, classes] = -20.0
        logits[i, torch.arange(n), t["labels"]] = 20.0
        boxes[i, :n] = t["boxes"]
    return {"pred_logits": logits, "pred_boxes": boxes,
            "aux_outputs": [{"pred_logits": logits, "pred_boxes": boxes}]}


def test_set_loss_zero_for_perfect_predictions_and_positive_otherwise():
    targets = [{"labels": torch.tensor([2, 0]),
                "boxes": torch.tensor([[0.3, 0.3, 0.2, 0.2], [0.7, 0.6, 0.3, 0.1]])},
               {"labels": torch.tensor([1]), "boxes": torch.tensor([[0.5, 0.5, 0.4, 0.4]])}]
    crit = SetCriterion(3, HungarianMatcher())
    losses = crit(_perfect_outputs(targets), targets)
    for name in ("loss_ce", "loss_bbox", "loss_giou", "loss_ce_0", "loss_bbox_0"):
        assert float(losses[name]) < 1e-6, name
    bad = _perfect_outputs(targets)
    bad["pred_boxes"] = bad["pred_boxes"] * 0.9
    bad["aux_outputs"][0]["pred_boxes"] = bad["pred_boxes"]
    worse = crit(bad, targets)
    assert float(worse["loss_bbox"]) > 0.01 and float(worse["loss_giou"]) > 0.01
    # total = 1*ce + 5*l1 + 2*giou, summed over the last and the aux layer
    expected = 2 * (worse["loss_ce"] + 5 * worse["loss_bbox"] + 2 * worse["loss_giou"])
    assert torch.allclose(worse["loss"], expected)


def test_topk_accuracy_hand_case():
    logits = torch.tensor([[0.1, 0.9, 0.0], [0.8, 0.1, 0.3], [0.2, 0.3, 0.5]])
    labels = torch.tensor([1, 2, 0])
    assert topk_accuracy(logits, labels, ks=(1, 2, 5)) == {1: 1, 2: 2, 5: 3}


def _gt():
    images = [{"id": i, "file_name": f"{i}.png", "width": 100, "height": 80} for i in (1, 2)]
    anns = [{"id": 1, "image_id": 1, "category_id": 3, "bbox": [10, 10, 30, 20], "area": 600,
             "iscrowd": 0},
            {"id": 2, "image_id": 2, "category_id": 5, "bbox": [50, 20, 40, 40], "area": 1600,
             "iscrowd": 0}]
    return {"images": images, "annotations": anns,
            "categories": [{"id": 3, "name": "a"}, {"id": 5, "name": "b"}]}


def test_coco_map_perfect_is_one_and_wrong_class_is_zero():
    gt = _gt()
    perfect = [{"image_id": a["image_id"], "category_id": a["category_id"], "bbox": a["bbox"],
                "score": 0.9} for a in gt["annotations"]]
    assert coco_map(gt, perfect)["AP"] == pytest.approx(1.0)
    assert coco_map(gt, perfect)["AP50"] == pytest.approx(1.0)
    swapped = [dict(p, category_id=8 - p["category_id"]) for p in perfect]
    assert coco_map(gt, swapped)["AP"] == pytest.approx(0.0)
    assert coco_map(gt, [])["AP"] == 0.0
    # shifted by half a box width: IoU 1/3 < 0.5, so no AP50 credit
    shifted = [dict(p, bbox=[p["bbox"][0] + p["bbox"][2] / 2] + p["bbox"][1:]) for p in perfect]
    assert coco_map(gt, shifted)["AP50"] == pytest.approx(0.0)


def test_detections_to_coco_converts_boxes_and_ids():
    res = [{"boxes": torch.tensor([[10.0, 10.0, 40.0, 30.0]]), "scores": torch.tensor([0.5]),
            "labels": torch.tensor([1])}]
    out = detections_to_coco(res, [7], category_ids=[3, 5])
    assert out == [{"image_id": 7, "category_id": 5, "bbox": [10.0, 10.0, 30.0, 20.0],
                    "score": 0.5}]


def test_param_groups_exclude_rpe_tables_norms_and_tokens_from_decay():
    model = create_model("deit_shapes_irpe")
    groups = param_groups(model, weight_decay=0.05, lr=1e-3)
    decay = {n for g in groups if g["weight_decay"] > 0 for n in g["names"]}
    nodecay = {n for g in groups if g["weight_decay"] == 0 for n in g["names"]}
    assert any("lookup_table" in n for n in nodecay) and not any("lookup_table" in n for n in decay)
    assert {"pos_embed", "cls_token", "blocks.0.norm1.weight", "head.bias"} <= nodecay
    assert {"blocks.0.attn.qkv.weight", "head.weight"} <= decay
    assert len(decay | nodecay) == sum(1 for _ in model.parameters())


def test_param_groups_detr_backbone_lr():
    model = create_model("detr_tiny_irpe", norm="batch")
    groups = param_groups(model, 1e-4, lr=1e-4, lr_backbone=1e-5)
    for g in groups:
        assert all(n.startswith("backbone.") == (g["lr"] == 1e-5) for n in g["names"])
    nodecay = {n for g in groups if g["weight_decay"] == 0 for n in g["names"]}
    assert any("lookup_table" in n for n in nodecay)


def test_warmup_cosine_shape():
    assert warmup_cosine(0, 100, 10, 0.01) == pytest.approx(0.1)
    assert warmup_cosine(10, 100, 10, 0.01) == pytest.approx(1.0)
    assert warmup_cosine(55, 100, 10, 0.01) == pytest.approx(0.01 + 0.99 * 0.5)
    assert warmup_cosine(100, 100, 10, 0.01) == pytest.approx(0.01)
    assert warmup_cosine(5, 100, 0, 0.0) < 1.0


def test_mixup_cutmix_targets_are_distributions():
    images = torch.arange(4.0).view(4, 1, 1, 1).expand(4, 3, 8, 8).clone()
    labels = torch.tensor([0, 1, 2, 3])
    for mix, cut in ((0.8, 0.0), (0.0, 1.0), (0.0, 0.0)):
        x, t = mixup_cutmix(images, labels, 5, mix, cut, smoothing=0.1)
        assert torch.allclose(t.sum(-1), torch.ones(4))
        if mix == cut == 0:
            assert torch.equal(x, images) and int(t.argmax(-1).eq(labels).sum()) == 4
    x, t = mixup_cutmix(images, labels, 5, 0.0, 1.0, smoothing=0.0)
    # cutmix: the weight of the pasted label equals the pasted area fraction
    frac = (x[0] == 3.0).float().mean()
    assert t[0, 3] == pytest.approx(float(frac), abs=1e-6)


def test_soft_cross_entropy_matches_hard_labels():
    logits = torch.randn(6, 5)
    labels = torch.randint(0, 5, (6,))
    hard = torch.nn.functional.one_hot(labels, 5).float()
    assert torch.allclose(soft_cross_entropy(logits, hard),
                          torch.nn.functional.cross_entropy(logits, labels))


def test_rank_shares_of_a_global_batch_are_the_one_process_batch():
    from irpe.training.distributed import Dist, ResumableSampler, ShardSampler
    n, batch, world = 37, 4, 3
    for epoch in (0, 1):
        ranks = []
        for r in range(world):
            s = ResumableSampler(n, Dist(rank=r, world=world), seed=5)
            s.set_epoch(epoch)
            ranks.append(list(s))
        single = ResumableSampler(n, Dist(), seed=5)
        single.set_epoch(epoch)
        one = list(single)
        steps = n // (batch * world)
        for step in range(steps):  # rank r's step-th batch are samples r, r + W, ... of it
            part = slice(step * batch, (step + 1) * batch)
            merged = sorted(i for r in range(world) for i in ranks[r][part])
            assert merged == sorted(one[step * batch * world:(step + 1) * batch * world])
    resumed = ResumableSampler(n, Dist(rank=1, world=world), seed=5)
    resumed.set_epoch(1, start=batch)
    assert list(resumed) == ranks[1][batch:] and len(resumed) == len(ranks[1]) - batch
    shards = [list(ShardSampler(n, Dist(rank=r, world=world))) for r in range(world)]
    assert sorted(i for s in shards for i in s) == list(range(n))  # once each, no padding


def test_flip_coins_of_a_slot_are_the_same_for_processes_and_micro_batches():
    from irpe.training.distributed import Dist
    from irpe.training.tasks import StepCoins, random_hflip
    images = torch.arange(8.0).view(8, 1, 1, 1).expand(8, 1, 2, 3).contiguous()
    one = StepCoins(torch.Generator().manual_seed(1), 0.5)
    one.draw(8)
    whole = one.flips(0)
    assert 0 < int(whole.sum()) < 8
    flipped = random_hflip(images, None, whole)
    assert torch.equal(flipped[whole], images[whole].flip(-1))
    assert torch.equal(flipped[~whole], images[~whole])
    accum = StepCoins(torch.Generator().manual_seed(1), 0.5, accum=2)
    accum.draw(4)
    for r in range(2):  # process r of 2 == micro-batch r of 2 accumulated == slot r
        rank = StepCoins(torch.Generator().manual_seed(1), 0.5, Dist(rank=r, world=2))
        rank.draw(4)
        assert torch.equal(rank.flips(0), whole[r::2]) and torch.equal(accum.flips(r), whole[r::2])
    assert not StepCoins(torch.Generator().manual_seed(1), 0.0).flips(0).any()


def test_accumulated_micro_batches_are_dealt_like_processes():
    from irpe.training.distributed import Dist, ResumableSampler
    n, batch = 37, 3
    procs = [ResumableSampler(n, Dist(rank=r, world=2), seed=5, batch_size=batch)
             for r in range(2)]
    accum = ResumableSampler(n, Dist(), seed=5, batch_size=batch, accum=2)
    for s in (*procs, accum):
        s.set_epoch(1)
    p0, p1, a = list(procs[0]), list(procs[1]), list(accum)
    assert len(a) == len(p0) + len(p1) == len(accum) == (n // 2 // batch) * batch * 2
    for step in range(len(p0) // batch):  # step: slot 0's micro-batch, then slot 1's
        part = slice(step * batch, (step + 1) * batch)
        assert a[2 * step * batch:(2 * step + 1) * batch] == p0[part]
        assert a[(2 * step + 1) * batch:(2 * step + 2) * batch] == p1[part]
    resumed = ResumableSampler(n, Dist(), seed=5, batch_size=batch, accum=2)
    resumed.set_epoch(1, start=2 * batch)  # one step done
    assert list(resumed) == a[2 * batch:] and len(resumed) == len(a) - 2 * batch


def test_detr_normalisers_are_the_step_counts_however_the_batch_is_split():
    from irpe.training.criterion import StepTotals
    crit = SetCriterion(3, HungarianMatcher())
    targets = [{"labels": torch.tensor([2, 0]), "boxes": torch.rand(2, 4)},
               {"labels": torch.tensor([1]), "boxes": torch.rand(1, 4)},
               {"labels": torch.tensor([0, 1, 2]), "boxes": torch.rand(3, 4)}]
    whole = crit.step_totals([StepTotals.local(targets, queries=2)])
    split = crit.step_totals([StepTotals.local(targets[:1], 2), StepTotals.local(targets[1:], 2)])
    assert (whole.images, whole.boxes, whole.matched, whole.slots) == (3, 6, 5, 1)
    assert (split.images, split.boxes, split.matched, split.slots) == (3, 6, 5, 2)
    # 6 queries, 5 matched (weight 1), 1 "no object" (weight 0.1)
    assert crit.class_weight_sum(whole, 2) == pytest.approx(5.1)
    outputs = _perfect_outputs(targets[:2])
    default = crit(outputs, targets[:2])
    explicit = crit(outputs, targets[:2], StepTotals.local(targets[:2], 5))
    assert all(torch.equal(default[k], explicit[k]) for k in default)


