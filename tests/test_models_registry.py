"""ImageTransformer and ResNet: one test battery over every preset, plus references."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnconv.attention import PositionalScore
from attnconv.attention.transformed import TransformedConv2d
from attnconv.models import PRESETS, ImageTransformer, ResNet, create_model, resnet18
from attnconv.models.checkpoint import construct
from attnconv.models.normalize import ImageRangeWarning
from attnconv.models.vit import PositionEmbedding

NUM_CLASSES = 7

# Small versions of every preset for the battery (the full sizes are only counted, in
# test_models_presets.py). `quick` is small already.
SMALL = {
    "image_transformer": {"hidden": 32, "depth": 2, "mlp_dim": 48, "heads": 4},
    "resnet18": {"widths": (8, 16, 16, 32)},
    "vision_transformer": {"hidden": 32, "depth": 2, "mlp_dim": 48, "heads": 4, "head_dim": 8},
}


SMALL["transformed"] = {  # the base network small; its classes are set by create_model
    "base_arguments": {"in_channels": 1, "image_size": (28, 28), "mean": (0.3,), "std": (0.35,),
                       "widths": (8, 16, 16, 32)},
}  # fmt: skip


def small_model(name: str, **extra) -> nn.Module:
    overrides = {} if name == "quick" else dict(SMALL[PRESETS[name].model])
    model = create_model(name, num_classes=NUM_CLASSES, **overrides, **extra)
    if PRESETS[name].model == "transformed":
        # as after fine-tuning: open content gates (shut, as the transform leaves them, the
        # queries and keys get no gradient: their attention is weighted by the gate)
        with torch.no_grad():
            for layer in model.transformed_layers().values():
                if layer.gate is not None:
                    layer.gate.fill_(0.3)
    return model


def images_for(
    model: nn.Module, batch: int = 3, size: tuple[int, int] | None = None
) -> torch.Tensor:
    height, width = model.image_size if size is None else size
    return torch.rand(
        batch, model.in_channels, height, width, generator=torch.Generator().manual_seed(1)
    )


# A size other than the preset's default input, valid for its stem (and max_size).
OTHER_SIZE = {name: (16, 24) for name in PRESETS} | {"quick": (6, 10)}


@pytest.mark.parametrize("name", list(PRESETS))
class TestEveryPreset:
    def test_forward_shape_and_finite(self, name):
        torch.manual_seed(0)
        model = small_model(name)
        logits = model(images_for(model))
        assert logits.shape == (3, NUM_CLASSES)
        assert torch.isfinite(logits).all()

    def test_backward_reaches_every_parameter(self, name):
        torch.manual_seed(0)
        model = small_model(name).train()
        labels = torch.arange(3) % NUM_CLASSES
        F.cross_entropy(model(images_for(model)), labels).backward()
        missing = [
            n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0
        ]
        assert missing == []

    def test_eval_mode_is_deterministic(self, name):
        torch.manual_seed(0)
        model = small_model(name).eval()
        x = images_for(model)
        first = model(x)
        torch.manual_seed(123)
        assert torch.equal(first, model(x))
        # One image alone gives the same logits as inside the batch (no cross-image mixing).
        torch.testing.assert_close(model(x[1:2]), first[1:2], rtol=1e-4, atol=1e-5)

    @pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
    def test_an_empty_batch_gives_empty_logits(self, name, training):
        model = small_model(name).train(training)
        images = images_for(model, batch=0).requires_grad_()
        logits = model(images)
        assert logits.shape == (0, NUM_CLASSES) and logits.dtype == torch.float32
        logits.sum().backward()
        assert images.grad.shape == images.shape

    def test_non_default_image_size(self, name):
        torch.manual_seed(0)
        model = small_model(name).eval()
        size = OTHER_SIZE[name]
        assert size != model.image_size
        logits = model(images_for(model, batch=2, size=size))
        assert logits.shape == (2, NUM_CLASSES)
        assert torch.isfinite(logits).all()

    def test_state_dict_round_trip(self, name, tmp_path):
        torch.manual_seed(0)
        model = small_model(name).eval()
        path = tmp_path / "model.pt"
        torch.save(model.state_dict(), path)
        torch.manual_seed(99)
        fresh = small_model(name).eval()
        x = images_for(model)
        assert not torch.equal(fresh(x), model(x))  # different initialisation
        fresh.load_state_dict(torch.load(path, weights_only=True))
        assert torch.equal(fresh(x), model(x))
        # The normalisation constants travel with the weights.
        assert torch.equal(fresh.normalize.mean, model.normalize.mean)

    def test_no_weight_decay_parameters(self, name):
        model = small_model(name)
        names = [n for n, _ in model.named_parameters()]
        original = model.no_weight_decay_parameters("original")
        earlier = model.no_weight_decay_parameters("norms-biases-positional")
        assert model.no_weight_decay_parameters() == original
        for param_name in names:
            leaf = param_name.rsplit(".", 1)[-1]
            module = model.get_submodule(param_name.rsplit(".", 1)[0])
            # The paper's code: decay everything but the Gaussian centres and spreads (and a
            # transformed layer's content gates, which start at exactly zero).
            geometry = isinstance(module, PositionalScore) and leaf in ("centers", "spread")
            gate = isinstance(module, TransformedConv2d) and leaf == "gate"
            assert (param_name in original) == (geometry or gate), param_name
            exempt = gate or leaf == "bias" or isinstance(
                module, (nn.LayerNorm, nn.BatchNorm2d, PositionalScore, PositionEmbedding)
            )
            assert (param_name in earlier) == exempt, param_name
        with pytest.raises(ValueError, match="decay_exempt must be one of"):
            model.no_weight_decay_parameters("all")


# ---------------------------------------------------------------- ImageTransformer reference


def reference_forward(model: ImageTransformer, x: torch.Tensor) -> torch.Tensor:
    """The paper's model written out from docs/theory.md §4 with explicit loops over patches and
    heads, using only the model's weights and the layers' ``attention_probs``."""
    s = model.stem
    mean, std = model.normalize.mean, model.normalize.std
    x = (x - mean) / std
    b, c, height, width = x.shape
    h, w = height // s, width // s
    tokens = torch.empty(b, h, w, c * s * s)
    for i in range(h):
        for j in range(w):
            patch = x[:, :, i * s : (i + 1) * s, j * s : (j + 1) * s]  # (b, c, s, s)
            tokens[:, i, j] = patch.reshape(b, -1)  # channel-major, then row, then column
    z = F.linear(tokens, model.embed.weight, model.embed.bias).reshape(b, h * w, -1)
    for block in model.blocks:
        attn = block.attention
        probs = attn.attention_probs(h, w)  # (heads, N, N)
        d = attn.head_dim
        heads_out = []
        for head in range(attn.heads):
            values = (
                z
                if attn.value is None
                else F.linear(
                    z,
                    attn.value.weight[head * d : (head + 1) * d],
                    attn.value.bias[head * d : (head + 1) * d],
                )
            )
            heads_out.append(probs[head] @ values)
        attended = F.linear(torch.cat(heads_out, dim=-1), attn.out.weight, attn.out.bias)
        dense = F.linear(attended, block.attention_dense.weight, block.attention_dense.bias)
        z = F.layer_norm(
            z + dense, (z.shape[-1],), block.attention_norm.weight, block.attention_norm.bias, 1e-12
        )
        inner = F.gelu(F.linear(z, block.mlp_in.weight, block.mlp_in.bias))
        mlp = F.linear(inner, block.mlp_out.weight, block.mlp_out.bias)
        z = F.layer_norm(z + mlp, (z.shape[-1],), block.mlp_norm.weight, block.mlp_norm.bias, 1e-12)
    return F.linear(z.mean(dim=1), model.classifier.weight, model.classifier.bias)


@pytest.mark.parametrize(
    ("positional", "head_dim", "stem", "in_channels"),
    [
        ("gaussian", None, 2, 3),
        ("gaussian_full", 8, 2, 3),
        ("learned", 6, 1, 2),
        ("gaussian", 10, 3, 1),
    ],
)
def test_forward_matches_reference(positional, head_dim, stem, in_channels):
    torch.manual_seed(0)
    model = ImageTransformer(
        num_classes=5,
        in_channels=in_channels,
        image_size=(6 * stem, 4 * stem),
        mean=tuple(0.1 * (k + 1) for k in range(in_channels)),
        std=tuple(0.2 + 0.1 * k for k in range(in_channels)),
        stem=stem,
        hidden=12,
        depth=2,
        heads=[3, 2],
        head_dim=head_dim,
        mlp_dim=20,
        positional=positional,
        max_size=8,
    ).eval()
    with torch.no_grad():  # make biases and norms non-trivial
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.LayerNorm)) and module.bias is not None:
                module.bias.normal_(0, 0.3)
            if isinstance(module, nn.LayerNorm):
                module.weight.normal_(1, 0.3)
    x = torch.rand(2, in_channels, 6 * stem, 4 * stem)
    torch.testing.assert_close(model(x), reference_forward(model, x), rtol=1e-4, atol=1e-5)


def test_return_attention_gives_probabilities_per_layer():
    torch.manual_seed(0)
    model = ImageTransformer(
        hidden=16, depth=3, heads=[2, 3, 4], mlp_dim=16, image_size=(8, 12)
    ).eval()
    x = torch.rand(2, 3, 8, 12)
    logits, attentions = model(x, return_attention=True)
    torch.testing.assert_close(logits, model(x))
    assert [a.shape for a in attentions] == [(2, heads, 24, 24) for heads in (2, 3, 4)]
    for layer, probs in zip(model.attention_layers(), attentions, strict=True):
        torch.testing.assert_close(probs.sum(-1), torch.ones(probs.shape[:-1]))
        torch.testing.assert_close(probs[1], layer.attention_probs(4, 6))


def test_token_grid_and_heads_per_layer():
    model = ImageTransformer(hidden=8, depth=2, heads=[3, 1], mlp_dim=8, stem=4, image_size=(8, 8))
    assert model.token_grid(12, 20) == (3, 5)
    assert model.heads_per_layer() == [3, 1]
    assert [layer.heads for layer in model.attention_layers()] == [3, 1]


class Recorder:
    def __init__(self, module: nn.Module) -> None:
        self.calls = 0
        module.register_forward_pre_hook(self)

    def __call__(self, *args) -> None:
        self.calls += 1


@pytest.mark.parametrize(
    ("shape", "match"),
    [
        ((1, 3, 31, 32), "not divisible by the stem width 2"),
        ((1, 3, 32, 31), "not divisible by the stem width 2"),
        ((1, 1, 32, 32), r"\(B, 3, H, W\)"),
        ((3, 32, 32), r"\(B, 3, H, W\)"),
    ],
)
def test_bad_images_fail_before_any_computation(shape, match):
    model = ImageTransformer(hidden=8, depth=1, heads=2, mlp_dim=8)
    recorder = Recorder(model.normalize)
    with pytest.raises(ValueError, match=match):
        model(torch.rand(shape))
    assert recorder.calls == 0


def test_uint8_images_are_refused():
    model = ImageTransformer(hidden=8, depth=1, heads=2, mlp_dim=8)
    with pytest.raises(TypeError, match="float images"):
        model(torch.zeros(1, 3, 32, 32, dtype=torch.uint8))


def test_learned_grid_larger_than_max_size():
    with pytest.raises(ValueError, match="max_size=8"):
        ImageTransformer(
            hidden=8,
            depth=1,
            heads=2,
            mlp_dim=8,
            positional="learned",
            max_size=8,
            image_size=(34, 16),
        )
    model = ImageTransformer(
        hidden=8, depth=1, heads=2, mlp_dim=8, positional="learned", max_size=8, image_size=(16, 16)
    )
    recorder = Recorder(model.normalize)
    with pytest.raises(ValueError, match="max_size >= 9"):
        model(torch.rand(1, 3, 18, 16))
    assert recorder.calls == 0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"heads": [2, 2, 2]}, "one per layer"),
        ({"heads": 0}, "heads must be"),
        ({"stem": 0}, "stem must be a positive int"),
        ({"positional": "sinusoidal"}, "positional must be one of"),
        ({"in_channels": 1}, "one value per input channel"),
        ({"image_size": (32, 33)}, "not divisible"),
        ({"weight_init": "xavier"}, "weight_init must be one of"),
        ({"positional_init": "fan_in"}, "positional_init must be one of"),
        ({"position_term": False, "positional": "learned"}, "needs content_positional=True"),
    ],
)
def test_bad_constructor_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ImageTransformer(hidden=8, depth=2, mlp_dim=8, **kwargs)


def test_normalisation_is_inside_the_model():
    torch.manual_seed(0)
    mean, std = (0.2, 0.5, 0.7), (0.3, 0.25, 0.1)
    model = ImageTransformer(
        hidden=8, depth=1, heads=2, mlp_dim=8, mean=mean, std=std, image_size=(4, 4)
    ).eval()
    plain = ImageTransformer(
        hidden=8, depth=1, heads=2, mlp_dim=8, mean=(0, 0, 0), std=(1, 1, 1), image_size=(4, 4)
    ).eval()
    plain.load_state_dict(
        model.state_dict()
        | {"normalize.mean": plain.normalize.mean, "normalize.std": plain.normalize.std}
    )
    x = torch.rand(2, 3, 4, 4)
    normalised = (x - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None]
    with pytest.warns(ImageRangeWarning):  # images normalised twice: what the warning is for
        torch.testing.assert_close(model(x), plain(normalised))
    assert "normalize.mean" in model.state_dict()
    assert not any("normalize" in n for n, _ in model.named_parameters())


def _linears(model: nn.Module) -> list[nn.Linear]:
    return [module for module in model.modules() if isinstance(module, nn.Linear)]


@pytest.mark.parametrize(
    ("preset", "overrides"),
    [
        ("learned", {"depth": 1}),
        ("learned-content", {"depth": 1}),
        ("quadratic", {"depth": 1}),
        # the Fashion presets start from fan_in (their shipped start); the paper's, when asked
        ("learned-fashion", {"weight_init": "original"}),
    ],
)
def test_paper_presets_start_as_the_papers_code(preset, overrides):
    """PyTorch's defaults: every Linear weight and bias in U(±1/√fan_in) (std 1/√(3·fan_in)),
    learned tables N(0, 1) — never BERT's N(0, 0.02²) — unless weight_init="bert" is asked."""
    torch.manual_seed(0)
    model = create_model(preset, **overrides)
    assert model.weight_init == "original"
    for linear in _linears(model):
        bound = 1 / math.sqrt(linear.in_features)
        for tensor in (linear.weight, linear.bias):
            assert tensor.abs().max().item() <= bound
        if linear.weight.numel() >= 4000:
            assert linear.weight.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.05)
    for layer in model.attention_layers():
        if layer.positional == "learned":
            for table in (layer.position.row_embedding, layer.position.col_embedding):
                assert table.std().item() == pytest.approx(1.0, rel=0.1)
        else:
            assert layer.position.centers.std().item() == pytest.approx(2.0, rel=0.5)


def test_bert_and_fan_in_initialisations_are_named_options():
    torch.manual_seed(0)
    bert = create_model("learned", depth=1, weight_init="bert")
    out = bert.blocks[0].attention.out
    assert out.weight.std().item() == pytest.approx(0.02, rel=0.02)
    assert torch.count_nonzero(out.bias) == 0
    position = bert.blocks[0].attention.position
    assert position.row_embedding.std().item() == pytest.approx(0.02, rel=0.1)
    torch.manual_seed(0)
    lecun = ImageTransformer(hidden=64, depth=1, mlp_dim=256, weight_init="fan_in")
    assert lecun.blocks[0].mlp_out.weight.std().item() == pytest.approx(
        1 / math.sqrt(256), rel=0.05
    )
    assert torch.count_nonzero(lecun.blocks[0].mlp_out.bias) == 0


@pytest.mark.parametrize(
    ("weight_init", "positional_init", "table_std"),
    [
        ("fan_in", None, 0.02),
        ("fan_in", "original", 1.0),
        ("original", "bert", 0.02),
        ("bert", "original", 1.0),
    ],
)
def test_positional_init_draws_the_tables_apart_from_the_linears(
    weight_init, positional_init, table_std
):
    """positional_init picks the learned tables' start; weight_init keeps the Linear layers'."""
    torch.manual_seed(0)
    model = create_model(
        "learned-fashion", weight_init=weight_init, positional_init=positional_init
    )
    for layer in model.attention_layers():
        for table in (layer.position.row_embedding, layer.position.col_embedding):
            assert table.std().item() == pytest.approx(table_std, rel=0.1)
    mlp_in = model.blocks[0].mlp_in
    linear_std = {"fan_in": mlp_in.in_features**-0.5, "bert": 0.02}.get(
        weight_init, 1 / math.sqrt(3 * mlp_in.in_features)
    )
    assert mlp_in.weight.std().item() == pytest.approx(linear_std, rel=0.1)


def test_arguments_of_earlier_versions_still_build():
    """Checkpoints and shipped weights written before weight_init store init_std."""
    for init_std, expected in ((0.02, "bert"), (None, "fan_in")):
        model = construct(
            "image_transformer", {"hidden": 8, "depth": 1, "mlp_dim": 8, "init_std": init_std}, "f"
        )
        assert model.weight_init == expected


def test_transformer_parameter_count_matches_hand_formula():
    # docs/theory.md §4: embed, 6 × (MHSA out 9·400→400 + Gaussian geometry + dense + 2 norms + FFN),
    # classifier. No value projection since head_dim = hidden.
    hidden, heads, mlp, classes = 400, 9, 512, 10
    per_layer = (
        heads * hidden * hidden
        + hidden  # out
        + heads * 3  # centres (2) and spread (1) per head
        + hidden * hidden
        + hidden  # attention dense
        + 2 * 2 * hidden  # two LayerNorms
        + hidden * mlp
        + mlp
        + mlp * hidden
        + hidden  # feed-forward
    )
    expected = 12 * hidden + hidden + 6 * per_layer + hidden * classes + classes
    assert sum(p.numel() for p in ImageTransformer().parameters()) == expected


# ---------------------------------------------------------------- ResNet


def test_resnet18_is_the_cifar_variant():
    model = resnet18()
    assert model.conv1.kernel_size == (3, 3) and model.conv1.stride == (1, 1)
    assert not any(isinstance(m, nn.MaxPool2d) for m in model.modules())
    assert [len(stage) for stage in model.stages] == [2, 2, 2, 2]
    assert [stage[0].conv1.out_channels for stage in model.stages] == [64, 128, 256, 512]
    shapes = []
    for stage in model.stages:
        stage.register_forward_hook(lambda m, i, o: shapes.append(tuple(o.shape[1:])))
    model.eval()(torch.rand(1, 3, 32, 32))
    assert shapes == [(64, 32, 32), (128, 16, 16), (256, 8, 8), (512, 4, 4)]


def test_resnet18_parameter_count_matches_hand_formula():
    def conv_bn(cin, cout, k):
        return cin * cout * k * k + 2 * cout

    def block(cin, cout):
        shortcut = conv_bn(cin, cout, 1) if cin != cout else 0
        return conv_bn(cin, cout, 3) + conv_bn(cout, cout, 3) + shortcut

    widths = [64, 128, 256, 512]
    expected = conv_bn(3, 64, 3) + 512 * 10 + 10
    cin = 64
    for width in widths:
        expected += block(cin, width) + block(width, width)
        cin = width
    assert sum(p.numel() for p in resnet18().parameters()) == expected


def test_resnet_bad_input():
    model = ResNet(widths=(4, 4, 4, 4), in_channels=1, mean=(0.5,), std=(0.5,))
    recorder = Recorder(model.normalize)
    with pytest.raises(ValueError, match=r"\(B, 1, H, W\)"):
        model(torch.rand(2, 3, 8, 8))
    assert recorder.calls == 0
    with pytest.raises(ValueError, match="same nonzero length"):
        ResNet(blocks=(2, 2), widths=(8, 8, 8))
    with pytest.raises(ValueError, match="positive"):
        ResNet(std=(0.2, 0.0, 0.2))
