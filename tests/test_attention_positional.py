"""The positional scores as modules (``attention/positional.py``) and how the layer holds them."""

from __future__ import annotations

import math
import warnings
from typing import get_args

import pytest
import torch
from torch import nn

from attention_reference import reference_scores
from attnconv import MultiHeadSelfAttention2d, errors
from attnconv.attention import (
    POSITIONAL_SCORES,
    GaussianFullScore,
    GaussianScore,
    LearnedScore,
    PositionalScore,
)
from attnconv.attention.positional import GRID_SPREAD, Positional, positional_score_class
from attnconv.attention.scores import kron_factors, kron_sum_factors
from attnconv.models import ImageTransformer, create_model

F64 = torch.float64
NAMES = ("gaussian", "gaussian_full", "learned")


def random_layer(positional: str, seed: int = 0, **kwargs) -> MultiHeadSelfAttention2d:
    """A float64 position-only layer with random (far from initial) positional parameters."""
    torch.manual_seed(seed)
    layer = MultiHeadSelfAttention2d(4, 3, positional=positional, max_size=6, **kwargs).double()
    with torch.no_grad():
        for param in layer.position.parameters():
            param.copy_(torch.randn(param.shape, dtype=F64))
    return layer


def test_table_names_classes_and_type_agree():
    assert tuple(POSITIONAL_SCORES) == NAMES == get_args(Positional)
    assert [POSITIONAL_SCORES[name] for name in NAMES] == [
        GaussianScore,
        GaussianFullScore,
        LearnedScore,
    ]
    for name, score in POSITIONAL_SCORES.items():
        assert issubclass(score, PositionalScore) and score.name == name
        layer = MultiHeadSelfAttention2d(4, 2, positional=name)
        assert type(layer.position) is score and layer.positional == name
    assert [score.separable for score in POSITIONAL_SCORES.values()] == [True, False, True]
    assert [score.has_centers for score in POSITIONAL_SCORES.values()] == [True, True, False]
    assert MultiHeadSelfAttention2d(4, 2, positional=None, content=True).position is None


@pytest.mark.parametrize("bad", ["gauss", "Gaussian", "", ["gaussian"], 3])
def test_unknown_names_are_refused_with_the_choices(bad):
    expected = r"expected one of \('gaussian', 'gaussian_full', 'learned'\) or None"
    with pytest.raises(ValueError, match=expected):
        MultiHeadSelfAttention2d(4, 2, positional=bad)
    with pytest.raises(ValueError, match=expected):
        positional_score_class(bad)


def test_scores_refuse_arguments_they_cannot_honour():
    with pytest.raises(ValueError, match=r"s → ∞ limit of positional='gaussian'.*'learned'"):
        MultiHeadSelfAttention2d(4, 2, positional="learned", hard=True)
    with pytest.raises(ValueError, match=r"s → ∞ limit.*'gaussian_full'"):
        MultiHeadSelfAttention2d(4, 2, positional="gaussian_full", hard=True)
    with pytest.raises(ValueError, match="head_dim >= 2, got 1"):
        LearnedScore(2, head_dim=1, max_size=4)
    with pytest.raises(ValueError, match="needs positional='learned'"):
        MultiHeadSelfAttention2d(4, 2, positional="gaussian", content_positional=True)
    with pytest.raises(AttributeError):
        MultiHeadSelfAttention2d(4, 2).positional = "learned"  # the module decides, read-only


@pytest.mark.parametrize("name", NAMES)
def test_dense_logits_match_the_definitions(name):
    layer = random_layer(name)
    height, width = 4, 5
    reference = reference_scores(layer, torch.zeros(1, height, width, 4, dtype=F64))[0]
    torch.testing.assert_close(layer.position.logits(height, width), reference, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["gaussian", "learned"])
def test_dense_logits_are_the_kronecker_sum_of_the_factors(name):
    position = random_layer(name).position
    height, width = 3, 5
    row, col = position.factors(height, width)
    assert row.shape == (3, height, height) and col.shape == (3, width, width)
    dense = position.logits(height, width).view(3, height, width, height, width)
    for q1, q2, k1, k2 in [(0, 0, 0, 0), (2, 1, 0, 4), (1, 4, 2, 3)]:
        torch.testing.assert_close(
            dense[:, q1, q2, k1, k2], row[:, q1, k1] + col[:, q2, k2], rtol=0, atol=1e-12
        )
    assert torch.equal(position.logits(height, width), kron_sum_factors(row, col))
    # Probabilities: the softmax over pixels factors into the row and column softmaxes.
    probs = kron_factors(*position.probability_factors(height, width))
    expected = position.logits(height, width).softmax(-1)
    torch.testing.assert_close(probs, expected, rtol=1e-12, atol=1e-15)


def test_the_generalized_score_has_no_factors():
    position = random_layer("gaussian_full").position
    with pytest.raises(ValueError, match="not separable"):
        position.factors(3, 3)
    with pytest.raises(ValueError, match="not separable"):
        position.offset_factors(3, 3)


@pytest.mark.parametrize("name", NAMES)
def test_offset_probs_are_the_attention_of_an_interior_query(name):
    """On a (2H−1)×(2W−1) image the centre query sees every offset of an H×W image."""
    position = random_layer(name).position
    height, width = 3, 2
    offsets = position.offset_probs(height, width)  # (heads, 2H−1, 2W−1)
    big_h, big_w = 2 * height - 1, 2 * width - 1
    centre = (height - 1) * big_w + (width - 1)
    if position.separable:
        row, col = position.probability_factors(big_h, big_w)
        pixels = kron_factors(row, col)[:, centre]
    else:
        pixels = position.logits(big_h, big_w)[:, centre].softmax(-1)
    torch.testing.assert_close(offsets.flatten(1), pixels, rtol=1e-12, atol=1e-15)


def test_hard_gaussian_puts_all_mass_on_the_nearest_pixel():
    position = GaussianScore(2, hard=True).double()
    with torch.no_grad():
        position.centers.copy_(torch.tensor([[1.0, -1.0], [0.2, 0.0]], dtype=F64))
    row, col = position.probability_factors(3, 3)
    assert torch.equal(row[0], torch.tensor([[0, 1, 0], [0, 0, 1], [0, 0, 1]], dtype=F64))
    assert torch.equal(col[0], torch.tensor([[1, 0, 0], [1, 0, 0], [0, 1, 0]], dtype=F64))
    offsets = position.offset_probs(2, 2)  # (2, 3, 3): offset (1, −1) is index (2, 0)
    assert offsets[0, 2, 0] == 1 and offsets[0].sum() == 1
    assert offsets[1, 1, 1] == 1  # Δ = (0.2, 0): nearest offset (0, 0)


def test_initialisation_follows_the_paper():
    torch.manual_seed(0)
    iso, full = GaussianScore(20000), GaussianFullScore(20000)
    assert iso.centers.shape == (20000, 2) and iso.spread.shape == (20000,)
    assert full.spread.shape == (20000, 2, 2)
    assert iso.centers.mean().item() == pytest.approx(0.0, abs=0.05)
    assert iso.centers.std().item() == pytest.approx(2.0, rel=0.02)
    assert iso.spread.mean().item() == pytest.approx(1.0, abs=1e-3)
    assert iso.spread.std().item() == pytest.approx(0.01, rel=0.02)
    torch.testing.assert_close(full.spread.mean(0), torch.eye(2), atol=1e-3, rtol=0)
    assert (full.spread - torch.eye(2)).std().item() == pytest.approx(0.01, rel=0.02)
    # Odd head_dim: the column table takes the extra channel.
    odd = LearnedScore(2, head_dim=5, max_size=3)
    assert odd.row_embedding.shape == (5, 2) and odd.col_embedding.shape == (5, 3)


def test_learned_score_starts_as_the_papers_code_by_default():
    """Tables as nn.Embedding's default N(0, 1); row keys and column keys each as a bias-free
    nn.Linear of fan-in d_row / d_col: U(±1/√fan_in), whose std is 1/√(3·fan_in)."""
    torch.manual_seed(0)
    learned = LearnedScore(400, head_dim=50, max_size=100)
    assert learned.init == "original"
    assert learned.row_embedding.shape == (199, 25) and learned.col_embedding.shape == (199, 25)
    assert learned.weight.shape == (400, 50)
    for table in (learned.row_embedding, learned.col_embedding):
        assert table.mean().item() == pytest.approx(0.0, abs=0.03)
        assert table.std().item() == pytest.approx(1.0, rel=0.03)
    odd = LearnedScore(400, head_dim=51, max_size=3)  # d_row 25, d_col 26: bounds differ
    for score in (learned, odd):
        d_row = score.row_embedding.shape[1]
        for keys in (score.weight[:, :d_row], score.weight[:, d_row:]):
            bound = 1 / math.sqrt(keys.shape[1])
            assert keys.abs().max().item() <= bound
            assert keys.abs().max().item() > 0.99 * bound  # uniform fills the interval
            assert keys.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.03)
    # So the logits start of order one (each axis term has variance d·1·1/(3d) = 1/3), not 0.05.
    row, col = learned.offset_factors(14, 14)
    assert (row.var() + col.var()).item() == pytest.approx(2 / 3, rel=0.15)


def test_learned_score_bert_init_keeps_the_small_tables():
    torch.manual_seed(0)
    learned = LearnedScore(64, head_dim=50, max_size=100, init="bert")
    assert learned.row_embedding.std().item() == pytest.approx(0.02, rel=0.05)
    assert learned.col_embedding.std().item() == pytest.approx(0.02, rel=0.05)
    assert learned.weight.std().item() == pytest.approx(1 / math.sqrt(50), rel=0.05)
    row, col = learned.offset_factors(14, 14)
    assert max(row.abs().max().item(), col.abs().max().item()) < 0.2
    with pytest.raises(ValueError, match=r"init must be one of \('original', 'bert'\)"):
        LearnedScore(2, head_dim=4, max_size=3, init="xavier")


def test_learned_score_without_its_position_term_has_no_head_keys():
    score = LearnedScore(3, head_dim=4, max_size=5, position_term=False)
    assert score.weight is None and not score.position_term
    assert [name for name, _ in score.named_parameters()] == ["row_embedding", "col_embedding"]
    with pytest.raises(ValueError, match="no position-only term"):
        score.factors(3, 3)
    with pytest.raises(ValueError, match="needs positional='learned'"):
        GaussianScore.for_layer(3, 4, 5, position_term=False)


def test_a_seed_draws_the_same_layer_as_before_scores_were_modules():
    """Linears first, then the score (as before), and the score's parameters first in order."""
    torch.manual_seed(0)
    layer = MultiHeadSelfAttention2d(
        4, 3, head_dim=2, positional="learned", content=True, positional_init="bert"
    )
    torch.manual_seed(0)
    linears = [nn.Linear(4, 6), nn.Linear(4, 6), nn.Linear(4, 6), nn.Linear(6, 4)]
    tables = torch.randn(63, 1) * 0.02, torch.randn(63, 1) * 0.02, torch.randn(3, 2) / 2**0.5
    for linear, name in zip(linears, ("query", "key", "value", "out"), strict=True):
        assert torch.equal(getattr(layer, name).weight, linear.weight)
    for mine, expected in zip(layer.position.parameters(), tables, strict=True):
        torch.testing.assert_close(mine, expected, rtol=1e-6, atol=0)
    assert [name for name, _ in layer.named_parameters()][:3] == [
        "position.row_embedding",
        "position.col_embedding",
        "position.weight",
    ]


def test_size_limits_come_from_the_score():
    learned = MultiHeadSelfAttention2d(4, 2, positional="learned", max_size=5)
    assert learned.covers(5, 5) and not learned.covers(6, 1) and not learned.covers(1, 6)
    assert MultiHeadSelfAttention2d(4, 2, max_size=5).covers(50, 50)  # Gaussians: any size
    with pytest.raises(ValueError, match=r"image 6x2 is larger .*max_size=5.*max_size >= 6"):
        learned.position.check_size(6, 2)
    with pytest.raises(ValueError, match="max_size=5"):
        learned(torch.randn(1, 6, 2, 4))


@pytest.mark.parametrize("name", NAMES)
def test_select_heads_keeps_those_heads_logits(name):
    layer = random_layer(name)
    before = layer.position.logits(3, 4)
    layer.prune_heads([2, 0])
    assert layer.heads == layer.position.heads == 2
    torch.testing.assert_close(layer.position.logits(3, 4), before[[0, 2]], rtol=0, atol=0)


def test_geometry_of_gaussian_heads_only():
    iso = random_layer("gaussian")
    geometry = iso.head_geometry()
    spread = iso.position.spread.detach()
    expected = torch.eye(2, dtype=F64) / spread.square()[:, None, None]
    torch.testing.assert_close(geometry["covariance"], expected)
    assert torch.equal(geometry["centers"], iso.position.centers.detach())
    assert iso.has_centers and not random_layer("learned").has_centers
    with pytest.raises(ValueError, match="needs a gaussian layer, got positional='learned'"):
        random_layer("learned").head_geometry()


def old_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A state dict as written before the scores were modules: ``position.`` flattened into the
    layer, and the learned per-head vectors called ``positional_weight``."""
    renamed = {}
    for key, value in state.items():
        key = key.replace("position.weight", "positional_weight").replace("position.", "")
        renamed[key] = value
    return renamed


@pytest.mark.parametrize("name", NAMES)
def test_state_dicts_with_the_old_names_load(name):
    kwargs = {"content": True, "content_positional": True} if name == "learned" else {}
    source = random_layer(name, seed=1, **kwargs)
    state = old_names(source.state_dict())
    assert not any(key.startswith("position.") for key in state)
    target = random_layer(name, seed=2, **kwargs)
    target.load_state_dict(state)  # strict: every old name found its new place
    x = torch.randn(2, 4, 5, 4, dtype=F64)
    assert torch.equal(target(x), source(x))


def test_a_model_checkpoint_with_the_old_names_loads():
    torch.manual_seed(0)
    model = create_model("quick", positional="learned", max_size=8).eval()
    state = old_names(model.state_dict())
    assert "blocks.0.attention.positional_weight" in state
    fresh = create_model("quick", positional="learned", max_size=8).eval()
    missing, unexpected = fresh.load_state_dict(state, strict=False)
    assert missing == [] and unexpected == []
    images = torch.rand(2, 1, 8, 8)
    assert torch.equal(fresh(images), model(images))


def test_old_attribute_names_warn_once_and_reach_the_score(monkeypatch):
    monkeypatch.setattr(errors, "_warned", set())
    layer = MultiHeadSelfAttention2d(4, 2, positional="learned")
    expected = r"positional_weight is deprecated.*position\.weight"
    with pytest.warns(DeprecationWarning, match=expected):
        assert layer.positional_weight is layer.position.weight
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert layer.positional_weight is layer.position.weight  # once only
    assert not hasattr(layer, "centers")  # a learned layer never had centres
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        _ = layer.nonsense


@pytest.mark.parametrize("score", [GaussianScore, GaussianFullScore])
def test_grid_init_places_each_head_on_its_kernel_tap(score):
    """Theorem 1's construction as a start: head ``i·K + j`` on tap ``(i − ⌊K/2⌋, j − ⌊K/2⌋)``
    with inverse std GRID_SPREAD and no noise (K = 3 and the even K = 4)."""
    for heads, size in ((9, 3), (16, 4)):
        layer = score(heads, init="grid")
        taps = [(i - size // 2, j - size // 2) for i in range(size) for j in range(size)]
        assert layer.centers.tolist() == [[float(r), float(c)] for r, c in taps]
        identity = layer._spread_identity()
        assert torch.equal(layer.spread, GRID_SPREAD * identity.expand_as(layer.spread))
        # the head on tap (i, j) puts its peak attention on that tap
        probs = layer.offset_probs(7, 7)  # (heads, 13, 13), index 6 is offset 0
        peaks = [divmod(int(p.argmax()), 13) for p in probs]
        assert peaks == [(r + 6, c + 6) for r, c in taps]
    with pytest.raises(ValueError, match="square number of heads"):
        score(8, init="grid")


def test_grid_init_is_for_centred_scores_only_and_changes_nothing_else():
    with pytest.raises(ValueError, match="positional init must be one of"):
        LearnedScore(9, head_dim=4, max_size=5, init="grid")
    with pytest.raises(ValueError, match="needs positional='gaussian' or 'gaussian_full'"):
        ImageTransformer(positional="learned", positional_init="grid")
    kwargs = {"hidden": 16, "depth": 2, "mlp_dim": 16, "image_size": (8, 8), "in_channels": 1,
              "mean": (0.5,), "std": (0.2,), "weight_init": "fan_in"}  # fmt: skip
    torch.manual_seed(3)
    grid = ImageTransformer(positional_init="grid", **kwargs).state_dict()
    torch.manual_seed(3)
    paper = ImageTransformer(**kwargs).state_dict()
    differ = {key for key in grid if not torch.equal(grid[key], paper[key])}
    assert differ == {f"blocks.{b}.attention.position.{p}" for b in (0, 1)
                      for p in ("centers", "spread")}  # fmt: skip
