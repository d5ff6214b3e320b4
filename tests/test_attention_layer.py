"""MultiHeadSelfAttention2d: every path against the independent dense reference, and its contracts."""

from __future__ import annotations

import contextlib
import math
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attention_reference import grad_floor, randomize, reference_forward, rel_err
from attnconv import MultiHeadSelfAttention2d
from attnconv.attention import layer as layer_module
from attnconv.attention import scores
from memory_probe import LargestOutput
from route_helpers import pinned_route, route_names

# (positional, content, content_positional)
CONFIGS = [
    ("gaussian", False, False),
    ("gaussian_full", False, False),
    ("learned", False, False),
    (None, True, False),
    ("gaussian", True, False),
    ("gaussian_full", True, False),
    ("learned", True, False),
    ("learned", False, True),
    ("learned", True, True),
]


def make_layer(config, dim, heads, head_dim, seed, **kwargs) -> MultiHeadSelfAttention2d:
    positional, content, content_positional = config
    torch.manual_seed(seed)
    layer = MultiHeadSelfAttention2d(
        dim,
        heads,
        head_dim=head_dim,
        positional=positional,
        content=content,
        content_positional=content_positional,
        max_size=8,
        **kwargs,
    ).double()
    randomize(layer, torch.Generator().manual_seed(seed))
    return layer


def every_route(layer, x, then=None) -> list[str]:
    """Every route the layer can take on ``x`` (``attention/routes.py``: the separable factors
    for all heads, one head at a time with each measured chunk size, the shared ``(heads, N, N)``
    matrix; SDPA's fused kernel, the folded kernel with each measured block size), and
    ``"dense"``, the reference path."""
    layer.impl = "auto"
    with torch.no_grad():
        return [*route_names(lambda: layer(x.to(layer.out.weight.dtype), then=then)), "dense"]


def forward_and_grads(layer, x, impl, weight, dtype, then=None):
    """``layer(x, then=then)`` on route ``impl`` in ``dtype`` (a name of ``every_route``), and the
    gradients of ``(y · weight).sum()`` for the input and every parameter (``then``'s prefixed
    ``then.``)."""
    layer = layer.to(dtype)
    layer.impl = "dense" if impl == "dense" else "auto"
    x = x.to(dtype).detach().requires_grad_(True)
    with contextlib.nullcontext() if impl == "dense" else pinned_route(impl):
        y = layer(x, then=then)
    (y * weight.to(dtype)).sum().backward()
    grads = {name: p.grad.double().clone() for name, p in layer.named_parameters()}
    if then is not None:
        grads |= {f"then.{name}": p.grad.double().clone() for name, p in then.named_parameters()}
        then.zero_grad()
    grads["input"] = x.grad.double()
    layer.zero_grad()
    return y.double(), grads


def reference_and_grads(layer, x, weight):
    layer = layer.double()
    x = x.double().detach().requires_grad_(True)
    y, _ = reference_forward(layer, x)
    (y * weight).sum().backward()
    grads = {name: p.grad.clone() for name, p in layer.named_parameters()}
    grads["input"] = x.grad.clone()
    layer.zero_grad()
    return y.detach(), grads


@settings(max_examples=40, deadline=None)
@given(
    config=st.sampled_from(CONFIGS),
    height=st.integers(1, 6),
    width=st.integers(1, 6),
    heads=st.integers(1, 3),
    dim=st.integers(2, 5),
    head_dim=st.sampled_from([None, 2, 3]),
    seed=st.integers(0, 2**16),
)
def test_every_path_matches_reference_float64_forward_and_gradients(
    config, height, width, heads, dim, head_dim, seed
):
    layer = make_layer(config, dim, heads, head_dim, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(2, height, width, dim, generator=gen, dtype=torch.float64)
    weight = torch.randn(2, height, width, dim, generator=gen, dtype=torch.float64)
    y_ref, g_ref = reference_and_grads(layer, x, weight)
    for impl in every_route(layer, x):
        y, grads = forward_and_grads(layer, x, impl, weight, torch.float64)
        assert rel_err(y, y_ref) < 1e-10, impl
        assert grads.keys() == g_ref.keys()
        for name in grads:
            assert rel_err(grads[name], g_ref[name], grad_floor(g_ref)) < 1e-10, (impl, name)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c[0]}-c{int(c[1])}-cp{int(c[2])}")
@pytest.mark.parametrize(("height", "width"), [(5, 7), (6, 6)])
def test_float32_paths_match_float64_reference(config, height, width):
    layer = make_layer(config, 6, 3, None, seed=3)
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(3, height, width, 6, generator=gen, dtype=torch.float64)
    weight = torch.randn(3, height, width, 6, generator=gen, dtype=torch.float64)
    y_ref, g_ref = reference_and_grads(layer, x, weight)
    for impl in every_route(layer, x):
        y, grads = forward_and_grads(layer, x, impl, weight, torch.float32)
        assert rel_err(y, y_ref) < 1e-5, impl
        for name in grads:
            assert rel_err(grads[name], g_ref[name], grad_floor(g_ref)) < 1e-5, (impl, name)


def test_large_spread_attends_one_hot_at_key_minus_query():
    layer = MultiHeadSelfAttention2d(4, 1, positional="gaussian")
    with torch.no_grad():
        layer.position.centers.copy_(torch.tensor([[1.0, 2.0]]))  # key = query + (1 row, 2 cols)
        layer.position.spread.fill_(50.0)
    height, width = 5, 6
    probs = layer.attention_probs(height, width)[0]
    for q1 in range(height - 1):
        for q2 in range(width - 2):
            q = q1 * width + q2
            k = (q1 + 1) * width + (q2 + 2)
            assert probs[q, k].item() == pytest.approx(1.0, abs=1e-12)
    # Forward: each interior query pixel copies the pixel one row down and two columns right.
    x = torch.randn(2, height, width, 4)
    with torch.no_grad():
        layer.out.weight.copy_(torch.eye(4))
        layer.out.bias.zero_()
    y = layer(x)
    torch.testing.assert_close(y[:, : height - 1, : width - 2], x[:, 1:, 2:], rtol=1e-6, atol=1e-6)


def test_hard_attention_is_the_large_spread_limit_with_ties_shared():
    soft = MultiHeadSelfAttention2d(3, 2, positional="gaussian").double()
    hard = MultiHeadSelfAttention2d(3, 2, positional="gaussian", hard=True).double()
    centers = torch.tensor([[-1.0, 2.0], [0.3, -1.8]], dtype=torch.float64)
    with torch.no_grad():
        soft.position.centers.copy_(centers)
        hard.position.centers.copy_(centers)
        soft.position.spread.fill_(60.0)
    torch.testing.assert_close(
        hard.attention_probs(4, 5), soft.attention_probs(4, 5), atol=1e-12, rtol=0
    )
    with torch.no_grad():
        hard.position.centers.copy_(torch.tensor([[0.5, 0.0], [0.0, 0.0]], dtype=torch.float64))
    probs = hard.attention_probs(3, 3)[0]
    # Query (0, 0) with centre half a row down: keys (0, 0) and (1, 0) tie and share the mass.
    assert probs[0, 0].item() == 0.5 and probs[0, 3].item() == 0.5


def test_attention_probs_row_major_rows_sum_to_one_and_match_forward():
    layer = make_layer(("gaussian_full", False, False), 4, 3, None, seed=11)
    probs = layer.attention_probs(3, 4)
    assert probs.shape == (3, 12, 12)
    torch.testing.assert_close(probs.sum(-1), torch.ones(3, 12, dtype=torch.float64))
    x = torch.randn(2, 3, 4, 4, dtype=torch.float64)
    _, returned = layer(x, return_attention=True)
    assert returned.shape == (2, 3, 12, 12)
    torch.testing.assert_close(returned[1], probs)
    _, ref_probs = reference_forward(layer, x)
    torch.testing.assert_close(returned, ref_probs, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("config", CONFIGS[3:], ids=str)
def test_return_attention_for_content_layers_matches_reference(config):
    layer = make_layer(config, 5, 2, None, seed=5)
    x = torch.randn(3, 4, 3, 5, dtype=torch.float64)
    y, probs = layer(x, return_attention=True)
    y_ref, probs_ref = reference_forward(layer, x)
    torch.testing.assert_close(probs, probs_ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="position-only"):
        layer.attention_probs(4, 3)


@pytest.mark.parametrize("positional", ["gaussian", "learned"])
def test_separable_path_never_builds_an_n_by_n_tensor(positional):
    height, width, dim = 20, 18, 4
    n = height * width
    layer = MultiHeadSelfAttention2d(dim, 2, positional=positional, dropout=0.1)
    x = torch.randn(2, height, width, dim, requires_grad=True)
    with LargestOutput() as recorder:
        layer(x).sum().backward()
    assert recorder.largest < n * n  # the dense path's (heads, N, N) would be 2·N²
    layer.impl = "dense"
    with LargestOutput() as dense_recorder:
        layer(x).sum().backward()
    assert dense_recorder.largest >= 2 * n * n


def test_position_only_probabilities_computed_once_per_forward(monkeypatch):
    calls = []
    original = scores.gaussian_factors

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(scores, "gaussian_factors", counting)
    layer = MultiHeadSelfAttention2d(4, 3)
    layer(torch.randn(16, 5, 5, 4))
    assert len(calls) == 1


def test_float32_gaussian_probabilities_have_no_subnormals_and_stay_exact():
    torch.manual_seed(0)
    layer = MultiHeadSelfAttention2d(8, 4, positional="gaussian")
    with torch.no_grad():
        layer.position.spread.fill_(3.0)  # far pixels underflow: e^{-½·9·d²}
    height = width = 16
    row, col = layer.position.probability_factors(height, width)
    tiny = torch.finfo(torch.float32).tiny
    for factor in (row, col, layer.attention_probs(height, width)):
        assert not ((factor > 0) & (factor < tiny)).any()
    x = torch.randn(2, height, width, 8)
    exact, _ = reference_forward(layer.double(), x.double())
    assert rel_err(layer.float()(x).double(), exact) < 1e-5


@pytest.mark.parametrize("positional", ["gaussian", "learned", "gaussian_full"])
def test_factored_dropout_is_shared_by_the_batch_and_matches_dense_path(positional):
    layer = make_layer((positional, False, False), 4, 3, None, seed=2, dropout=0.3).float()
    layer.train()
    x = torch.randn(1, 5, 4, 4).expand(3, 5, 4, 4)  # three copies of one image
    torch.manual_seed(123)
    y_fast = layer(x)
    torch.manual_seed(123)
    with mock.patch.object(layer_module, "FUSED_MIN_ELEMENTS", 0):  # the per-head fused route
        y_fused = layer(x)
    layer.impl = "dense"
    torch.manual_seed(123)
    y_dense = layer(x)
    torch.testing.assert_close(y_fast, y_dense, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y_fused, y_dense, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y_fast[0], y_fast[2])  # one mask for the whole batch
    layer.eval()
    assert not torch.allclose(y_fast, layer(x))


def test_factored_dropout_keeps_each_entry_with_probability_one_minus_p_and_is_unbiased():
    layer = MultiHeadSelfAttention2d(2, 2, dropout=0.3)
    torch.manual_seed(0)
    row, col = layer._factored_dropout_masks(6, 6, torch.zeros(1))
    mask = scores.kron_factors(row, col)
    keep = math.sqrt(0.7)
    values = torch.unique(row).tolist()
    assert len(values) == 2 and values[0] == 0.0 and values[1] == pytest.approx(1 / keep)
    samples = torch.stack(
        [scores.kron_factors(*layer._factored_dropout_masks(6, 6, mask)) for _ in range(400)]
    )
    kept = (samples > 0).double().mean().item()
    assert kept == pytest.approx(0.7, abs=0.01)
    assert samples.double().mean().item() == pytest.approx(1.0, abs=0.02)


def test_content_dropout_is_unbiased():
    torch.manual_seed(0)
    layer = MultiHeadSelfAttention2d(4, 2, positional=None, content=True, dropout=0.5)
    x = torch.randn(2, 3, 3, 4)
    layer.eval()
    expected = layer(x)
    layer.train()
    with torch.no_grad():
        mean = torch.stack([layer(x) for _ in range(3000)]).mean(0)
    assert not torch.allclose(layer(x), expected)
    torch.testing.assert_close(mean, expected, atol=0.05, rtol=0)


def test_any_image_size_and_learned_range_error():
    gaussian = MultiHeadSelfAttention2d(4, 2)
    for height, width in [(1, 1), (3, 11), (17, 2)]:
        assert gaussian(torch.randn(1, height, width, 4)).shape == (1, height, width, 4)
    learned = MultiHeadSelfAttention2d(4, 2, positional="learned", max_size=6)
    assert learned(torch.randn(1, 6, 3, 4)).shape == (1, 6, 3, 4)
    with pytest.raises(ValueError, match="max_size=6"):
        learned(torch.randn(1, 7, 3, 4))


def test_out_dim_and_head_dim_shapes():
    layer = MultiHeadSelfAttention2d(6, 4, head_dim=3, out_dim=5)
    assert layer.value is not None and layer.value.out_features == 12
    assert layer(torch.randn(2, 3, 4, 6)).shape == (2, 3, 4, 5)
    paper = MultiHeadSelfAttention2d(6, 4)
    assert paper.value is None and paper.out.in_features == 24


def test_paper_initialisation():
    torch.manual_seed(0)
    layer = MultiHeadSelfAttention2d(4, 2000, head_dim=1)
    assert layer.position.centers.std().item() == pytest.approx(2.0, rel=0.05)
    assert layer.position.spread.mean().item() == pytest.approx(1.0, abs=1e-3)
    assert layer.position.spread.std().item() == pytest.approx(0.01, rel=0.1)
    full = MultiHeadSelfAttention2d(4, 2000, head_dim=1, positional="gaussian_full")
    torch.testing.assert_close(full.position.spread.mean(0), torch.eye(2), atol=2e-3, rtol=0)


@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_bf16_autocast_stays_close_to_float32(config):
    layer = make_layer(config, 8, 2, None, seed=4).float()
    x = torch.randn(2, 5, 5, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y_bf16 = layer(x)
    assert rel_err(y_bf16.float(), layer(x)) < 5e-2


def test_prune_heads_equals_zeroing_the_removed_heads_outputs():
    layer = make_layer(("learned", True, True), 4, 4, 3, seed=9)
    x = torch.randn(2, 3, 5, 4, dtype=torch.float64)
    zeroed = make_layer(("learned", True, True), 4, 4, 3, seed=9)
    with torch.no_grad():
        zeroed.out.weight[:, 0:3] = 0  # head 0
        zeroed.out.weight[:, 6:9] = 0  # head 2
    expected = zeroed(x)
    layer.prune_heads([3, 1])
    assert layer.heads == 2 and layer.position.weight.shape == (2, 3)
    torch.testing.assert_close(layer(x), expected, rtol=1e-12, atol=1e-12)
    y_ref, _ = reference_forward(layer, x)
    torch.testing.assert_close(layer(x), y_ref, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        layer.prune_heads([5])


def test_head_geometry():
    iso = MultiHeadSelfAttention2d(2, 2).double()
    with torch.no_grad():
        iso.position.spread.copy_(torch.tensor([2.0, 0.5]))
    geometry = iso.head_geometry()
    torch.testing.assert_close(geometry["covariance"][0], torch.eye(2, dtype=torch.float64) / 4)
    torch.testing.assert_close(geometry["condition_number"], torch.ones(2, dtype=torch.float64))
    full = MultiHeadSelfAttention2d(2, 2, positional="gaussian_full").double()
    with torch.no_grad():
        full.position.spread.copy_(
            torch.tensor([[[1.0, 0.0], [0.0, 0.01]], [[1.0, 0.5], [0.0, 1.0]]])
        )
    geometry = full.head_geometry()
    assert geometry["condition_number"][0].item() == pytest.approx(1e4)
    precision = full.position.spread[1] @ full.position.spread[1].T
    torch.testing.assert_close(geometry["covariance"][1], torch.linalg.inv(precision))


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"heads": 0}, ValueError, "heads must be >= 1"),
        ({"heads": 2.0}, TypeError, "heads must be an int"),
        ({"positional": "sinusoid"}, ValueError, "unknown positional score 'sinusoid'"),
        (
            {"positional": "gaussian", "content_positional": True},
            ValueError,
            "needs positional='learned'",
        ),
        ({"positional": None}, ValueError, "needs a score"),
        ({"dropout": 1.0}, ValueError, r"dropout must be in \[0, 1\)"),
        ({"hard": True, "positional": "learned"}, ValueError, "hard=True"),
        ({"impl": "fast"}, ValueError, "impl must be one of"),
    ],
)
def test_bad_construction_arguments(kwargs, error, message):
    arguments = {"dim": 4, "heads": 2, **kwargs}
    with pytest.raises(error, match=message):
        MultiHeadSelfAttention2d(**arguments)


def test_bad_inputs_name_what_was_expected():
    layer = MultiHeadSelfAttention2d(4, 2)
    with pytest.raises(ValueError, match=r"\(B, H, W, 4\).*got shape \(3, 4, 4\)"):
        layer(torch.randn(3, 4, 4))
    with pytest.raises(ValueError, match=r"expected 4 channels.*got shape \(1, 3, 3, 5\)"):
        layer(torch.randn(1, 3, 3, 5))
    with pytest.raises(TypeError, match="floating-point"):
        layer(torch.ones(1, 3, 3, 4, dtype=torch.long))
    with pytest.raises(TypeError, match=r"torch\.Tensor"):
        layer([[1.0]])


@pytest.mark.parametrize("head_dim", [None, 4])
@pytest.mark.parametrize("impl", ["auto", "dense"])
@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_an_empty_batch_gives_an_empty_output_on_every_path(config, training, impl, head_dim):
    """As torch's layers do: no image in, no image out (and a gradient of the same shape)."""
    layer = make_layer(config, 6, 3, head_dim, seed=0, dropout=0.1, out_dim=5).float()
    layer.impl = impl
    layer.train(training)
    x = torch.randn(0, 4, 5, 6, requires_grad=True)
    y, probs = layer(x, return_attention=True)
    assert y.shape == (0, 4, 5, 5) and y.dtype == torch.float32
    assert probs.shape == (0, 3, 20, 20)
    assert layer(x).shape == (0, 4, 5, 5)
    y.sum().backward()
    assert x.grad.shape == (0, 4, 5, 6)


@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_non_finite_input_gives_non_finite_output(config):
    layer = make_layer(config, 4, 2, None, seed=1).float()
    x = torch.randn(1, 4, 4, 4)
    x[0, 1, 2, 3] = float("nan")
    assert not torch.isfinite(layer(x)).all()
    x[0, 1, 2, 3] = float("inf")
    assert not torch.isfinite(layer(x)).all()


@pytest.mark.parametrize("config", CONFIGS, ids=str)
@pytest.mark.parametrize(("batch", "height"), [(1, 3), (3, 5)], ids=["two-maps", "folded"])
def test_a_following_linear_map_folded_or_not_matches_the_reference(config, batch, height):
    """``layer(x, then=dense)`` is ``dense(layer(x))`` on every route, forward and gradients, in
    float64. With 3 heads of 4 (12 channels) into 6, then 7, folding pays from 17 rows on: one
    image of 3×4 pixels takes two maps, three of 5×4 one folded map (``fold_pays`` checked)."""
    layer = make_layer(config, 5, 3, 4, seed=4, out_dim=6)
    torch.manual_seed(5)
    then = torch.nn.Linear(6, 7).double()
    tokens = batch * height * 4
    assert layer_module.fold_pays(layer.out, then, tokens) == (batch == 3)
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(batch, height, 4, 5, generator=gen, dtype=torch.float64)
    weight = torch.randn(batch, height, 4, 7, generator=gen, dtype=torch.float64)
    x_ref = x.clone().requires_grad_(True)
    y_ref = then(reference_forward(layer, x_ref)[0])
    (y_ref * weight).sum().backward()
    g_ref = {name: p.grad.clone() for name, p in layer.named_parameters()}
    g_ref |= {f"then.{name}": p.grad.clone() for name, p in then.named_parameters()}
    g_ref["input"] = x_ref.grad.clone()
    layer.zero_grad()
    then.zero_grad()
    for impl in every_route(layer, x, then):
        y, grads = forward_and_grads(layer, x, impl, weight, torch.float64, then=then)
        assert rel_err(y, y_ref.detach()) < 1e-10, impl
        assert grads.keys() == g_ref.keys()
        for name in grads:
            assert rel_err(grads[name], g_ref[name], grad_floor(g_ref)) < 1e-10, (impl, name)


@pytest.mark.parametrize("bias", [True, False])
def test_folding_takes_the_fewer_multiply_adds_counted_as_they_run(bias):
    """Around the threshold (13 rows: square maps of 6 after 12 channels), the layer with
    ``then`` runs no more multiply-adds than the cheaper of folding and two maps, and strictly
    fewer than the dearer where the two differ, as ``FlopCounterMode`` counts them."""
    from torch.utils.flop_counter import FlopCounterMode

    layer = MultiHeadSelfAttention2d(6, 3, head_dim=4, positional="gaussian", max_size=8)
    then = torch.nn.Linear(6, 6, bias=bias)

    def counted(run, x) -> int:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            run(x)
        return counter.get_total_flops() // 2

    for height, width in [(2, 5), (3, 4), (2, 7), (4, 4)]:  # 10, 12, 14 and 16 rows
        x = torch.randn(1, height, width, 6)
        attention = counted(layer, x)
        two_maps = counted(lambda t: then(layer(t)), x)
        # the composite's weight and bias, then a projection of the same size as the layer's
        one_map = attention + 6 * 6 * (12 + 1)
        folded = counted(lambda t: layer(t, then=then), x)
        assert folded == min(two_maps, one_map), (height, width)
        folds = layer_module.fold_pays(layer.out, then, height * width)
        assert folds == (one_map < two_maps)


def test_a_following_map_of_the_wrong_width_is_refused():
    layer = MultiHeadSelfAttention2d(6, 2, positional="gaussian", max_size=8, out_dim=5)
    with pytest.raises(TypeError, match=r"nn\.Linear taking the layer's 5 output channels"):
        layer(torch.randn(1, 3, 3, 6), then=torch.nn.Linear(6, 6))
