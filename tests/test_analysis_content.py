"""Content-attention diagnostics (attnconv.analysis.content): entropy ÷ log N of known maps, the
uniform-content ablation against predictions worked out by hand, the ablation's context leaving
the model exactly as it was, gates, and query/key norms against a run's rebuilt start."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attnconv.analysis.content import (
    content_diagnostics,
    content_layers,
    content_maps,
    format_content,
    normalised_entropy,
    run_start,
    uniform_content,
)
from attnconv.attention import MultiHeadSelfAttention2d
from attnconv.attention.transformed import TransformedConv2d

pytestmark = pytest.mark.usefixtures("one_thread")


def test_entropy_of_known_maps_divided_by_log_n():
    uniform = torch.full((2, 5), 0.2)
    one_hot = torch.eye(4)
    known = torch.tensor([0.5, 0.25, 0.25])  # H = ½ ln 2 + ½ ln 4 = 1.5 ln 2
    assert normalised_entropy(uniform).tolist() == pytest.approx([1.0, 1.0], abs=1e-7)
    assert normalised_entropy(one_hot).tolist() == [0.0] * 4
    assert float(normalised_entropy(known)) == pytest.approx(1.5 * math.log(2) / math.log(3))
    assert math.isnan(float(normalised_entropy(torch.ones(1))))  # one key: uniform and one-hot


class TwoTokens(nn.Module):
    """Content-only attention (the ViT's kind) over two tokens of two channels, ``x (B, 2, 1,
    2)``: token 0 = (a, 0), token 1 = (0, b). Queries 10·x, keys x, no value projection, the
    identity as output projection; the logits are token 0's output. Token 0's content map puts
    σ(10a²/√2) ≥ 0.999 on itself for a ≥ 1, so it predicts class 0 unless b > 1000·a; uniform
    attention outputs (a/2, b/2), class 1 exactly when b > a."""

    def __init__(self) -> None:
        super().__init__()
        self.attention = MultiHeadSelfAttention2d(2, 1, positional=None, content=True)
        with torch.no_grad():
            for linear, scale in ((self.attention.query, 10.0), (self.attention.key, 1.0),
                                  (self.attention.out, 1.0)):  # fmt: skip
                linear.weight.copy_(scale * torch.eye(2))
                linear.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attention(x.permute(0, 2, 3, 1))[:, 0, 0, :]


def two_token_images() -> tuple[torch.Tensor, list[tuple[float, float]]]:
    pairs = [(a, b) for a in (1.0, 2.0, 3.0) for b in (0.5, 1.5, 2.5, 3.5)]
    images = torch.zeros(len(pairs), 2, 1, 2)
    for i, (a, b) in enumerate(pairs):
        images[i, 0, 0, 0], images[i, 1, 0, 1] = a, b
    return images, pairs


def test_ablation_changes_the_predictions_worked_out_by_hand():
    model = TwoTokens()
    images, pairs = two_token_images()
    labels = torch.zeros(len(pairs), dtype=torch.long)  # every image is class 0
    result = content_diagnostics(model, images, labels)
    changed = sum(b > a for a, b in pairs)  # a=1: 3, a=2: 2, a=3: 1
    assert changed == 6
    (layer,) = result.layers
    assert (layer.name, layer.kind, layer.keys, layer.gates) == ("attention", "only", 2, None)
    assert layer.changed == changed and result.changed == changed  # the only layer: all at once
    assert result.accuracy == 1.0
    assert layer.accuracy == result.ablated_accuracy == 0.5
    # each row of the content map, by hand: 1 − s on the token itself, s = σ(−z), z = 10 c²/√2,
    # so its entropy is −(1 − s) log(1 − s) − s log s = log(1 + e^{−z}) + s·z
    expected = 0.0
    for a, b in pairs:
        for c in (a, b):
            z = 10 * c * c / math.sqrt(2)
            expected += (math.log1p(math.exp(-z)) + z / (1 + math.exp(z))) / math.log(2)
    assert layer.entropy == pytest.approx([expected / (2 * len(pairs))], rel=1e-4)
    assert layer.query_start is None and layer.query_ratio is None  # no start given


def test_ablation_context_makes_the_content_map_uniform_and_restores_the_model_exactly():
    model = TwoTokens()
    images, _ = two_token_images()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    parameters = list(model.parameters())
    before = model(images)
    with uniform_content(model):
        inside = model(images)
        maps = content_maps(model.attention, images.permute(0, 2, 3, 1))
    assert torch.equal(maps, torch.full_like(maps, 0.5))
    assert torch.equal(inside, images.sum(dim=3)[:, :, 0] / 2)  # (a/2, b/2)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert all(p is q for p, q in zip(model.parameters(), parameters, strict=True))
    assert torch.equal(model(images), before)
    with pytest.raises(RuntimeError, match="inside"), uniform_content(model):
        raise RuntimeError("inside")
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    with pytest.raises(KeyError, match="out"), uniform_content(model, ["out"]):
        pass


def test_ablation_of_an_added_content_term_leaves_the_positional_logits_alone():
    """learned-content's kind: the content logits are added to the learned positional ones, and
    the ablation removes them: the layer then computes what it computes without content."""
    torch.manual_seed(0)
    layer = MultiHeadSelfAttention2d(6, 3, head_dim=4, positional="learned", content=True,
                                     max_size=4)  # fmt: skip
    with torch.no_grad():
        for table in layer.position.parameters():
            table.normal_()
        layer.query.weight.normal_()
        layer.key.weight.normal_()
    without = MultiHeadSelfAttention2d(6, 3, head_dim=4, positional="learned", max_size=4)
    without.load_state_dict(
        {k: v for k, v in layer.state_dict().items() if not k.startswith(("query", "key"))}
    )
    x = torch.randn(2, 3, 4, 6)
    assert content_layers(nn.Sequential(layer)) == {"0": layer}
    assert not torch.allclose(layer(x), without(x), atol=1e-3)
    with uniform_content(nn.Sequential(layer)):
        torch.testing.assert_close(layer(x), without(x), rtol=1e-6, atol=1e-6)
    # its content map is the softmax of q·k/√d alone, per head
    q = layer.query(x).view(2, 12, 3, 4).transpose(1, 2)
    k = layer.key(x).view(2, 12, 3, 4).transpose(1, 2)
    torch.testing.assert_close(content_maps(layer, x), (q @ k.transpose(-1, -2) / 2).softmax(-1))


def transformed_layer(content_heads: int = 3) -> TransformedConv2d:
    """A 3×3 transformed layer (9 heads) with open gates and content maps far from uniform."""
    torch.manual_seed(0)
    layer = TransformedConv2d(4, 5, 3, padding=((1, 1), (1, 1)), content_heads=content_heads)
    with torch.no_grad():
        layer.gate.copy_(torch.linspace(0.1, 0.9, 9))
        layer.query.weight.mul_(8.0)
    return layer


def test_transformed_layer_entropy_per_head_follows_its_content_map_and_gates_are_reported():
    layer = transformed_layer()
    model = nn.Sequential(layer, nn.Flatten(), nn.LazyLinear(3))
    images = torch.rand(7, 4, 5, 6)
    model(images)  # the lazy layer's shape
    result = content_diagnostics(model, images, batch_size=3)  # batches of 3, 3 and 1 images
    (diagnosed,) = result.layers
    with torch.no_grad():
        probs = layer.content_probs(images).double()  # (B, 3 maps, N_out, N)
    by_hand = -(probs * probs.log()).sum(-1).mean(dim=(0, 2)) / math.log(5 * 6)  # (3,)
    per_head = [float(by_hand[h * 3 // 9]) for h in range(9)]
    assert diagnosed.kind == "gated" and diagnosed.keys == 30
    assert diagnosed.entropy == pytest.approx(per_head, rel=1e-6)
    assert max(per_head) < 0.99  # not uniform: the test would not tell the maps apart
    assert diagnosed.gates == pytest.approx(layer.content_gates().tolist())
    assert result.accuracy is None and diagnosed.accuracy is None  # no labels


def test_transformed_ablation_gives_uniform_content_and_restores_the_layer():
    layer = transformed_layer(content_heads=1)
    x = torch.rand(2, 4, 5, 6)
    state = {k: v.clone() for k, v in layer.state_dict().items()}
    with torch.no_grad():
        before = layer(x)
        with uniform_content(nn.Sequential(layer)):
            maps = layer.content_probs(x)
            ablated = layer(x)
    assert torch.equal(maps, torch.full_like(maps, 1 / 30))
    assert (ablated - before).abs().max() > 1e-2  # the open gates carried the content maps
    assert all(torch.equal(v, state[k]) for k, v in layer.state_dict().items())
    with torch.no_grad():
        assert torch.equal(layer(x), before)


def test_norms_are_against_the_start_rebuilt_from_the_run_seed():
    from attnconv.models.presets import preset_arguments

    architecture, arguments = preset_arguments(
        "learned-content", num_classes=3, in_channels=1, image_size=(6, 6), mean=(0.5,),
        std=(0.3,), stem=1, hidden=8, depth=2, heads=2, head_dim=4, mlp_dim=8, max_size=6,
    )  # fmt: skip
    state = torch.random.get_rng_state()
    start, note = run_start(
        {"architecture": architecture, "arguments": arguments, "config": {"seed": 5}}
    )
    assert torch.equal(torch.random.get_rng_state(), state)  # the global generator untouched
    assert note == "the run's start, rebuilt from its seed 5"
    torch.manual_seed(5)  # what attnconv train does before it builds the model
    from attnconv.models.presets import MODELS

    built = MODELS[architecture](**arguments)
    assert all(torch.equal(a, b) for a, b in zip(start.state_dict().values(),
                                                 built.state_dict().values(), strict=True))  # fmt: skip
    trained = MODELS[architecture](**arguments)
    trained.load_state_dict(start.state_dict())
    with torch.no_grad():
        trained.blocks[1].attention.key.weight.mul_(0.5)
        trained.blocks[0].attention.query.weight.mul_(3.0)
    result = content_diagnostics(trained, torch.rand(4, 1, 6, 6), start=start, start_note=note)
    ratios = [(layer.query_ratio, layer.key_ratio) for layer in result.layers]
    assert ratios == [pytest.approx((3.0, 1.0)), pytest.approx((1.0, 0.5))]
    first = result.layers[0]
    assert first.query_norm == pytest.approx(float(trained.blocks[0].attention.query.weight.detach().norm()))
    assert result.start == note
    assert run_start({"architecture": architecture, "arguments": arguments, "config": {}}) == (
        None, "no run recorded in the checkpoint: its start is not known"
    )  # fmt: skip


def test_the_start_of_a_transformed_run_is_its_cnn_transformed_with_the_run_seed(tmp_path):
    """``train --preset tcnn-* --init CNN`` transforms the CNN after seeding with the run's seed;
    a run from a transformed checkpoint starts from that checkpoint."""
    from attnconv.convert import transform_checkpoint
    from attnconv.models import create_model
    from attnconv.models.checkpoint import build_model, save_checkpoint
    from attnconv.models.presets import preset_arguments
    from viz_helpers import TRANSFORMED_BASE

    torch.manual_seed(0)
    architecture, arguments = preset_arguments(
        "resnet-fashion-small", **TRANSFORMED_BASE, image_size=(16, 16)
    )
    cnn = {"preset": "resnet-fashion-small", "dataset": "fashion-mnist",
           "architecture": architecture, "arguments": arguments,
           "model": create_model("resnet-fashion-small", **arguments).state_dict()}  # fmt: skip
    save_checkpoint(cnn, tmp_path / "cnn.pt")
    torch.manual_seed(7)
    transformed = transform_checkpoint(cnn, "late", 3.0, preset="tcnn-fashion-small")
    save_checkpoint(transformed, tmp_path / "transformed.pt")
    trained = {**transformed, "model": dict(transformed["model"])}
    for name in [k for k in trained["model"] if k.endswith(".key.weight")]:
        trained["model"][name] = 0.5 * trained["model"][name]

    for init, note in (
        (tmp_path / "cnn.pt", f"the run's start: {tmp_path / 'cnn.pt'} transformed with seed 7"),
        (tmp_path / "transformed.pt", f"the run's start, {tmp_path / 'transformed.pt'}"),
    ):
        start, said = run_start({**trained, "config": {"seed": 7, "init": str(init)}})
        assert said == note
        assert start.state_dict().keys() == transformed["model"].keys()
        assert all(torch.equal(v, transformed["model"][k]) for k, v in start.state_dict().items())
    result = content_diagnostics(build_model(trained), torch.rand(3, 1, 16, 16), start=start)
    assert [(layer.query_ratio, layer.key_ratio) for layer in result.layers] == [
        pytest.approx((1.0, 0.5))
    ] * 8
    missing, why = run_start({**trained, "config": {"seed": 7, "init": str(tmp_path / "no.pt")}})
    assert missing is None and why.startswith(f"its start, {tmp_path / 'no.pt'}, cannot be read")


def test_format_content_shows_each_layer_and_head():
    images, pairs = two_token_images()
    result = content_diagnostics(TwoTokens(), images, torch.zeros(len(pairs), dtype=torch.long))
    text = format_content(result, "12 hand-made images")
    lines = text.splitlines()
    assert lines[0].startswith("Content attention on 12 hand-made images (accuracy 100.00%).")
    assert "now ÷ at the start (not known)" in lines[0]
    row = lines[2].split()
    entropy = f"{result.layers[0].entropy[0]:.3f}"
    assert row == ["0", "attention", "only", "2", entropy, entropy, entropy, "—", "—", "—", "6",
                   "50.00", "50.00%"]  # fmt: skip
    assert lines[3] == (
        "every layer's content maps uniform at once: 6 of 12 predictions changed (50.00%), "
        "accuracy 50.00%"
    )
    assert lines[4] == "entropy ÷ log N per head:" and lines[5].split() == ["module", "h0"]
    assert lines[6].split() == ["attention", entropy]


def test_a_run_checkpoint_is_analysed_on_its_whole_test_split(tmp_path):
    """What ``attnconv reproduce`` adds to a run's analysis: the diagnostics of its checkpoint on
    every test image (digits: 359), written beside its figures, and their summary."""
    import csv

    from attnconv.analysis.content import analyse_checkpoint, labelled_test_images
    from viz_helpers import save_checkpoint, small_model

    model, config = small_model("learned-content")
    path = save_checkpoint(tmp_path / "best.pt", model, "learned-content", config)
    summary = analyse_checkpoint(path, tmp_path / "figures")
    images, labels = labelled_test_images("digits", (8, 8))
    assert len(labels) == 359
    expected = content_diagnostics(model, images, labels)
    assert summary == {
        "content_entropy": [pytest.approx(sum(x.entropy) / 3) for x in expected.layers],
        "content_changed": [x.changed / 359 for x in expected.layers],
        "content_changed_all": expected.changed / 359,
        "content_gate": [None, None],
    }
    with (tmp_path / "figures" / "content.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [int(row["changed"]) for row in rows] == [x.changed for x in expected.layers]
    text = (tmp_path / "figures" / "content.txt").read_text()
    assert text.startswith("Content attention on the 359 digits test images (accuracy")
    assert (tmp_path / "figures" / "content_heads.csv").is_file()
    quadratic, config = small_model("quadratic")
    path = save_checkpoint(tmp_path / "quadratic.pt", quadratic, "quadratic", config)
    assert analyse_checkpoint(path, tmp_path / "none") == {}
    assert not (tmp_path / "none").exists()


def test_the_starts_of_the_shipped_models_are_the_ones_their_runs_began_from():
    """Rebuilt from the commands the index records: trained weights stay correlated with the
    weights they started from (cosine 0.7-0.99 measured), where another draw of the same shapes
    gives |cosine| < 0.1; the transformed model starts as the shipped CNN's kernels, gates shut."""
    from attnconv.analysis.content import pretrained_start
    from attnconv.models.pretrained import load_pretrained

    for name in ("learned-content-fashion", "vit-fashion"):
        start, note = pretrained_start(name)
        assert note == "its start, rebuilt from the training command's seed 0"
        trained, began = content_layers(load_pretrained(name)), content_layers(start)
        for layer in trained:
            for part in ("query", "key"):
                now = getattr(trained[layer], part).weight.detach().flatten()
                then = getattr(began[layer], part).weight.detach().flatten()
                assert float(now @ then / now.norm() / then.norm()) > 0.5, (name, layer, part)
    start, note = pretrained_start("tcnn-fashion-small")
    assert note == "its start: the shipped resnet-fashion-small transformed with seed 0"
    cnn = dict(load_pretrained("resnet-fashion-small").named_modules())
    for name, layer in start.transformed_layers().items():
        assert torch.equal(layer.weight, cnn[name].weight)
        assert torch.equal(layer.position.centers, layer.tap_offsets())
