"""Attention rollout and the class token's view, against a direct computation: the attention of a
tiny timm ViT read by hooks on its own attention modules, softmax written out, the rollout
multiplied out layer by layer in NumPy; and the figures that draw them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnconv.analysis import analyze
from attnconv.analysis.measures import measure_patch_attention
from attnconv.analysis.rollout import TokenViews, attention_rollout, own_model_views
from attnconv.analysis.third_party import import_timm
from attnconv.models import create_model
from attnconv.viz.maps import FLOOR, compute_attention
from attnconv.viz.rollout import (
    ROLLOUT_LABEL,
    class_token_figure,
    colour_top,
    rollout_figure,
    rollout_rows,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_rollout_of_two_tokens_by_hand():
    """Â = 0.5·A + 0.5·I: [[.2, .8], [.6, .4]] -> [[.6, .4], [.3, .7]]; two layers: Â·Â."""
    layer = torch.tensor([[0.2, 0.8], [0.6, 0.4]])[None, None]  # (B=1, heads=1, 2, 2)
    once = attention_rollout([layer])
    twice = attention_rollout([layer, layer])
    torch.testing.assert_close(once[0], torch.tensor([[0.6, 0.4], [0.3, 0.7]], dtype=torch.float64))
    torch.testing.assert_close(
        twice[0], torch.tensor([[0.48, 0.52], [0.39, 0.61]], dtype=torch.float64)
    )


def test_heads_are_averaged_before_the_residual():
    one_hot = torch.tensor([[[1.0, 0.0], [1.0, 0.0]], [[0.0, 1.0], [0.0, 1.0]]])[None]
    # mean of the two heads: every row 0.5/0.5; with the residual: [[.75, .25], [.25, .75]]
    expected = torch.tensor([[0.75, 0.25], [0.25, 0.75]], dtype=torch.float64)
    torch.testing.assert_close(attention_rollout([one_hot])[0], expected)


def test_a_class_token_added_late_passes_the_earlier_layers_unchanged():
    """ConViT: layer 0 sees the 2 patches only, layer 1 the class token too."""
    first = torch.tensor([[0.9, 0.1], [0.3, 0.7]], dtype=torch.float64)[None, None]
    second = torch.tensor([[0.2, 0.3, 0.5], [0.1, 0.8, 0.1], [0.4, 0.4, 0.2]], dtype=torch.float64)[
        None, None
    ]
    rollout = attention_rollout([first, second], [0, 1])[0].numpy()
    padded = np.eye(3)
    padded[1:, 1:] = 0.5 * first[0, 0].numpy() + 0.5 * np.eye(2)
    step = 0.5 * second[0, 0].numpy() + 0.5 * np.eye(3)
    np.testing.assert_allclose(rollout, step @ padded, rtol=0, atol=1e-12)
    np.testing.assert_allclose(rollout[0], [0.6, 0.18, 0.22], rtol=0, atol=1e-12)  # by hand
    np.testing.assert_allclose(rollout.sum(axis=1), 1.0, rtol=0, atol=1e-12)


def tiny_vit(class_token: bool = True):
    """3 layers of 2 heads on 4x4 patches of 8x8 pixels, its attention computed unfused."""
    timm = import_timm()
    torch.manual_seed(21)
    model = timm.models.vision_transformer.VisionTransformer(
        img_size=32,
        patch_size=8,
        embed_dim=24,
        depth=3,
        num_heads=2,
        num_classes=5,
        class_token=class_token,
        global_pool="token" if class_token else "avg",
        reg_tokens=0 if class_token else 2,
    ).eval()
    for block in model.blocks:
        with torch.no_grad():  # sharper than the initialisation's near-uniform attention
            block.attn.qkv.weight.mul_(8)
    return model


def direct_attention(model, images) -> list[np.ndarray]:
    """Each block's attention (B, heads, T, T): its input read by a hook on the block's attention
    module, q and k formed from its qkv weights, softmax written out in float64."""
    inputs = []
    hooks = [
        block.attn.register_forward_pre_hook(lambda _m, args: inputs.append(args[0].double()))
        for block in model.blocks
    ]
    with torch.no_grad():
        model(images)
    for hook in hooks:
        hook.remove()
    probs = []
    for block, x in zip(model.blocks, inputs, strict=True):
        attn = block.attn
        batch, tokens, width = x.shape
        weight, bias = attn.qkv.weight.detach().double(), attn.qkv.bias.detach().double()
        qkv = x @ weight.T + bias
        qkv = qkv.reshape(batch, tokens, 3, attn.num_heads, width // attn.num_heads)
        q, k = qkv[:, :, 0].transpose(1, 2), qkv[:, :, 1].transpose(1, 2)
        scores = (q @ k.transpose(-1, -2) * attn.scale).numpy()
        exp = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs.append(exp / exp.sum(axis=-1, keepdims=True))
    return probs


def direct_rollout(probs: list[np.ndarray], image: int) -> np.ndarray:
    tokens = probs[0].shape[-1]
    rollout = np.eye(tokens)
    for layer in probs:
        step = 0.5 * layer[image].mean(axis=0) + 0.5 * np.eye(tokens)
        rollout = (step / step.sum(axis=1, keepdims=True)) @ rollout
    return rollout


def test_rollout_and_class_token_view_of_a_tiny_vit():
    model = tiny_vit()
    torch.manual_seed(22)
    images = torch.randn(3, 3, 32, 32)
    probs = direct_attention(model, images)
    views = measure_patch_attention(model, images, ["a", "b", "c"], keep=2).views
    expected = [direct_rollout(probs, image) for image in range(3)]
    assert views.prefix == 1 and views.count == 3 and len(views.rollout_images) == 2
    for image in range(2):
        np.testing.assert_allclose(views.rollout_images[image], expected[image], atol=2e-6)
    np.testing.assert_allclose(views.rollout, np.mean(expected, axis=0), atol=2e-6)
    # the rollout is not the product of the attention averaged over images
    averaged = direct_rollout([p.mean(axis=0, keepdims=True) for p in probs], 0)
    assert np.abs(averaged - np.mean(expected, axis=0)).max() > 1e-3
    # the class token's row at the 16 patch columns, per layer and head
    for layer, p in enumerate(probs):
        np.testing.assert_allclose(views.class_attention[layer], p[:, :, 0, 1:].mean(0), atol=2e-6)
        for image in range(2):
            np.testing.assert_allclose(
                views.class_attention_images[image][layer], p[image, :, 0, 1:], atol=2e-6
            )
    # the map drawn: the class token's row over the patches, renormalised
    drawn, share = rollout_rows(views.rollout_images[1], views.prefix, (4, 4))
    row = expected[1][0, 1:]
    assert share == pytest.approx(row.sum(), abs=2e-6)
    np.testing.assert_allclose(drawn.numpy(), (row / row.sum()).reshape(4, 4), atol=2e-6)


def test_a_vit_without_a_class_token_has_no_class_view():
    """Two register tokens but no class token: the rollout, read from a query patch."""
    model = tiny_vit(class_token=False)
    images = torch.randn(2, 3, 32, 32)
    probs = direct_attention(model, images)
    views = measure_patch_attention(model, images, ["a", "b"]).views
    assert views.class_attention is None and views.class_attention_images == []
    assert views.prefix == 2
    np.testing.assert_allclose(views.rollout_images[0], direct_rollout(probs, 0), atol=2e-6)
    drawn, _ = rollout_rows(views.rollout_images[0], 2, (4, 4), query=5)
    row = direct_rollout(probs, 0)[2 + 5, 2:]
    np.testing.assert_allclose(drawn.numpy(), (row / row.sum()).reshape(4, 4), atol=2e-6)


def test_attnconv_models_rollout_from_their_own_attention():
    model = create_model("vit-fashion").eval()
    torch.manual_seed(23)
    images = torch.rand(3, 1, 28, 28)
    views = own_model_views(model, (28, 28), images, keep=3)
    for image in range(3):
        own = compute_attention(model, (28, 28), images[image : image + 1]).probs
        expected = direct_rollout([p[None].double().numpy() for p in own], 0)
        np.testing.assert_allclose(views.rollout_images[image], expected, atol=2e-6)
    assert views.class_attention is None and views.prefix == 0
    # position-only: one rollout, no images needed
    quick = create_model("quick")
    views = own_model_views(quick, (12, 12), None)
    own = compute_attention(quick, (12, 12)).probs
    np.testing.assert_allclose(
        views.rollout, direct_rollout([p[None].double().numpy() for p in own], 0), atol=2e-6
    )


def test_figures_draw_the_maps_on_one_scale_with_a_floor():
    torch.manual_seed(24)
    maps = [torch.rand(4, 4) / 16, torch.rand(4, 4) / 16]
    images = [torch.rand(3, 32, 32), None]
    fig = rollout_figure(maps, images, ["one", "mean"], 8, "rollout")
    panels = [ax for ax in fig.axes if ax.get_title() in ("one", "mean")]
    assert [len(ax.images) for ax in panels] == [2, 1]  # the grey image under the first map
    for ax, values in zip(panels, maps, strict=True):
        np.testing.assert_array_equal(ax.images[-1].get_array(), values.numpy())
        assert ax.images[-1].get_extent() == [-0.5, 31.5, 31.5, -0.5]  # 8x8 pixels per patch
        assert ax.images[-1].get_clim() == (0.0, FLOOR / 16)  # all below 1/16 < 4/16
    # a rollout value is a share of a product of matrices' row, not one layer's probability
    (bar,) = [ax for ax in fig.axes if ax.get_ylabel() == ROLLOUT_LABEL]
    assert "probability" not in bar.get_ylabel()
    peaked = maps[0].clone()
    peaked[1, 2] = 0.9
    assert colour_top([peaked, maps[1]]) == pytest.approx(0.9)
    assert colour_top([peaked, maps[1]], query=(1, 2)) == FLOOR / 16  # the query left out


def test_class_token_figure_leaves_out_layers_without_it():
    per_layer = [None, torch.full((2, 4), 0.1), torch.tensor([[0.7, 0.1, 0.1, 0.1], [0.1] * 4])]
    fig = class_token_figure(per_layer, (2, 2), 1, None, "class token")
    labels = [ax.get_ylabel() for ax in fig.axes if ax.get_ylabel().startswith("layer")]
    assert labels == ["layer 1", "layer 2"]
    drawn = [ax for ax in fig.axes if ax.images]
    assert len(drawn) == 6  # 2 layers x (2 heads + their mean)
    np.testing.assert_allclose(
        drawn[5].images[0].get_array(),
        [[0.4, 0.1], [0.1, 0.1]],  # layer 2's mean of heads
    )
    assert drawn[0].images[0].get_clim() == (0.0, FLOOR / 4)  # 0.7 lies below 4/N = 1


def test_the_rollout_figure_s_title_writes_the_product_in_words(tmp_path, monkeypatch):
    """Matplotlib draws text as written: the title names the product in words and symbols that
    show as they are (no "Â_L", whose underscore would be printed)."""
    probs = [torch.softmax(torch.randn(1, 2, 4, 4), dim=-1) for _ in range(3)]
    rollout = attention_rollout(probs)[0]
    views = TokenViews(rollout, [rollout], None, [None], 0, 1)
    drawn = []
    monkeypatch.setattr(analyze, "save_figure", lambda fig, out, name: drawn.append(fig) or [])
    analyze.token_view_figures(views, (2, 2), 1, None, None, "tiny", None, tmp_path)
    (fig,) = drawn
    title = " ".join(fig.get_suptitle().split())
    assert "_" not in title
    assert "R: the product of every layer's Â, the last layer's leftmost" in title
