"""DeiT registry: official state_dict layout, strict loading, safe checkpoints, forward."""
import argparse
import os

import pytest
import torch

import irpe
from irpe import CheckpointError, create_model, list_models, model_info
from irpe.fused import set_fused_attention
from irpe.models.deit import VisionTransformer

ARCH = {"tiny": (192, 3), "small": (384, 6), "base": (768, 12)}
# Official iRPE zoo names and what they mean (rpe_models.py of microsoft/Cream):
# suffix -> (rpe_on, per-direction table names, buckets)
OFFICIAL_IRPE = {
    "deit_tiny_patch16_224_ctx_product_50_shared_k": ("k", [""], 50),
    "deit_small_patch16_224_ctx_product_50_shared_k": ("k", [""], 50),
    "deit_small_patch16_224_ctx_product_50_shared_qk": ("qk", [""], 50),
    "deit_small_patch16_224_ctx_product_50_shared_qkv": ("qkv", [""], 50),
    "deit_small_patch16_224_ctx_euc_20_shared_k": ("k", [""], 82),
    "deit_small_patch16_224_ctx_quant_51_shared_k": ("k", [""], 134),
    "deit_small_patch16_224_ctx_cross_56_shared_k": ("k", [".rp_rows", ".rp_cols"], 82),
    "deit_base_patch16_224_ctx_product_50_shared_k": ("k", [""], 50),
    "deit_base_patch16_224_ctx_product_50_shared_qkv": ("qkv", [""], 50),
}


def official_keys(name):
    """Expected {key: shape} written from the official DeiT / iRPE definitions."""
    arch = name.split("_")[1]
    dim, heads = ARCH[arch]
    distilled = "distilled" in name
    hd = dim // heads
    tokens = 196 + (2 if distilled else 1)
    keys = {"cls_token": (1, 1, dim), "pos_embed": (1, tokens, dim),
            "patch_embed.proj.weight": (dim, 3, 16, 16), "patch_embed.proj.bias": (dim,)}
    if distilled:
        keys["dist_token"] = (1, 1, dim)
    rpe = OFFICIAL_IRPE.get(name)
    for i in range(12):
        p = f"blocks.{i}."
        keys.update({p + "norm1.weight": (dim,), p + "norm1.bias": (dim,),
                     p + "attn.qkv.weight": (3 * dim, dim), p + "attn.qkv.bias": (3 * dim,),
                     p + "attn.proj.weight": (dim, dim), p + "attn.proj.bias": (dim,),
                     p + "norm2.weight": (dim,), p + "norm2.bias": (dim,),
                     p + "mlp.fc1.weight": (4 * dim, dim), p + "mlp.fc1.bias": (4 * dim,),
                     p + "mlp.fc2.weight": (dim, 4 * dim), p + "mlp.fc2.bias": (dim,)})
        if rpe:
            on, parts, nb = rpe
            for letter in on:
                for part in parts:
                    shape = (1, nb, hd) if letter == "v" else (1, hd, nb)
                    keys[f"{p}attn.rpe_{letter}{part}.lookup_table_weight"] = shape
    keys.update({"norm.weight": (dim,), "norm.bias": (dim,), "head.weight": (1000, dim),
                 "head.bias": (1000,)})
    if distilled:
        keys.update({"head_dist.weight": (1000, dim), "head_dist.bias": (1000,)})
    return keys


def test_registry_holds_every_official_name():
    names = set(list_models())
    assert set(OFFICIAL_IRPE) <= names
    for arch in ARCH:
        assert f"deit_{arch}_patch16_224" in names
        assert f"deit_{arch}_distilled_patch16_224" in names
    assert list_models("deit_base*_qkv") == ["deit_base_patch16_224_ctx_product_50_shared_qkv"]
    assert model_info("deit_small_patch16_224_ctx_product_50_shared_k").top1 == 80.9


@pytest.mark.parametrize("name", [n for n in list_models("deit*") if "shapes" not in n])
def test_state_dict_layout_matches_official(name):
    with torch.device("meta"):
        model = create_model(name)
    got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert got == official_keys(name)


def _official_checkpoint(name, path, wrap=True):
    """A synthetic checkpoint with exactly the official keys (random values)."""
    g = torch.Generator().manual_seed(1)
    state = {k: torch.randn(shape, generator=g) * 0.02 for k, shape in official_keys(name).items()}
    torch.save({"model": state} if wrap else state, path)
    return state


def test_strict_load_of_official_layout(tmp_path):
    name = "deit_tiny_patch16_224_ctx_product_50_shared_k"
    path = str(tmp_path / "ckpt.pth")
    state = _official_checkpoint(name, path)
    model = create_model(name, checkpoint=path).eval()
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k
    with torch.inference_mode():
        y = model(torch.randn(2, 3, 224, 224))
    assert y.shape == (2, 1000) and torch.isfinite(y).all()


def test_training_checkpoint_with_args_namespace_loads(tmp_path):
    name = "deit_tiny_patch16_224"
    path = str(tmp_path / "train.pth")
    state = {k: torch.zeros(s) for k, s in official_keys(name).items()}
    torch.save({"model": state, "epoch": 3, "args": argparse.Namespace(lr=5e-4)}, path)
    create_model(name, checkpoint=path)


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_checkpoint_with_code_is_refused(tmp_path):
    path = str(tmp_path / "evil.pth")
    torch.save({"model": {"x": torch.zeros(1)}, "payload": Evil()}, path)
    with pytest.raises(CheckpointError, match="refusing to load"):
        irpe.read_state_dict(path)


def test_checkpoint_errors_name_the_problem(tmp_path):
    name = "deit_tiny_patch16_224"
    with pytest.raises(CheckpointError, match="not found"):
        create_model(name, checkpoint=str(tmp_path / "missing.pth"))
    wrong = str(tmp_path / "wrong.pth")
    _official_checkpoint("deit_small_patch16_224", wrong)
    with pytest.raises(CheckpointError, match="shape mismatch"):
        create_model(name, checkpoint=wrong)
    rpe = str(tmp_path / "rpe.pth")
    _official_checkpoint("deit_tiny_patch16_224_ctx_product_50_shared_k", rpe, wrap=False)
    with pytest.raises(CheckpointError, match="unexpected.*rpe_k"):
        create_model(name, checkpoint=rpe)
    create_model(name, checkpoint=rpe, strict=False)
    garbage = tmp_path / "garbage.pth"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError):
        create_model(name, checkpoint=str(garbage))
    bad_st = tmp_path / "bad.safetensors"
    bad_st.write_bytes(b"\x00" * 16)
    with pytest.raises(CheckpointError, match="safetensors"):
        create_model(name, checkpoint=str(bad_st))


def test_safetensors_round_trip(tmp_path):
    name = "deit_tiny_patch16_224_ctx_product_50_shared_k"
    model = create_model(name).eval()
    path = str(tmp_path / "m.safetensors")
    irpe.save_checkpoint(model, path, metadata={"model": name})
    again = create_model(name, checkpoint=path).eval()
    x = torch.randn(1, 3, 224, 224)
    with torch.inference_mode():
        assert torch.equal(model(x), again(x))


def test_unknown_model_suggests_names():
    with pytest.raises(KeyError, match="did you mean"):
        create_model("deit_small_patch16_224_ctx_product_50_shared_kk")


def small_vit(**kw):
    cfg = irpe.get_rpe_config(ratio=1.9, method="product", skip=kw.pop("skip", 1), rpe_on="qkv",
                              shared_head=False)
    return VisionTransformer(img_size=64, patch_size=16, embed_dim=32, depth=2, num_heads=2,
                             num_classes=5, rpe_config=cfg, **kw)


def test_non_square_input_uses_true_grid():
    model = small_vit().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.1)
    seen = []
    hook = model.blocks[0].attn.rpe_k.register_forward_hook(
        lambda m, args, out: seen.append((args[0].shape[2], args[1], args[2])))
    x = torch.randn(2, 3, 48, 80)
    with torch.inference_mode():
        fast = model(x)  # CPU path (irpe.fused.cpu): the module's forward is not called
        set_fused_attention("off")
        try:
            y = model(x)
        finally:
            set_fused_attention(None)
    hook.remove()
    assert y.shape == (2, 5) and torch.isfinite(y).all()
    assert seen == [(1 + 3 * 5, 3, 5)]
    torch.testing.assert_close(fast, y)


def test_distilled_model_and_prefix_check():
    model = small_vit(distilled=True, skip=1)
    model.train()
    out = model(torch.randn(2, 3, 64, 64))
    assert isinstance(out, tuple) and out[0].shape == (2, 5)
    model.eval()
    with torch.inference_mode():
        assert model(torch.randn(2, 3, 64, 64)).shape == (2, 5)
    with pytest.raises(ValueError, match="prefix"):
        small_vit(skip=0)


def test_training_step_updates_rpe_tables():
    model = small_vit().train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 3, 64, 64), torch.tensor([0, 1, 2, 3])
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    grads = [p.grad for n, p in model.named_parameters() if "lookup_table" in n]
    assert len(grads) == 6 and all(g is not None and g.abs().sum() > 0 for g in grads)
    opt.step()
    assert "blocks.0.attn.rpe_k.lookup_table_weight" in model.no_weight_decay()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_forward_close_to_fp32(dtype):
    model = small_vit().eval()
    irpe.randomize_tables(model, std=0.1)
    x = torch.randn(2, 3, 64, 64)
    with torch.inference_mode():
        ref = model(x)
        low = model.to(dtype)(x.to(dtype))
    assert low.dtype == dtype
    torch.testing.assert_close(low.float(), ref, atol=0.05, rtol=0.05)


def test_conv_stem_matches_patch_grid_and_rejects_odd_patch():
    from irpe.models.layers import ConvStem, PatchEmbed
    x = torch.randn(2, 3, 64, 48)
    tokens, h, w = ConvStem(64, 8, 3, 96)(x)
    ref, rh, rw = PatchEmbed(64, 8, 3, 96)(x)
    assert (h, w) == (rh, rw) == (8, 6) and tokens.shape == ref.shape == (2, 48, 96)
    with pytest.raises(ValueError, match="power-of-two"):
        ConvStem(64, 6, 3, 96)
    with pytest.raises(ValueError, match="stem must be"):
        create_model("deit_shapes_irpe", stem="hybrid")
    model = create_model("deit_shapes_irpe").eval()
    assert model(torch.randn(1, 3, 64, 64)).shape == (1, 8)
    assert "patch_embed.stem.0.weight" in model.state_dict()


def test_default_input_size_follows_the_models_preprocessing():
    from irpe.flops import default_input_size, profile_model
    assert default_input_size("detr_shapes_irpe") == (128, 192)  # min 128, max 256
    assert default_input_size("detr_resnet50_irpe") == (800, 1216)  # DETR's 800 / 1333
    assert default_input_size("deit_shapes_irpe") == (64, 64)
    assert default_input_size("deit_small_patch16_224") == (224, 224)
    _, macs = profile_model("detr_shapes_irpe")
    assert 0.1e9 < macs < 0.5e9  # was 16.19G at 800x1216
