"""Presets, recipes, create_model, parameter and multiply-add counts, `attnconv models`."""

from __future__ import annotations

import json
import re

import pytest
import torch
import torch.nn.functional as F

import attnconv
from attnconv import cli
from attnconv.models import (
    PRESETS,
    ImageTransformer,
    ResNet,
    count_macs,
    count_parameters,
    create_model,
)
from attnconv.models.costs import COUNTED, fingerprint, preset_cost
from attnconv.models.presets import ANYWHERE_OF, preset_arguments, size_note
from attnconv.models.pretrained import pretrained_models
from attnconv.train.config import resolve_config

PAPER_PRESETS = [
    "quadratic",
    "quadratic-generalized",
    "quadratic-generalized-pruned",
    "many-heads",
    "learned",
    "learned-content",
    "resnet18",
]
FASHION_PRESETS = [
    "quadratic-fashion",
    "learned-fashion",
    "learned-content-fashion",
    "resnet-fashion",
    "resnet-fashion-small",
]


ANYWHERE_PRESETS = [
    "quadratic-anywhere", "learned-anywhere", "learned-content-anywhere", "vit-anywhere",
    "resnet-anywhere-small",
]  # fmt: skip
TRANSFORM_PRESETS = [
    "tcnn-fashion-small", "tcnn-full-fashion-small", "resnet-fashion-small-continued"
]  # fmt: skip


def test_every_preset_is_registered():
    assert list(PRESETS) == [
        *PAPER_PRESETS, "quick", *FASHION_PRESETS, *TRANSFORM_PRESETS, "vit-fashion",
        *ANYWHERE_PRESETS,
    ]  # fmt: skip
    assert attnconv.PRESETS is PRESETS and attnconv.create_model is create_model
    for name, preset in PRESETS.items():
        assert preset.name == name and preset.description


# Table 1 of the paper (millions of parameters, CIFAR-10).
PAPER_PARAMETERS = {"quadratic": 12.1, "learned": 12.3, "learned-content": 29.5, "resnet18": 11.2}


@pytest.mark.parametrize(("name", "millions"), PAPER_PARAMETERS.items())
def test_parameter_counts_match_the_paper(name, millions):
    count = count_parameters(create_model(name))
    assert abs(count / 1e6 - millions) / millions < 0.02, count


def test_architectures_of_the_paper_presets():
    quadratic = create_model("quadratic")
    assert isinstance(quadratic, ImageTransformer) and isinstance(create_model("resnet18"), ResNet)
    assert quadratic.stem == 2 and quadratic.image_size == (32, 32) and quadratic.in_channels == 3
    layer = quadratic.attention_layers()[0]
    assert (len(quadratic.blocks), layer.heads, layer.head_dim, layer.dim, layer.value) == (
        6,
        9,
        400,
        400,
        None,
    )
    assert quadratic.blocks[0].mlp_in.out_features == 512
    assert layer.dropout == 0.1 and quadratic.blocks[0].dropout.p == 0.1
    assert quadratic.blocks[0].attention_norm.eps == 1e-12
    expected = {
        "quadratic": ("gaussian", False, False, 9),
        "quadratic-generalized": ("gaussian_full", False, False, 9),
        "quadratic-generalized-pruned": ("gaussian_full", False, False, 9),
        "many-heads": ("gaussian", False, False, 16),
        "learned": ("learned", False, False, 9),
        # The paper's code as stored: w·r + q·k/√d (docs/theory.md §1, "Content models").
        "learned-content": ("learned", True, False, 9),
    }
    for name, (positional, content, content_positional, heads) in expected.items():
        layer = create_model(name).attention_layers()[-1]
        assert (layer.positional, layer.content, layer.content_positional, layer.heads) == (
            positional,
            content,
            content_positional,
            heads,
        ), name
        assert layer.position_term, name
    for name in ("learned", "learned-content"):  # the 16×16 token grid of CIFAR fits
        assert create_model(name).attention_layers()[0].max_size >= 16
    normalize = quadratic.normalize
    torch.testing.assert_close(normalize.mean.flatten(), torch.tensor([0.4914, 0.4822, 0.4465]))
    torch.testing.assert_close(normalize.std.flatten(), torch.tensor([0.2023, 0.1994, 0.2010]))


def test_recipes():
    """The paper presets train with TrainConfig's defaults (the paper's recipe); the others say
    how they depart from it."""
    for name in ("quadratic", "quadratic-generalized", "many-heads", "learned", "learned-content"):
        assert PRESETS[name].recipe == {} and PRESETS[name].dataset == "cifar10", name
    assert PRESETS["resnet18"].recipe == {
        "schedule": "step",
        "warmup_fraction": 0.0,
        "milestones": (80, 150, 250),
    }
    pruned = PRESETS["quadratic-generalized-pruned"]
    assert pruned.requires_init and pruned.recipe == {"lr": 0.01, "epochs": 100}
    # the transformed CNN and its control fine-tune the same CNN with one recipe
    tcnn, _, control = (PRESETS[name] for name in TRANSFORM_PRESETS)
    assert tcnn.recipe == control.recipe and tcnn.recipe["lr"] < 0.1
    assert tcnn.requires_init and control.requires_init
    assert control.init_presets[0] == "resnet-fashion-small"
    assert control.model_kwargs == PRESETS["resnet-fashion-small"].model_kwargs
    assert tcnn.model_kwargs["base_arguments"] == control.model_kwargs
    quick = PRESETS["quick"]
    assert quick.dataset == "digits" and quick.recipe["epochs"] <= 30
    assert quick.recipe["batch_size"] <= 128


def test_fashion_presets_scale_the_paper_models_down_alike():
    """The Fashion-MNIST presets: the paper's architectures at one common reduced width and depth
    (the 2×2 stem, so 28×28 images give a 14×14 token grid), the paper's recipe."""
    transformers = {
        name: PRESETS[name] for name in FASHION_PRESETS if PRESETS[name].model != "resnet18"
    }
    for name, preset in transformers.items():
        kwargs = preset.model_kwargs
        assert (kwargs["stem"], kwargs["hidden"], kwargs["depth"], kwargs["heads"]) == (2, 64, 4, 9)
        assert (kwargs["in_channels"], kwargs["image_size"], kwargs["max_size"]) == (
            1,
            (28, 28),
            14,
        )
        assert preset.dataset == "fashion-mnist" and "batch_size" not in preset.recipe
        assert preset.recipe["lr"] == 0.03 and "schedule" not in preset.recipe, name
        assert kwargs["dropout"] == kwargs["attention_dropout"] == 0.0
        model = create_model(name)
        assert model.token_grid(28, 28) == (14, 14)
        assert model(torch.rand(2, 1, 28, 28)).shape == (2, 10)
    assert transformers["quadratic-fashion"].model_kwargs["positional"] == "gaussian"
    learned = transformers["learned-fashion"].model_kwargs
    assert learned["positional"] == "learned" and not learned.get("content", False)
    content = transformers["learned-content-fashion"].model_kwargs
    assert content["content"] and not content.get("content_positional", False)
    assert content["head_dim"] == 16
    resnet = PRESETS["resnet-fashion"]
    assert resnet.model == "resnet18" and resnet.recipe["schedule"] == "step"
    assert create_model("resnet-fashion")(torch.rand(2, 1, 28, 28)).shape == (2, 10)
    # The CNN baseline is the attention models' size (within 20%), as the paper compared them.
    sizes = {name: count_parameters(create_model(name)) for name in FASHION_PRESETS}
    for name in transformers:
        assert 0.8 < sizes["resnet-fashion-small"] / sizes[name] < 1.2, sizes


def test_fashion_presets_train_the_equal_budget_and_start_as_their_shipped_weights():
    """Every Fashion and anywhere model trains FASHION_EPOCHS (the equal-budget table's column)
    by default, so ``attnconv train --preset NAME`` trains a table row without overrides; each
    builds what its shipped weights were built from (index.json's arguments: the fan_in start),
    and a shipped entry's run is either at that budget or at the short column's
    (FASHION_SHORT_EPOCHS, the same for its anywhere model)."""
    from attnconv.models.presets import FASHION_EPOCHS, FASHION_SHORT_EPOCHS

    shipped = pretrained_models()
    for name in [*FASHION_PRESETS, "vit-fashion", *ANYWHERE_PRESETS]:
        assert resolve_config(name).epochs == FASHION_EPOCHS, name
        if name not in shipped:
            continue
        architecture, arguments = preset_arguments(name)
        assert architecture == shipped[name].architecture

        def shape(arguments):  # what the run built, but the statistics (measured, then rounded)
            return {k: v for k, v in json.loads(json.dumps(arguments)).items()
                    if k not in ("mean", "std")}  # fmt: skip

        assert shape(arguments) == shape(shipped[name].arguments), name
        fashion = {v: k for k, v in ANYWHERE_OF.items()}.get(name, name)
        budgets = {FASHION_EPOCHS, FASHION_SHORT_EPOCHS.get(fashion, FASHION_EPOCHS)}
        assert shipped[name].run["epochs"] in budgets, (name, shipped[name].run["epochs"])
    assert set(FASHION_SHORT_EPOCHS) <= set(FASHION_PRESETS)


def test_anywhere_presets_are_the_shipped_fashion_models_on_the_16x16_grid():
    """Each ``*-anywhere`` preset builds what its Fashion preset's shipped weights were built
    from (index.json: arguments of the shipped run), but for 32×32 images, their statistics and,
    for learned tables, the 16×16 token grid; it trains with the Fashion preset's recipe."""
    shipped = pretrained_models()
    changed = {"image_size": [32, 32], "mean": [0.1135], "std": [0.2521]}
    for fashion, name in ANYWHERE_OF.items():
        preset = PRESETS[name]
        assert name in ANYWHERE_PRESETS and preset.dataset == "fashion-mnist-anywhere"
        assert preset.recipe == PRESETS[fashion].recipe and preset.model == PRESETS[fashion].model
        architecture, arguments = preset_arguments(name)
        assert architecture == shipped[fashion].architecture
        expected = {**shipped[fashion].arguments, **changed}
        if "max_size" in expected:
            expected["max_size"] = 16
        assert json.loads(json.dumps(arguments)) == expected, name
        model = create_model(name)
        if hasattr(model, "token_grid"):
            assert model.token_grid(32, 32) == (16, 16)
        assert model(torch.rand(2, 1, 32, 32)).shape == (2, 10)
    sizes = {name: count_parameters(create_model(name)) for name in ANYWHERE_PRESETS}
    for name in ANYWHERE_PRESETS:
        assert 0.8 < sizes["resnet-anywhere-small"] / sizes[name] < 1.2, sizes


def test_create_model_overrides():
    model = create_model(
        "quadratic",
        num_classes=100,
        hidden=24,
        depth=2,
        heads=[3, 5],
        mlp_dim=8,
        in_channels=1,
        mean=(0.5,),
        std=(0.25,),
        image_size=(28, 28),
    )
    assert model.classifier.out_features == 100 and model.heads_per_layer() == [3, 5]
    assert model(torch.rand(2, 1, 28, 28)).shape == (2, 100)
    # The preset itself is unchanged by overrides.
    assert PRESETS["quadratic"].model_kwargs == {"positional": "gaussian"}


def test_unknown_preset_lists_valid_ones():
    with pytest.raises(ValueError, match="unknown preset 'vit'") as info:
        create_model("vit")
    for name in PRESETS:
        assert name in str(info.value)


def test_unknown_override_lists_valid_keys():
    with pytest.raises(ValueError, match="'hiden'") as info:
        create_model("quick", hiden=3)
    for key in ("hidden", "heads", "stem", "image_size", "mean", "std", "in_channels"):
        assert key in str(info.value)
    with pytest.raises(ValueError, match=r"'hidden'.*valid keys:.*widths"):
        create_model("resnet18", hidden=3)


def test_image_size_the_model_cannot_take():
    with pytest.raises(ValueError, match="not divisible by the stem width 2"):
        create_model("quadratic", image_size=(28, 27))
    with pytest.raises(ValueError, match="max_size"):
        create_model("learned", image_size=(96, 96))


# ---------------------------------------------------------------- multiply-adds


def linear_macs(tokens, fan_in, fan_out):
    return tokens * fan_in * fan_out


def transformer_macs(
    *, h, w, channels, stem, hidden, heads, head_dim, mlp, depth, classes, attention
):
    n = h * w
    # The output projection and the dense map after it, as two maps or folded into one (its
    # weight and bias computed once per forward), whichever takes fewer.
    out_then_dense = min(
        linear_macs(n, heads * head_dim, hidden) + linear_macs(n, hidden, hidden),
        hidden * hidden * (heads * head_dim + 1) + linear_macs(n, heads * head_dim, hidden),
    )
    per_layer = (
        attention(n, h, w, heads, head_dim)
        + (linear_macs(n, hidden, heads * head_dim) if head_dim != hidden else 0)  # value
        + out_then_dense
        + linear_macs(n, hidden, mlp)
        + linear_macs(n, mlp, hidden)  # feed-forward
    )
    return linear_macs(n, channels * stem * stem, hidden) + depth * per_layer + hidden * classes


@pytest.mark.parametrize(
    ("overrides", "attention"),
    [
        # separable Gaussian: rows (H×H) then columns (W×W) per head and channel
        ({"positional": "gaussian"}, lambda n, h, w, heads, d: heads * n * (h + w) * d),
        # generalized Gaussian: one N×N matrix per head, and the precision S·Sᵀ (2×2) per head
        ({"positional": "gaussian_full"}, lambda n, h, w, heads, d: heads * n * n * d + heads * 8),
        # content attention: QKᵀ and PV, plus the query and key projections (hidden 12 → heads·d)
        (
            {"positional": None, "content": True},
            lambda n, h, w, heads, d: 2 * heads * n * n * d + 2 * linear_macs(n, 12, heads * d),
        ),
    ],
)
@pytest.mark.parametrize("head_dim", [None, 5])
def test_count_macs_matches_hand_computation(overrides, attention, head_dim):
    model = ImageTransformer(
        num_classes=4,
        image_size=(12, 8),
        hidden=12,
        depth=2,
        heads=3,
        head_dim=head_dim,
        mlp_dim=7,
        **overrides,
    )
    expected = transformer_macs(
        h=6,
        w=4,
        channels=3,
        stem=2,
        hidden=12,
        heads=3,
        head_dim=head_dim or 12,
        mlp=7,
        depth=2,
        classes=4,
        attention=attention,
    )
    assert count_macs(model) == expected
    assert model.training  # the mode is restored


def test_count_macs_resnet_hand_computation():
    model = ResNet(num_classes=3, widths=(4, 8, 8, 8), blocks=(1, 1, 1, 1), image_size=(8, 8))
    conv = lambda cin, cout, k, size: cin * cout * k * k * size * size  # noqa: E731
    expected = (
        conv(3, 4, 3, 8)
        + 2 * conv(4, 4, 3, 8)  # stage 1 at 8×8
        + conv(4, 8, 3, 4)
        + conv(8, 8, 3, 4)
        + conv(4, 8, 1, 4)  # stage 2 at 4×4 with projection
        + 2 * conv(8, 8, 3, 2)
        + conv(8, 8, 1, 2)  # stage 3 at 2×2, projection (stride 2)
        + 2 * conv(8, 8, 3, 1)
        + conv(8, 8, 1, 1)  # stage 4 at 1×1, projection (stride 2)
        + 8 * 3
    )
    assert count_macs(model) == expected
    assert count_macs(model, image_size=(16, 16)) > expected


def executed_macs(model: torch.nn.Module) -> int:
    """Multiply-adds of a real eval-mode forward on one random image (real tensors, real
    arithmetic): what count_macs counts without running it."""
    from torch.utils.flop_counter import FlopCounterMode

    images = torch.rand(1, model.in_channels, *model.image_size)
    with torch.no_grad(), FlopCounterMode(display=False) as count:
        model.eval()(images)
    return count.get_total_flops() // 2


@pytest.mark.parametrize(
    ("preset", "overrides"),
    [
        ("quick", {}),
        ("resnet-fashion", {}),
        ("learned-content-fashion", {}),
        ("quadratic-generalized", {"hidden": 12, "depth": 2, "image_size": (16, 12)}),
        ("learned-content", {"hidden": 12, "depth": 2, "head_dim": 4, "image_size": (8, 8)}),
    ],
)
def test_count_macs_on_the_meta_device_equals_the_executed_count(preset, overrides):
    torch.manual_seed(0)
    model = create_model(preset, **overrides)
    executed = executed_macs(model)
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    assert count_macs(model.train()) == executed
    assert model.training and next(model.parameters()).device.type == "cpu"
    for name, tensor in model.state_dict().items():  # the model is neither moved nor changed
        assert torch.equal(tensor, before[name]), name
    with torch.device("meta"):  # how `attnconv models` builds them: shapes only
        shapes = create_model(preset, **overrides)
    assert count_macs(shapes) == count_macs(model)
    assert count_parameters(shapes) == count_parameters(model)


def test_models_command_prints_every_preset(capsys):
    assert cli.main(["models"]) == 0
    out = capsys.readouterr().out
    units = {"k": 1e3, "M": 1e6, "G": 1e9}
    rows = {}
    for line in out.splitlines():
        match = re.match(
            r"(\S+)\s+([\d.]+)([kMG])\s+([\d.]+)([kMG])\s+(\d+)x(\d+)x(\d+)\s+(shipped|-)\s+(.+)",
            line,
        )
        if match:
            rows[match[1]] = (
                float(match[2]) * units[match[3]],
                float(match[4]) * units[match[5]],
                tuple(int(match[k]) for k in (6, 7, 8)),
                match[10],
                match[9],
            )
    assert list(rows) == list(PRESETS)
    for name, millions in PAPER_PARAMETERS.items():
        assert rows[name][0] / 1e6 == pytest.approx(millions, rel=0.02)
    # quadratic: 6 layers × (separable attention 9·256·32·400 + out 256·3600·400 + dense + FFN) + stem + head
    quadratic = transformer_macs(
        h=16,
        w=16,
        channels=3,
        stem=2,
        hidden=400,
        heads=9,
        head_dim=400,
        mlp=512,
        depth=6,
        classes=10,
        attention=lambda n, h, w, heads, d: heads * n * (h + w) * d,
    )
    assert rows["quadratic"][1] == pytest.approx(quadratic, rel=0.005)
    for name in PAPER_PRESETS:
        assert rows[name][2] == (32, 32, 3)
        assert rows[name][3] == PRESETS[name].description
    assert rows["quick"][2] == (8, 8, 1)
    for name in FASHION_PRESETS:
        assert rows[name][2] == (28, 28, 1)
    shipped = [name for name, row in rows.items() if row[4] == "shipped"]
    assert shipped == [
        "quadratic-fashion",
        "learned-fashion",
        "learned-content-fashion",
        "resnet-fashion",
        "resnet-fashion-small",
        "tcnn-fashion-small",
        "vit-fashion",
        "quadratic-anywhere",
        "learned-anywhere",
        "learned-content-anywhere",
    ]


@pytest.mark.parametrize("name", PRESETS)
def test_the_counted_costs_are_the_meta_device_counts(name):
    architecture, arguments = preset_arguments(name)
    with torch.device("meta"):
        model = create_model(name)
    entry = (fingerprint(architecture, arguments), count_parameters(model), count_macs(model))
    assert COUNTED[name] == entry, f"replace COUNTED[{name!r}] in attnconv/models/costs.py by {entry}"
    cost = preset_cost(name)
    assert (cost.parameters, cost.macs) == entry[1:]
    assert cost.input_size == (*model.image_size, model.in_channels)


def test_another_class_count_is_counted_on_the_meta_device():
    with torch.device("meta"):
        model = create_model("resnet-fashion", num_classes=100)
    cost = preset_cost("resnet-fashion", 100)
    assert (cost.parameters, cost.macs) == (count_parameters(model), count_macs(model))
    # the classifier's 128 features to 90 more classes: weights and biases, multiply-adds
    assert cost.parameters - COUNTED["resnet-fashion"][1] == 129 * 90
    assert cost.macs - COUNTED["resnet-fashion"][2] == 128 * 90


def models_rows(capsys, *argv) -> dict[str, str]:
    assert cli.main(["models", *argv]) == 0
    lines = capsys.readouterr().out.splitlines()[2:]
    return {line.split()[0]: line.split()[4] for line in lines if line and line[0] != " "
            and not line.startswith("MACs:")}


def test_models_filters_by_pattern_and_shipped_weights(capsys):
    assert models_rows(capsys, "*content*") == {
        "learned-content": "-", "learned-content-fashion": "shipped",
        "learned-content-anywhere": "shipped",
    }
    assert list(models_rows(capsys, "quadratic*")) == [
        "quadratic", "quadratic-generalized", "quadratic-generalized-pruned", "quadratic-fashion",
        "quadratic-anywhere",
    ]
    assert list(models_rows(capsys, "small", "--pretrained")) == ["resnet-fashion-small", "tcnn-fashion-small"]
    assert list(models_rows(capsys, "vit-fashion")) == ["vit-fashion"]
    assert cli.main(["models", "quadratic", "--pretrained"]) == 0  # quadratic-fashion ships
    capsys.readouterr()
    assert cli.main(["models", "many", "--pretrained"]) == 2
    assert capsys.readouterr().err.startswith(
        "attnconv models: error: no preset with shipped weights matches 'many'; presets: quadratic, "
    )


# ---------------------------------------------------------------- the quick preset learns


@pytest.mark.slow
def test_quick_preset_learns_digits_on_cpu():
    """A short run of the quick model (recipe lr/batch, 6 epochs, no augmentation) on the
    embedded 8×8 digits reaches a held-out accuracy far above chance (10%)."""
    from sklearn.datasets import load_digits

    torch.manual_seed(0)
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32)[:, None] / 16.0
    labels = torch.tensor(digits.target)
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(0))
    train, test = order[:1400], order[1400:]
    recipe = resolve_config("quick")
    model = create_model("quick")
    optimizer = torch.optim.SGD(model.parameters(), lr=recipe.lr, momentum=recipe.momentum)
    epochs = 6
    steps = epochs * (len(train) // recipe.batch_size)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, recipe.lr, total_steps=steps, pct_start=0.05, anneal_strategy="cos"
    )
    for _ in range(epochs):
        shuffled = train[torch.randperm(len(train))]
        for start in range(0, len(train) - recipe.batch_size + 1, recipe.batch_size):
            batch = shuffled[start : start + recipe.batch_size]
            loss = F.cross_entropy(model(images[batch]), labels[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    model.eval()
    with torch.no_grad():
        accuracy = (model(images[test]).argmax(1) == labels[test]).float().mean().item()
    assert accuracy > 0.8


def test_size_note_warns_when_a_preset_meets_much_larger_images():
    note = size_note("quick", "fashion-mnist", (28, 28))
    assert note is not None
    assert "sized for 64 tokens per layer" in note and "give it 784 (12x)" in note
    assert "presets sized for fashion-mnist: quadratic-fashion, learned-fashion" in note
    assert size_note("quick", "fashion-mnist", (28, 28), {"stem": 4}) is None  # 49 tokens
    assert size_note("quick", "digits", (8, 8)) is None
    assert size_note("quadratic", "fashion-mnist", (28, 28)) is None  # 196 of its 256 tokens
    assert size_note("resnet18", "fashion-mnist", (280, 280)) is None  # no attention
    assert "(9x)" in size_note("quadratic", "cifar10", (96, 96))


@pytest.mark.parametrize("count", ["0", "99999999999999999", str(2**31)])
def test_models_command_refuses_a_class_count_it_cannot_build_in_one_line(capsys, count):
    assert cli.main(["models", "--num-classes", count]) == 2
    assert capsys.readouterr().err == (
        f"attnconv models: error: argument --num-classes: expected an integer in [1, 2**31 - 1], "
        f"got '{count}' (see attnconv models --help)\n"
    )
