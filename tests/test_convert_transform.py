"""attnconv.transform / transform_checkpoint / choose_spread: the transformed network starts as the
CNN (blurred by the spread), forward and in the gradients w.r.t. the kernels; it saves, loads and
trains as a model of its own."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import attnconv
from attnconv.attention.transformed import TransformedConv2d
from attnconv.convert import (
    CONTENT_START,
    FIRST_FORM,
    ConversionError,
    calibrate_content,
    choose_opening,
    choose_spread,
    select_layers,
    transform,
    transform_checkpoint,
    untransformed_layers,
)
from attnconv.models import create_model
from attnconv.models.checkpoint import build_model, load_model, save_checkpoint
from attnconv.models.presets import TCNN_FASHION_LAYERS, preset_arguments
from attnconv.models.transformed import TransformedNetwork

F64 = torch.float64
SMALL = {"widths": (4, 8, 8, 16), "image_size": (16, 16), "in_channels": 1, "mean": (0.5,),
         "std": (0.25,)}  # fmt: skip

SHUT = {key: FIRST_FORM[key] for key in ("gate", "opening", "qk_init")}  # transform()'s part


def small_cnn(seed: int = 0) -> tuple[nn.Module, dict]:
    torch.manual_seed(seed)
    arch, arguments = preset_arguments("resnet-fashion-small", **SMALL)
    model = create_model("resnet-fashion-small", **SMALL).double()
    with torch.no_grad():  # trained-looking batch norms: not the identity
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.uniform_(-0.2, 0.2)
                module.running_var.uniform_(0.5, 2.0)
    checkpoint = {"preset": "resnet-fashion-small", "dataset": "fashion-mnist",
                  "architecture": arch, "arguments": arguments, "model": model.state_dict()}  # fmt: skip
    return model.eval(), checkpoint


def test_late_selects_the_spatial_convolutions_of_the_two_smallest_grids():
    model, _ = small_cnn()
    assert select_layers(model) == list(TCNN_FASHION_LAYERS)  # 4×4 and 2×2 grids: stages 2, 3
    assert select_layers(model, ["stages.3.1.*", "conv1"]) == [
        "conv1", "stages.3.1.conv1", "stages.3.1.conv2"
    ]  # fmt: skip
    with pytest.raises(ValueError, match=r"matches no nn\.Conv2d"):
        select_layers(model, ["nowhere.*"])


class BlurredConv(nn.Module):
    """``conv`` with its kernel blurred by a normalised discrete Gaussian of inverse std
    ``spread`` (truncated at ``radius`` pixels), a differentiable function of ``conv.weight``."""

    def __init__(self, conv: nn.Conv2d, spread: float, radius: int = 10) -> None:
        super().__init__()
        self.conv, self.radius = conv, radius
        taps = torch.arange(-radius, radius + 1, dtype=conv.weight.dtype)
        bump = torch.exp(-0.5 * spread**2 * taps**2)
        self.bump = (bump / bump.sum())[:, None] * (bump / bump.sum())[None, :]

    def forward(self, x):
        conv, r = self.conv, self.radius
        out, per_group, kh, kw = conv.weight.shape
        flat = nn.functional.pad(conv.weight.reshape(-1, 1, kh, kw), (2 * r,) * 4)
        kernel = nn.functional.conv2d(flat, self.bump[None, None]).reshape(out, per_group, *(
            kh + 2 * r, kw + 2 * r))  # fmt: skip
        padding = tuple(p + r for p in conv.padding)
        return nn.functional.conv2d(x, kernel, conv.bias, conv.stride, padding, 1, conv.groups)


@pytest.mark.parametrize("spread", [2.0, 3.0])
def test_step_zero_is_the_cnn_with_blurred_kernels_forward_and_kernel_gradients(spread):
    """The transformed network at step 0 computes the CNN's function with the chosen spread: the
    CNN whose transformed kernels are blurred by the heads' Gaussian, forward and in the gradient
    of every kernel (transformed or not)."""
    cnn, _ = small_cnn()
    model = transform(cnn, spread=spread, **SHUT).eval()  # gates shut: exact
    assert not any(isinstance(m, TransformedConv2d) for m in cnn.modules())  # a copy
    reference = small_cnn()[0]
    for name in TCNN_FASHION_LAYERS:
        *path, leaf = name.split(".")
        parent = reference.get_submodule(".".join(path))
        setattr(parent, leaf, BlurredConv(getattr(parent, leaf), spread))
    x = torch.rand(3, 1, 16, 16, dtype=F64)
    out, ref = model(x), reference(x)
    assert (out - ref).abs().max() <= 1e-12 * ref.abs().max()
    assert (out - cnn(x)).abs().max() > 1e-4  # blurred: not the CNN's exact function
    weights = torch.randn_like(ref)
    names = [name for name, m in cnn.named_modules() if isinstance(m, nn.Conv2d)]
    ours = torch.autograd.grad(
        (out * weights).sum(), [model.get_submodule(n).weight for n in names]
    )
    theirs = torch.autograd.grad(
        (ref * weights).sum(),
        [getattr(reference.get_submodule(n), "conv", reference.get_submodule(n)).weight
         for n in names],
    )  # fmt: skip
    for a, b in zip(ours, theirs, strict=True):
        assert (a - b).abs().max() <= 1e-10 * b.abs().max()


def test_a_large_spread_is_the_cnn_itself():
    cnn, _ = small_cnn()
    model = transform(cnn, spread=12.0, **SHUT).eval()
    x = torch.rand(3, 1, 16, 16, dtype=F64)
    with torch.no_grad():
        assert (model(x) - cnn(x)).abs().max() <= 1e-12 * cnn(x).abs().max()


def test_positional_parameters_and_gates_get_gradients_and_train():
    _, checkpoint = small_cnn()
    model = build_model(transform_checkpoint(checkpoint, spread=3.0)).train()  # float32
    x, y = torch.rand(8, 1, 16, 16), torch.randint(0, 10, (8,))
    nn.functional.cross_entropy(model(x), y).backward()
    layers = model.transformed_layers()
    assert list(layers) == list(TCNN_FASHION_LAYERS)
    for name, layer in layers.items():
        for param in (layer.position.centers, layer.position.spread, layer.gate, layer.weight):
            assert param.grad is not None and param.grad.abs().sum() > 0, name
    exempt = model.no_weight_decay_parameters("original")
    assert "network.stages.3.1.conv2.gate" in exempt
    assert "network.stages.3.1.conv2.position.centers" in exempt
    assert "network.stages.3.1.conv2.weight" not in exempt


def test_checkpoint_round_trip_is_bit_identical_and_keeps_attention_keys(tmp_path):
    _, checkpoint = small_cnn()
    transformed = transform_checkpoint(checkpoint, spread=3.0, preset="tcnn-fashion-small")
    model = build_model(transformed)
    with torch.no_grad():  # move away from the start so that every key matters
        for layer in model.transformed_layers().values():
            layer.gate.uniform_(0.0, 0.5)
            layer.position.centers.add_(0.1)
            layer.position.spread.mul_(0.9)
    keys = set(model.state_dict())
    for suffix in ("position.centers", "position.spread", "gate", "query.weight", "key.weight"):
        assert f"network.stages.2.0.conv1.{suffix}" in keys
    path = tmp_path / "t.pt"
    save_checkpoint({**transformed, "model": model.state_dict()}, path)
    loaded, saved = load_model(path)
    assert saved["architecture"] == "transformed" and saved["preset"] == "tcnn-fashion-small"
    x = torch.rand(4, 1, 16, 16)
    with torch.no_grad():
        assert torch.equal(loaded(x), model.eval()(x))


def test_transform_checkpoint_on_the_preset_is_the_preset_architecture():
    _, arguments = preset_arguments("tcnn-fashion-small")
    model = create_model("tcnn-fashion-small")
    assert isinstance(model, TransformedNetwork)
    assert model.layer_names == list(TCNN_FASHION_LAYERS) == list(arguments["layers"])
    assert arguments["base_arguments"]["widths"] == (9, 18, 36, 72)


def test_refuses_what_the_construction_does_not_cover():
    class Shifted(nn.Conv2d):
        def forward(self, x):
            return super().forward(x) + 1

    model = nn.Sequential(Shifted(2, 2, 3, padding=1), nn.Conv2d(2, 2, 3, padding=1))
    with pytest.raises(ConversionError, match="cannot transform 0: Shifted overrides forward") as err:
        transform(model, ["0"])
    assert "pass rules=" not in str(err.value)  # transform takes no rules: it says what to do
    assert "leave it out with a layer pattern" in str(err.value)
    hooked = nn.Sequential(nn.Conv2d(2, 2, 3, padding=1))
    hooked[0].register_forward_hook(lambda *_: None)
    with pytest.raises(ConversionError, match="forward hooks"):
        transform(hooked, ["0"])
    with pytest.raises(ValueError, match="give an example input"):
        transform(nn.Sequential(nn.Conv2d(2, 2, 3)))
    assert isinstance(transform(nn.Sequential(nn.Conv2d(2, 2, 3)), example=torch.zeros(1, 2, 5, 5))[0],
                      TransformedConv2d)  # fmt: skip


def test_refuses_a_convolution_tied_to_another_module_or_held_outside_the_tree():
    torch.manual_seed(0)
    tied = nn.Sequential(nn.Conv2d(2, 2, 3, padding=1), nn.Conv2d(2, 2, 3, padding=1))
    tied[1].weight = nn.Parameter(tied[0].weight.data)  # one storage, two parameters
    with pytest.raises(ConversionError, match="cannot transform 1: its weight shares its storage"):
        transform(tied, ["1"])

    class Held(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(2, 2, 3, padding=1)
            self.ops = [self.conv]  # forward runs the list's convolution

        def forward(self, x):
            return self.ops[0](x)

    with pytest.raises(
        ConversionError, match=r"cannot transform conv: also held outside .*ops\[0\]"
    ):
        transform(Held(), ["conv"])


@pytest.mark.filterwarnings("ignore:.*weight_norm.*:FutureWarning")
def test_the_copy_keeps_what_the_layers_left_alone_share_and_hook():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(2, 2, 3, padding=1), nn.Conv2d(2, 2, 1), nn.Conv2d(2, 2, 1), nn.Conv2d(2, 2, 3)
    )
    model[2].weight = nn.Parameter(model[1].weight.data)  # tied 1x1 layers, not transformed
    model[1].bias.register_hook(torch.zeros_like)  # a hook that zeroes the bias's gradient
    nn.utils.weight_norm(model[3])  # old-style: deepcopy alone refuses its weight
    transformed = transform(model, ["0"], spread=8.0, content=False)
    assert isinstance(transformed[0], TransformedConv2d)
    assert transformed[2].weight.untyped_storage().data_ptr() == (
        transformed[1].weight.untyped_storage().data_ptr()
    )
    assert transformed[1].weight.data_ptr() != model[1].weight.data_ptr()  # a copy, still tied
    transformed(torch.randn(3, 2, 6, 6)).square().sum().backward()
    assert transformed[1].bias.grad.abs().max() == 0
    assert transformed[2].bias.grad.abs().max() > 0
    with torch.no_grad():
        transformed[1].weight.add_(1.0)
    assert torch.equal(transformed[1].weight, transformed[2].weight)
    assert not torch.equal(transformed[1].weight, model[1].weight)  # the original untouched


def test_choose_spread_takes_the_smallest_that_keeps_the_accuracy():
    curve = {1.0: 50.0, 2.0: 90.0, 3.0: 92.95, 4.0: 93.0, 5.0: 93.1}
    tried = []

    def accuracy(spread):
        tried.append(spread)
        return curve[spread]

    spread, measured = choose_spread(accuracy, 93.0, 0.1, candidates=[5.0, 1.0, 3.0, 2.0, 4.0])
    assert spread == 3.0 and tried == [1.0, 2.0, 3.0] and measured == {1: 50, 2: 90, 3: 92.95}
    with pytest.raises(ValueError, match=r"spread 2: 90\.00%"):
        choose_spread(accuracy, 93.0, 0.1, candidates=[1.0, 2.0])


def test_public_name():
    assert attnconv.transform is transform


def test_attention_lr_scale_multiplies_only_the_parameters_the_transform_added():
    from attnconv.train.config import TrainConfig
    from attnconv.train.loop import Trainer

    _, checkpoint = small_cnn()
    model = build_model(transform_checkpoint(checkpoint, spread=3.0, **FIRST_FORM))
    trainer = Trainer.__new__(Trainer)  # only the optimizer's set-up is exercised
    trainer.model = model
    names = {id(p): n for n, p in model.named_parameters()}
    added = set(model.transform_parameters())
    assert "network.stages.3.1.conv2.gate" in added
    assert "network.stages.3.1.conv2.weight" not in added  # the CNN's own kernel
    for scale in (1.0, 10.0):
        trainer.config = TrainConfig(
            "tcnn-fashion-small", "fashion-mnist", attention_lr_scale=scale
        )
        optimizer = trainer._build_optimizer()
        groups = optimizer.param_groups
        assert len(groups) == (2 if scale == 1.0 else 4)
        assert sum(len(g["params"]) for g in groups) == len(names)
        for group in (g for g in groups if g["params"]):
            inside = {names[id(p)] in added for p in group["params"]}
            assert inside == {group["lr_scale"] != 1.0} or scale == 1.0
            if scale != 1.0:
                assert group["lr_scale"] == (scale if inside == {True} else 1.0)


def test_a_convolution_used_in_two_places_is_one_transformed_layer_at_both():
    """``Sequential(c, ReLU(), c)``: both calls become the same transformed layer (the tie
    holds: 148 kernel parameters once, not a second plain copy), and the network is the blurred
    convolution applied twice."""
    torch.manual_seed(0)
    conv = nn.Conv2d(4, 4, 3, padding=1).double()
    model = nn.Sequential(conv, nn.ReLU(), conv)
    transformed = transform(model, "spatial", spread=3.0, content=False)
    assert transformed[0] is transformed[2] and isinstance(transformed[0], TransformedConv2d)
    added = 9 * 3  # centres (9, 2) and spreads (9,)
    assert sum(p.numel() for p in transformed.parameters()) == 148 + added
    x = torch.randn(2, 4, 6, 6, dtype=F64)
    layer = transformed[0]
    with torch.no_grad():
        assert torch.equal(transformed(x), layer(torch.relu(layer(x))))
    assert untransformed_layers(transformed) == []


def test_untransformed_layers_says_which_convolutions_were_left_and_why():
    cnn, _ = small_cnn()
    model = transform(cnn, spread=3.0)
    left = {entry.name: entry.reason for entry in untransformed_layers(model)}
    transformed = set(model_layers := [n for n, m in model.named_modules()
                                       if isinstance(m, TransformedConv2d)])  # fmt: skip
    assert set(model_layers) == set(TCNN_FASHION_LAYERS) and not transformed & set(left)
    assert left["conv1"] == "not selected"
    assert left["stages.1.0.shortcut.0"] == "1x1: mixes channels per pixel"
    convs = {n for n, m in cnn.named_modules() if isinstance(m, nn.Conv2d)}
    assert set(left) == convs - set(TCNN_FASHION_LAYERS)


def test_content_start_options_reach_every_layer_and_round_trip(tmp_path):
    _, checkpoint = small_cnn()
    images = torch.rand(6, 1, 16, 16)
    transformed = transform_checkpoint(
        checkpoint, spread=3.0, gate="sigmoid", opening=0.25, qk_init="mimetic",
        content_weight_decay=False, images=images,
    )  # fmt: skip
    arguments = transformed["arguments"]
    assert (arguments["gate"], arguments["opening"], arguments["qk_init"]) == (
        "sigmoid", 0.25, "mimetic"
    )
    assert arguments["content_weight_decay"] is False
    model = build_model(transformed)
    for layer in model.transformed_layers().values():
        assert torch.allclose(layer.content_gates().detach(), torch.full((9,), 0.25))
        assert torch.equal(layer.query.weight, layer.key.weight)
    exempt = model.no_weight_decay_parameters("original")
    for suffix in ("query.weight", "query.bias", "key.weight", "key.bias", "gate"):
        assert f"network.stages.3.1.conv2.{suffix}" in exempt
    path = tmp_path / "t.pt"
    save_checkpoint(transformed, path)
    loaded, _ = load_model(path)
    x = torch.rand(4, 1, 16, 16)
    with torch.no_grad():
        assert torch.equal(loaded(x), model.eval()(x))
    first = build_model(transform_checkpoint(checkpoint, spread=3.0, **FIRST_FORM))
    first_exempt = first.no_weight_decay_parameters("original")
    assert "network.stages.3.1.conv2.query.weight" not in first_exempt
    for layer in first.transformed_layers().values():
        assert layer.gate_kind == "clamp" and float(layer.content_gates().detach().abs().max()) == 0
    # the default: CONTENT_START's (open clamped gates, mimetic queries and keys, no decay)
    default = transform_checkpoint(checkpoint, spread=3.0, images=images)
    assert {key: default["arguments"][key] for key in CONTENT_START} == CONTENT_START
    model = build_model(default)
    assert "network.stages.3.1.conv2.query.weight" in model.no_weight_decay_parameters("original")
    for layer in model.transformed_layers().values():
        gates = layer.content_gates().detach()
        assert torch.allclose(gates, torch.full((9,), CONTENT_START["opening"]))


def test_calibrate_content_gives_the_content_logits_the_asked_spread():
    cnn, _ = small_cnn()
    model = transform(cnn, spread=3.0, gate="sigmoid", opening=0.2, qk_init="mimetic").float()
    images = torch.rand(5, 1, 16, 16)
    inputs = {}
    for name, layer in model.named_modules():
        if isinstance(layer, TransformedConv2d):
            layer.register_forward_pre_hook(
                lambda _m, args, name=name: inputs.__setitem__(name, args[0])
            )
    model.train()
    stats = {k: v.clone() for k, v in model.state_dict().items() if "running" in k}
    gains = calibrate_content(model, images, logit_std=1.5)
    assert set(gains) == set(TCNN_FASHION_LAYERS) and all(g > 0 for g in gains.values())
    assert model.training  # the mode is put back, and the batch norms ran in eval mode
    assert all(torch.equal(model.state_dict()[k], v) for k, v in stats.items())
    with torch.no_grad():
        model.eval()(images)
        for name, layer in model.named_modules():
            if isinstance(layer, TransformedConv2d):
                std = layer._content_logits(inputs[name]).double().std(dim=-1).mean()
                assert abs(float(std) - 1.5) < 1e-3, name


def test_choose_opening_takes_the_largest_that_keeps_the_accuracy():
    curve = {0.5: 80.0, 0.35: 91.0, 0.25: 92.95, 0.1: 93.0}
    tried = []

    def accuracy(opening):
        tried.append(opening)
        return curve[opening]

    opening, measured = choose_opening(accuracy, 93.0, 0.1, candidates=[0.1, 0.5, 0.25, 0.35])
    assert opening == 0.25 and tried == [0.5, 0.35, 0.25]
    assert measured == {0.5: 80.0, 0.35: 91.0, 0.25: 92.95}
    with pytest.raises(ValueError, match=r"opening 0.35: 91\.00%"):
        choose_opening(accuracy, 93.0, 0.1, candidates=[0.5, 0.35])
