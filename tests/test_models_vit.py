"""The plain ViT (models/vit.py) against a reference written out from its definition, and the
vit-fashion preset."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnconv.models import PRESETS, create_model
from attnconv.models.presets import FASHION_EPOCHS
from attnconv.models.vit import VisionTransformer
from attnconv.train.config import resolve_config


def reference_forward(
    model: VisionTransformer, x: torch.Tensor
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The ViT written out with explicit loops over patches and heads from the model's weights,
    in float64: logits and each layer's ``(B, heads, N, N)`` probabilities."""
    p = model.patch_size
    x = ((x - model.normalize.mean) / model.normalize.std).double()
    b, c, height, width = x.shape
    h, w = height // p, width // p
    tokens = torch.empty(b, h * w, c * p * p, dtype=torch.float64)
    for i in range(h):
        for j in range(w):
            # channel-major, then row, then column within the patch
            tokens[:, i * w + j] = x[:, :, i * p : (i + 1) * p, j * p : (j + 1) * p].reshape(b, -1)

    def linear(z, layer):
        return z @ layer.weight.double().T + layer.bias.double()

    def norm(z, layer):
        return F.layer_norm(z, (z.shape[-1],), layer.weight.double(), layer.bias.double(), 1e-6)

    z = linear(tokens, model.embed) + model.position.weight.double().reshape(h * w, -1)
    attentions = []
    for block in model.blocks:
        attn = block.attention
        d = attn.head_dim
        normed = norm(z, block.attention_norm)
        q, k, v = (linear(normed, getattr(attn, name)) for name in ("query", "key", "value"))
        heads_out, probs = [], []
        for head in range(attn.heads):
            part = slice(head * d, (head + 1) * d)
            scores = q[..., part] @ k[..., part].transpose(1, 2) / math.sqrt(d)  # (B, N, N)
            weights = torch.softmax(scores, dim=-1)
            probs.append(weights)
            heads_out.append(weights @ v[..., part])
        attentions.append(torch.stack(probs, dim=1))
        z = z + linear(torch.cat(heads_out, dim=-1), attn.out)
        inner = F.gelu(linear(norm(z, block.mlp_norm), block.mlp_in))
        z = z + linear(inner, block.mlp_out)
    logits = linear(norm(z, model.norm).mean(dim=1), model.classifier)
    return logits, attentions


def small_vit(**overrides) -> VisionTransformer:
    arguments = {
        "num_classes": 5,
        "in_channels": 2,
        "image_size": (6, 8),
        "mean": (0.2, 0.4),
        "std": (0.3, 0.5),
        "patch_size": 2,
        "hidden": 12,
        "depth": 2,
        "heads": 3,
        "head_dim": 5,
        "mlp_dim": 20,
    }
    torch.manual_seed(0)
    model = VisionTransformer(**{**arguments, **overrides}).eval()
    with torch.no_grad():  # make biases and norms non-trivial
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.LayerNorm)):
                module.bias.normal_(0, 0.3)
            if isinstance(module, nn.LayerNorm):
                module.weight.normal_(1, 0.3)
    return model


def test_forward_and_attention_match_the_reference():
    model = small_vit()
    x = torch.rand(2, 2, 6, 8, generator=torch.Generator().manual_seed(1))
    logits, attentions = model(x, return_attention=True)
    expected_logits, expected_attentions = reference_forward(model, x)
    torch.testing.assert_close(logits.double(), expected_logits, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(model(x), logits)  # with and without the probabilities
    assert [a.shape for a in attentions] == [(2, 3, 12, 12)] * 2
    for probs, expected in zip(attentions, expected_attentions, strict=True):
        torch.testing.assert_close(probs.double(), expected, rtol=1e-4, atol=1e-6)


def test_position_embedding_is_resized_for_another_grid():
    model = small_vit()
    table = model.position.weight.detach()  # (3, 4, hidden)
    tokens = torch.zeros(1, 6, 8, table.shape[-1])
    resized = model.position(tokens)[0]
    # bicubic resizing of each channel, as F.interpolate does it on the (hidden, h, w) image
    expected = F.interpolate(table.permute(2, 0, 1)[None], size=(6, 8), mode="bicubic")
    torch.testing.assert_close(resized, expected[0].permute(1, 2, 0))
    assert torch.equal(model.position(torch.zeros(1, 3, 4, table.shape[-1]))[0], table)
    assert model(torch.rand(1, 2, 12, 16)).shape == (1, 5)


def test_patch_size_must_divide_the_image():
    model = small_vit()
    with pytest.raises(ValueError, match="not divisible by the patch size 2"):
        model(torch.rand(1, 2, 7, 8))
    with pytest.raises(ValueError, match=r"\(B, 2, H, W\)"):
        model(torch.rand(1, 3, 6, 8))
    with pytest.raises(ValueError, match="heads must be a positive int"):
        small_vit(heads=0)


def test_vit_fashion_preset_matches_the_fashion_transformers():
    preset = PRESETS["vit-fashion"]
    attention = PRESETS["learned-fashion"].model_kwargs
    kwargs = preset.model_kwargs
    for key in ("hidden", "depth", "heads", "mlp_dim", "in_channels", "image_size"):
        assert kwargs[key] == attention[key], key
    # Trained as ViTs are: AdamW, no decay on norms, biases and the position embedding.
    config = resolve_config("vit-fashion")
    assert (config.optimizer, config.decay_exempt) == ("adamw", "norms-biases-positional")
    assert config.epochs == FASHION_EPOCHS and config.batch_size == 100
    exempt = create_model("vit-fashion").no_weight_decay_parameters(config.decay_exempt)
    assert "position.weight" in exempt and "blocks.0.mlp_in.weight" not in exempt
    assert preset.dataset == "fashion-mnist"
    model = create_model("vit-fashion")
    assert isinstance(model, VisionTransformer)
    assert model.token_grid(28, 28) == (14, 14) and model.stem == 2
    assert model.position.weight.shape == (14, 14, 64)
    logits, attentions = model(torch.rand(2, 1, 28, 28), return_attention=True)
    assert logits.shape == (2, 10)
    assert [a.shape for a in attentions] == [(2, 9, 196, 196)] * 4
