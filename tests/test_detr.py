"""DETR with iRPE: official key layout, padded batches == single images, post-processing."""
import pytest
import torch

import irpe
from irpe.models import PostProcess, pad_images
from irpe.models.backbone import FrozenBatchNorm2d, conv_out_size


def torchvision_resnet50_keys(prefix):
    """torchvision resnet50 state_dict keys/shapes minus fc (BN as DETR's FrozenBatchNorm2d)."""
    keys = {}

    def bn(name, c):
        for s in ("weight", "bias", "running_mean", "running_var"):
            keys[f"{prefix}{name}.{s}"] = (c,)

    keys[prefix + "conv1.weight"] = (64, 3, 7, 7)
    bn("bn1", 64)
    cin = 64
    for li, (n, w) in enumerate(zip([3, 4, 6, 3], [64, 128, 256, 512], strict=True), start=1):
        for b in range(n):
            p = f"layer{li}.{b}."
            keys[prefix + p + "conv1.weight"] = (w, cin, 1, 1)
            bn(p + "bn1", w)
            keys[prefix + p + "conv2.weight"] = (w, w, 3, 3)
            bn(p + "bn2", w)
            keys[prefix + p + "conv3.weight"] = (4 * w, w, 1, 1)
            bn(p + "bn3", 4 * w)
            if b == 0:
                keys[prefix + p + "downsample.0.weight"] = (4 * w, cin, 1, 1)
                bn(p + "downsample.1", 4 * w)
            cin = 4 * w
    return keys


def official_detr_irpe_keys(d=256, ffn=2048, layers=6, queries=100, classes=91):
    """Keys of facebookresearch/detr + iRPE-DETR (rpe-2.0-product-ctx-1-k: rpe_k [1, 32, 81])."""
    keys = torchvision_resnet50_keys("backbone.0.body.")
    keys.update({"input_proj.weight": (d, 2048, 1, 1), "input_proj.bias": (d,),
                 "query_embed.weight": (queries, d), "class_embed.weight": (classes + 1, d),
                 "class_embed.bias": (classes + 1,), "transformer.decoder.norm.weight": (d,),
                 "transformer.decoder.norm.bias": (d,)})
    for i in range(3):
        keys[f"bbox_embed.layers.{i}.weight"] = (4 if i == 2 else d, d)
        keys[f"bbox_embed.layers.{i}.bias"] = (4 if i == 2 else d,)

    def mha(p):
        keys.update({p + "in_proj_weight": (3 * d, d), p + "in_proj_bias": (3 * d,),
                     p + "out_proj.weight": (d, d), p + "out_proj.bias": (d,)})

    def ffn_norms(p, norms):
        keys.update({p + "linear1.weight": (ffn, d), p + "linear1.bias": (ffn,),
                     p + "linear2.weight": (d, ffn), p + "linear2.bias": (d,)})
        for n in range(1, norms + 1):
            keys.update({f"{p}norm{n}.weight": (d,), f"{p}norm{n}.bias": (d,)})

    for i in range(layers):
        p = f"transformer.encoder.layers.{i}."
        mha(p + "self_attn.")
        keys[p + "self_attn.rpe_k.lookup_table_weight"] = (1, 32, 81)
        ffn_norms(p, 2)
        p = f"transformer.decoder.layers.{i}."
        mha(p + "self_attn.")
        mha(p + "multihead_attn.")
        ffn_norms(p, 3)
    return keys


def test_detr_irpe_key_layout_matches_official():
    with torch.device("meta"):
        model = irpe.create_model("detr_resnet50_irpe")
    got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    expected = official_detr_irpe_keys()
    assert sorted(set(got) ^ set(expected)) == []
    assert got == expected
    plain = {k for k in irpe.create_model("detr_resnet50", num_queries=1).state_dict()}
    assert not any("rpe" in k for k in plain)


def test_strict_load_of_official_layout_with_torchvision_bn_extras(tmp_path):
    model = irpe.create_model("detr_tiny_irpe")
    state = {k: torch.randn_like(v) for k, v in model.state_dict().items()}
    state["backbone.0.body.bn1.num_batches_tracked"] = torch.tensor(7)  # torchvision extra
    path = tmp_path / "detr.pth"
    torch.save({"model": state}, path)
    loaded = irpe.create_model("detr_tiny_irpe", checkpoint=str(path))
    assert torch.equal(loaded.state_dict()["transformer.encoder.layers.1.self_attn.rpe_k."
                                           "lookup_table_weight"],
                       state["transformer.encoder.layers.1.self_attn.rpe_k.lookup_table_weight"])


def _tiny(**kw):
    return irpe.randomize_tables(irpe.create_model("detr_tiny_irpe", **kw).eval(), std=0.5)


@pytest.mark.parametrize("shapes", [[(96, 128), (64, 200), (37, 45)], [(70, 70), (33, 91)]])
def test_padded_batch_equals_each_image_alone(shapes):
    model = _tiny()
    images = [torch.randn(3, h, w) for h, w in shapes]
    batch, sizes = pad_images(images)
    with torch.inference_mode():
        out = model(batch, sizes)
        for i, image in enumerate(images):
            alone = model(image[None])
            torch.testing.assert_close(out["pred_logits"][i], alone["pred_logits"][0],
                                       atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(out["pred_boxes"][i], alone["pred_boxes"][0],
                                       atol=1e-5, rtol=1e-4)
            for a, b in zip(out["aux_outputs"], alone["aux_outputs"], strict=True):
                torch.testing.assert_close(a["pred_boxes"][i], b["pred_boxes"][0],
                                           atol=1e-5, rtol=1e-4)


def test_irpe_changes_the_encoder_output():
    model = _tiny()
    x = torch.randn(1, 3, 96, 96)
    with torch.inference_mode():
        with_rpe = model(x)["pred_logits"]
        for layer in model.transformer.encoder.layers:
            layer.self_attn.rpe_k.lookup_table_weight.zero_()
        without = model(x)["pred_logits"]
    assert (with_rpe - without).abs().max() > 1e-3


def test_postprocess_boxes_in_pixels():
    logits = torch.full((1, 2, 4), -10.0)
    logits[0, 0, 2] = 10.0  # query 0 -> class 2
    logits[0, 1, 3] = 10.0  # query 1 -> "no object" (last), best real class still reported
    boxes = torch.tensor([[[0.5, 0.5, 0.5, 0.5], [0.25, 0.25, 0.5, 0.5]]])
    res = PostProcess()({"pred_logits": logits, "pred_boxes": boxes}, torch.tensor([[100, 200]]))
    assert res[0]["labels"][0] == 2 and res[0]["scores"][0] > 0.99
    assert res[0]["scores"][1] < 0.01
    torch.testing.assert_close(res[0]["boxes"][0], torch.tensor([50.0, 25.0, 150.0, 75.0]))
    torch.testing.assert_close(res[0]["boxes"][1], torch.tensor([0.0, 0.0, 100.0, 50.0]))


def test_frozen_bn_and_conv_sizes():
    bn = FrozenBatchNorm2d(3)
    bn.running_mean.fill_(1.0)
    bn.running_var.fill_(4.0)
    x = torch.full((1, 3, 2, 2), 3.0)
    torch.testing.assert_close(bn(x), torch.full_like(x, 1.0), atol=1e-5, rtol=0)
    sizes = torch.tensor([[37, 45]])
    assert conv_out_size(sizes, 7, 2, 3).tolist() == [[19, 23]]
    assert conv_out_size(sizes, 1, 1, 0).tolist() == [[37, 45]]


def test_detr_errors():
    with pytest.raises(ValueError, match="skip must be 0"):
        irpe.create_model("detr_tiny_irpe",
                          rpe_config=irpe.get_rpe_config(ratio=2.0, skip=1))
    with pytest.raises(ValueError, match="ResNet depth"):
        irpe.create_model("detr_tiny_irpe", depth=42)
    with pytest.raises(ValueError, match="at least one image"):
        pad_images([])
    batch, sizes = pad_images([torch.zeros(3, 33, 40)], stride=32)
    assert batch.shape == (1, 3, 64, 64) and sizes.tolist() == [[33, 40]]


def test_detr_training_step_reaches_rpe_tables():
    model = irpe.create_model("detr_tiny_irpe").train()
    out = model(torch.randn(2, 3, 64, 96))
    loss = out["pred_logits"].logsumexp(-1).mean() + out["pred_boxes"].sum()
    loss.backward()
    grad = model.transformer.encoder.layers[0].self_attn.rpe_k.lookup_table_weight.grad
    assert grad is not None and grad.abs().sum() > 0


def test_no_sizes_equals_full_sizes():
    model = _tiny()
    x = torch.randn(2, 3, 50, 70)
    with torch.inference_mode():
        a = model(x)["pred_boxes"]
        b = model(x, torch.tensor([[50, 70], [50, 70]]))["pred_boxes"]
    torch.testing.assert_close(a, b)
