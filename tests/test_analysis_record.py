"""record_attention on timm and torchvision vision transformers with random weights: the recorded
probabilities against an independent float64 recomputation from each model's weights, the model's
output unchanged and no hook left behind."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attnconv.analysis import FAMILIES, record_attention
from attnconv.analysis.third_party import import_timm, import_torchvision
from attnconv.errors import UserError
from attnconv.models import create_model

pytestmark = pytest.mark.usefixtures("one_thread")

timm = import_timm()
torchvision = import_torchvision()

SIZE = 48  # 3x3 patches of 16 pixels: small and quick, with a centre patch and borders
TOLERANCE = {"rtol": 0, "atol": 1e-5}


def images(batch: int = 2, size: int = SIZE) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(3))


def double_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    out = x.double() @ weight.double().T
    return out if bias is None else out + bias.double()


def split_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, T, heads·d) -> (B, heads, T, d)"""
    batch, tokens, width = t.shape
    return t.view(batch, tokens, heads, width // heads).transpose(1, 2)


def content_probs(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)


def no_hooks_left(model: nn.Module) -> bool:
    return not any(module._forward_hooks or module._forward_pre_hooks for module in model.modules())


# ---------------------------------------------------------------- timm VisionTransformer


def timm_vit_reference(model, x: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Each block's probabilities from its qkv weights (float64), the blocks run one at a time,
    and the logits that chain gives."""
    tokens = model.norm_pre(model.patch_drop(model._pos_embed(model.patch_embed(x))))
    probs = []
    for block in model.blocks:
        attention = block.attn
        qkv = double_linear(block.norm1(tokens), attention.qkv.weight, attention.qkv.bias)
        q, k, _ = (split_heads(t, attention.num_heads) for t in qkv.chunk(3, dim=-1))
        probs.append(content_probs(q, k))
        tokens = block(tokens)
    return probs, model.forward_head(model.norm(tokens))


@pytest.mark.parametrize(
    ("name", "kwargs", "prefix"),
    [
        ("vit_tiny_patch16_224", {}, 1),
        ("vit_tiny_patch16_224", {"class_token": False, "global_pool": "avg"}, 0),
        ("vit_tiny_patch16_224", {"reg_tokens": 4}, 5),
        ("deit_tiny_distilled_patch16_224", {}, 2),
    ],
    ids=["class-token", "no-class-token", "registers", "deit-distilled"],
)
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_timm_vit_attention_equals_recomputation(name, kwargs, prefix, fused):
    torch.manual_seed(0)
    model = timm.create_model(name, img_size=SIZE, **kwargs).eval()
    for block in model.blocks:
        block.attn.fused_attn = fused
    x = images()
    with torch.no_grad():
        expected_probs, expected_logits = timm_vit_reference(model, x)
        plain = model(x)
    torch.testing.assert_close(expected_logits, plain, rtol=1e-4, atol=1e-5)  # the chain is right
    recording = record_attention(model, x)
    assert torch.equal(recording.output, plain)
    assert no_hooks_left(model)
    assert recording.family == "timm-vit" and recording.grid == (3, 3)
    assert recording.patch_size == 16 and recording.prefix_tokens == [prefix] * 12
    assert [p.shape for p in recording.probs] == [(2, 3, 9 + prefix, 9 + prefix)] * 12
    for got, expected in zip(recording.probs, expected_probs, strict=True):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.double(), expected, **TOLERANCE)


# ---------------------------------------------------------------- timm ConVit


def relative_features(h: int, w: int) -> torch.Tensor:
    """(N, N, 3): column offset, row offset and squared distance of key k from query q."""
    rows = torch.arange(h, dtype=torch.float64).repeat_interleave(w)
    cols = torch.arange(w, dtype=torch.float64).repeat(h)
    d_row = rows[None, :] - rows[:, None]
    d_col = cols[None, :] - cols[:, None]
    return torch.stack([d_col, d_row, d_col**2 + d_row**2], dim=-1)


def convit_reference(model, x: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    """GPSA: (1 − σ(λ))·softmax(qᵀk/√d) + σ(λ)·softmax(v_posᵀ r_δ), renormalised, from the
    weights; MHSA after the class token joins; the logits of that chain."""
    tokens = model.pos_drop(model.patch_embed(x) + model.pos_embed)
    grid = model.patch_embed.grid_size
    probs = []
    for index, block in enumerate(model.blocks):
        if index == model.local_up_to_layer:
            tokens = torch.cat([model.cls_token.expand(x.shape[0], -1, -1), tokens], dim=1)
        attention = block.attn
        heads = attention.num_heads
        normed = block.norm1(tokens)
        if block.use_gpsa:
            qk = double_linear(normed, attention.qk.weight, attention.qk.bias)
            q, k = (split_heads(t, heads) for t in qk.chunk(2, dim=-1))
            position = double_linear(
                relative_features(*grid), attention.pos_proj.weight, attention.pos_proj.bias
            ).permute(2, 0, 1)  # (heads, N, N)
            gate = torch.sigmoid(attention.gating_param.double()).view(-1, 1, 1)
            mixed = (1 - gate) * content_probs(q, k) + gate * torch.softmax(position, dim=-1)
            probs.append(mixed / mixed.sum(dim=-1, keepdim=True))
        else:
            qkv = double_linear(normed, attention.qkv.weight, attention.qkv.bias)
            q, k, _ = (split_heads(t, heads) for t in qkv.chunk(3, dim=-1))
            probs.append(content_probs(q, k))
        tokens = block(tokens)
    return probs, model.forward_head(model.norm(tokens))


def test_convit_gated_attention_equals_recomputation():
    torch.manual_seed(0)
    model = timm.create_model("convit_tiny", img_size=SIZE).eval()
    with torch.no_grad():  # gates away from their initial value, one per head
        for block in model.blocks:
            if block.use_gpsa:
                block.attn.gating_param.copy_(torch.tensor([-2.0, -0.5, 0.5, 2.0]))
    x = images()
    with torch.no_grad():
        expected_probs, expected_logits = convit_reference(model, x)
        plain = model(x)
    torch.testing.assert_close(expected_logits, plain, rtol=1e-4, atol=1e-5)
    recording = record_attention(model, x)
    assert torch.equal(recording.output, plain) and no_hooks_left(model)
    assert recording.family == "timm-convit" and recording.grid == (3, 3)
    assert recording.prefix_tokens == [0] * 10 + [1] * 2  # the class token joins at layer 10
    for got, expected in zip(recording.probs, expected_probs, strict=True):
        torch.testing.assert_close(got.double(), expected, **TOLERANCE)


# ---------------------------------------------------------------- torchvision VisionTransformer


def torchvision_reference(model, x: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    tokens = model._process_input(x)
    tokens = torch.cat([model.class_token.expand(x.shape[0], -1, -1), tokens], dim=1)
    tokens = model.encoder.dropout(tokens + model.encoder.pos_embedding)
    probs = []
    for block in model.encoder.layers:
        attention = block.self_attention
        qkv = double_linear(block.ln_1(tokens), attention.in_proj_weight, attention.in_proj_bias)
        q, k, _ = (split_heads(t, attention.num_heads) for t in qkv.chunk(3, dim=-1))
        probs.append(content_probs(q, k))
        tokens = block(tokens)
    return probs, model.heads(model.encoder.ln(tokens)[:, 0])


def test_torchvision_vit_attention_equals_recomputation():
    torch.manual_seed(0)
    model = torchvision.models.vit_b_16(image_size=SIZE).eval()
    with torch.no_grad():  # torchvision starts the classifier at zero: give the logits some life
        model.heads.head.weight.normal_(0, 0.02)
    x = images()
    with torch.no_grad():
        expected_probs, expected_logits = torchvision_reference(model, x)
        plain = model(x)
    torch.testing.assert_close(expected_logits, plain, rtol=1e-4, atol=1e-5)
    recording = record_attention(model, x)
    assert torch.equal(recording.output, plain) and no_hooks_left(model)
    assert recording.family == "torchvision-vit" and recording.grid == (3, 3)
    assert recording.prefix_tokens == [1] * 12
    assert [p.shape for p in recording.probs] == [(2, 12, 10, 10)] * 12
    for got, expected in zip(recording.probs, expected_probs, strict=True):
        torch.testing.assert_close(got.double(), expected, **TOLERANCE)


# ---------------------------------------------------------------- modes, hooks and errors


def test_recording_runs_in_eval_mode_and_restores_the_modes():
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", img_size=SIZE, attn_drop_rate=0.5)
    model.train()
    model.blocks[0].eval()  # a part frozen in eval mode stays so
    x = images()
    first = record_attention(model, x)
    second = record_attention(model, x)
    for a, b in zip(first.probs, second.probs, strict=True):  # no dropout while recording
        assert torch.equal(a, b)
    assert model.training and not model.blocks[0].training and model.blocks[1].training
    assert no_hooks_left(model)


def test_hooks_are_removed_after_a_failing_forward():
    model = timm.create_model("vit_tiny_patch16_224", img_size=SIZE).eval()
    with pytest.raises(RuntimeError):  # 2 channels for a 3-channel patch embedding
        record_attention(model, torch.randn(1, 2, SIZE, SIZE))
    assert no_hooks_left(model)


def test_unknown_models_name_the_known_families():
    with pytest.raises(UserError) as info:
        record_attention(nn.Sequential(nn.Conv2d(3, 4, 3)), images())
    message = str(info.value)
    assert "\n" not in message
    assert "torch.nn.modules.container.Sequential" in message
    for family in FAMILIES.values():
        assert family in message
    with pytest.raises(
        UserError, match=r"attnconv's own models: attnconv\.viz\.maps\.compute_attention"
    ):
        record_attention(create_model("quick"), torch.rand(1, 1, 8, 8))
    with pytest.raises(UserError, match="known families are"):  # a timm model of another kind
        record_attention(timm.create_model("resnet18"), images())


def test_images_must_be_whole_patches():
    model = timm.create_model("vit_tiny_patch16_224", img_size=SIZE, dynamic_img_size=True)
    with pytest.raises(UserError, match="not a whole number of 16x16 patches"):
        record_attention(model, torch.randn(1, 3, 40, 48))
    with pytest.raises(UserError, match=r"float tensor \(B, C, H, W\)"):
        record_attention(model, torch.zeros(1, 3, SIZE, SIZE, dtype=torch.uint8))
