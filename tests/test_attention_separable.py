"""``separable_attention_project``: the fused per-head separable attention + output projection."""

from __future__ import annotations

import itertools
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnconv import MultiHeadSelfAttention2d
from attnconv.attention import layer as layer_module
from attnconv.attention import separable
from attnconv.attention.separable import separable_attention_project
from memory_probe import LargestOutput
from route_helpers import pinned_route


def plain_reference(values, row, col, weight, bias):
    """``y[b, q1, q2] = Σ_h W_h Σ_{k1, k2} R^h[q1, k1] C^h[q2, k2] x[b, k1, k2] + bias``, spelled
    out with the explicit ``(heads, N, N)`` Kronecker products and a plain concatenation of heads."""
    batch, height, width, d = values.shape
    heads = row.shape[0]
    probs = torch.einsum("hac,hbd->habcd", row, col).reshape(heads, height * width, -1)
    v = values.reshape(batch, height * width, d)
    attended = torch.einsum("hqk,bkc->bqhc", probs, v).reshape(batch, height, width, heads * d)
    y = attended @ weight.t()
    return y if bias is None else y + bias


def random_inputs(gen, batch, height, width, heads, d, out_dim, bias, channels_first):
    f64 = {"generator": gen, "dtype": torch.float64}
    if channels_first:  # a permuted (non-contiguous) view, as a conv feature map would give
        values = torch.randn(batch, d, height, width, **f64).permute(0, 2, 3, 1)
    else:
        values = torch.randn(batch, height, width, d, **f64)
    row = torch.rand(heads, height, height, **f64)
    col = torch.rand(heads, width, width, **f64)
    weight = torch.randn(out_dim, heads * d, **f64)
    return values, row, col, weight, torch.randn(out_dim, **f64) if bias else None


@settings(max_examples=40, deadline=None)
@given(
    batch=st.integers(1, 3),
    height=st.integers(1, 6),
    width=st.integers(1, 6),
    heads=st.integers(1, 4),
    d=st.integers(1, 5),
    out_dim=st.integers(1, 5),
    bias=st.booleans(),
    channels_first=st.booleans(),
    images_per_chunk=st.sampled_from([1, 2, None]),  # None: the default, one chunk here
    layout=st.sampled_from(separable.LAYOUTS),
    seed=st.integers(0, 2**16),
)
def test_matches_plain_reference_forward_and_every_gradient_float64(
    batch,
    height,
    width,
    heads,
    d,
    out_dim,
    bias,
    channels_first,
    images_per_chunk,
    layout,
    seed,
):
    gen = torch.Generator().manual_seed(seed)
    inputs = random_inputs(gen, batch, height, width, heads, d, out_dim, bias, channels_first)
    inputs = [None if t is None else t.requires_grad_(True) for t in inputs]
    upstream = torch.randn(batch, height, width, out_dim, generator=gen, dtype=torch.float64)
    present = [t for t in inputs if t is not None]

    expected = plain_reference(*inputs)
    expected_grads = torch.autograd.grad(expected, present, upstream)
    chunk = (
        separable.CHUNK_ELEMENTS
        if images_per_chunk is None
        else images_per_chunk * height * width * d
    )
    with mock.patch.object(separable, "CHUNK_ELEMENTS", chunk):
        out = separable_attention_project(*inputs, layout=layout)
        grads = torch.autograd.grad(out, present, upstream)

    assert out.shape == (batch, height, width, out_dim) and out.dtype == torch.float64
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)
    for grad, want in zip(grads, expected_grads, strict=True):
        assert grad.shape == want.shape
        torch.testing.assert_close(grad, want, rtol=1e-10, atol=1e-12)


@given(batch=st.integers(1, 300), per_chunk=st.integers(1, 120))
def test_image_chunks_are_as_few_as_fit_and_equal_with_the_largest_first(batch, per_chunk):
    """The scratch buffers are sized for the first chunk: it must be the largest."""
    values = torch.empty(batch, 2, 3, 1)
    chunks = separable._image_chunks(values, per_chunk * 6)
    sizes = [c.stop - c.start for c in chunks]
    assert chunks[0].start == 0 and chunks[-1].stop == batch
    assert all(a.stop == b.start for a, b in itertools.pairwise(chunks))
    assert len(chunks) == -(-batch // per_chunk) and sizes[0] == max(sizes) <= per_chunk
    assert max(sizes) - min(sizes) <= 1


def test_gradients_only_for_inputs_that_require_them():
    gen = torch.Generator().manual_seed(0)
    values, row, col, weight, bias = random_inputs(gen, 2, 4, 5, 3, 3, 2, True, False)
    values.requires_grad_(True)
    weight.requires_grad_(True)
    upstream = torch.randn(2, 4, 5, 2, generator=gen, dtype=torch.float64)
    separable_attention_project(values, row, col, weight, bias).backward(upstream)
    plain_reference(
        v2 := values.detach().requires_grad_(True),
        row,
        col,
        w2 := weight.detach().requires_grad_(True),
        bias,
    ).backward(upstream)
    torch.testing.assert_close(values.grad, v2.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(weight.grad, w2.grad, rtol=1e-10, atol=1e-12)
    assert row.grad is None and col.grad is None and bias.grad is None


@pytest.mark.parametrize("layout", separable.LAYOUTS)
def test_bf16_autocast_runs_in_bf16_and_stays_close_to_float32(layout):
    gen = torch.Generator().manual_seed(1)
    inputs = [
        t.float().requires_grad_(True) for t in random_inputs(gen, 3, 6, 5, 4, 8, 6, True, False)
    ]
    upstream = torch.randn(3, 6, 5, 6, generator=gen)
    exact = separable_attention_project(*inputs)
    exact_grads = torch.autograd.grad(exact, inputs, upstream)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = separable_attention_project(*inputs, chunk_elements=2 * 6 * 5 * 8, layout=layout)
    assert low.dtype == torch.bfloat16
    low_grads = torch.autograd.grad(low, inputs, upstream)
    scale = exact.abs().max()
    assert (low.float() - exact).abs().max() / scale < 2e-2
    for grad, want in zip(low_grads, exact_grads, strict=True):
        assert grad.dtype == torch.float32  # cast back to the parameters' dtype by autograd
        assert ((grad - want).abs().max() / want.abs().max()).item() < 3e-2


@pytest.mark.parametrize("layout", separable.LAYOUTS)
def test_layer_never_builds_a_tensor_of_heads_times_the_input(layout):
    """In float32 the per-head loop keeps every intermediate at the size of one head's values or
    output, in either order of a chunk."""
    batch, height, width, dim, heads = 4, 10, 12, 6, 5
    layer = MultiHeadSelfAttention2d(dim, heads, positional="gaussian")
    x = torch.randn(batch, height, width, dim, requires_grad=True)
    route = layer_module.per_head_route(separable.CHUNK_ELEMENTS, layout)
    with pinned_route(route), LargestOutput() as recorder:
        layer(x).sum().backward()
    pixels = batch * height * width
    # ... or the per-row (W, W) partial gradients of the column factor, pixels·W numbers
    assert recorder.largest <= max(pixels * dim, pixels * width)
    with pinned_route("separable"), LargestOutput() as batched:  # all heads at once
        layer(x).sum().backward()
    assert batched.largest >= pixels * heads * dim


@pytest.mark.parametrize("layout", separable.LAYOUTS)
def test_in_16_bits_the_heads_are_gathered_for_one_chunk_only(layout):
    """In bfloat16 the heads' outputs of a chunk are gathered side by side for one product: a
    buffer of heads × one chunk, never heads × the input; the output stays the float64
    reference's to within bfloat16 rounding."""
    batch, height, width, heads, d, out_dim = 4, 10, 12, 5, 6, 7
    gen = torch.Generator().manual_seed(2)
    inputs = [t.float() for t in random_inputs(gen, batch, height, width, heads, d, out_dim,
                                               True, False)]
    exact = plain_reference(*(t.double() for t in inputs))
    image = height * width
    with LargestOutput() as recorder:
        low = separable_attention_project(*(t.bfloat16() for t in inputs),
                                          chunk_elements=image * d, layout=layout)
    assert recorder.largest == image * heads * d  # one image per chunk: its gathered heads
    assert recorder.largest < batch * image * heads * d
    assert low.dtype == torch.bfloat16
    assert ((low.double() - exact).abs().max() / exact.abs().max()).item() < 2e-2


def test_the_per_head_route_is_for_cpus_only():
    big = layer_module.FUSED_MIN_ELEMENTS
    cpu, cuda = torch.device("cpu"), torch.device("cuda:0")
    assert layer_module.use_fused_route(cpu, big, value_projection=False)
    assert not layer_module.use_fused_route(cpu, big - 1, value_projection=False)
    assert not layer_module.use_fused_route(cpu, big, value_projection=True)
    assert not layer_module.use_fused_route(cuda, 100 * big, value_projection=False)


def test_layer_takes_the_batched_route_where_the_device_check_says_so():
    """With the device check answering as it does for CUDA, a big input takes the batched route
    (the per-head function is never called) and gives the same output."""
    layer = MultiHeadSelfAttention2d(8, 4, positional="gaussian")
    x = torch.randn(8, 32, 32, 8)
    assert x.numel() >= layer_module.FUSED_MIN_ELEMENTS
    with mock.patch.object(
        layer_module, "separable_attention_project", wraps=separable_attention_project
    ) as per_head:
        fused = layer(x)
    per_head.assert_called_once()
    with (
        mock.patch.object(layer_module, "FUSED_DEVICE_TYPES", ("cuda",)),
        mock.patch.object(layer_module, "separable_attention_project") as per_head,
    ):
        batched = layer(x)
    per_head.assert_not_called()
    torch.testing.assert_close(batched, fused, rtol=1e-5, atol=1e-5)


def test_the_shared_route_is_for_small_images_on_a_gpu_only():
    cpu, cuda = torch.device("cpu"), torch.device("cuda:0")
    limit = layer_module.SHARED_MAX_TOKENS["cuda"]
    assert layer_module.use_shared_route(cuda, limit)
    assert not layer_module.use_shared_route(cuda, limit + 1)
    assert not layer_module.use_shared_route(cpu, 1)


@pytest.mark.parametrize("positional", ["gaussian", "learned", "hard"])
def test_on_the_shared_route_a_separable_layer_forms_no_factors_and_returns_dense_probabilities(
    positional,
):
    """With the route check answering yes (as on a GPU for small images), a separable layer
    attends through one ``(heads, N, N)`` matrix: the separable route is never called, and the
    probabilities it returns are the dense reference's (for hard attention too, the s → ∞
    limit). Its output and gradients are checked against the independent reference with every
    other route (tests/test_attention_layer.py, ``every_route``)."""
    torch.manual_seed(0)
    options = {"positional": "gaussian", "hard": True} if positional == "hard" else {
        "positional": positional}
    layer = MultiHeadSelfAttention2d(5, 3, max_size=6, **options).double()
    with torch.no_grad():  # move the encoding off its initial values
        for parameter in layer.position.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    reference = MultiHeadSelfAttention2d(5, 3, max_size=6, impl="dense", **options).double()
    reference.load_state_dict(layer.state_dict())
    x = torch.randn(2, 4, 5, 5, dtype=torch.float64)
    with (
        mock.patch.object(layer_module, "SHARED_MAX_TOKENS", {"cpu": 20}),
        mock.patch.object(MultiHeadSelfAttention2d, "_forward_separable") as separable_route,
    ):
        y, probs = layer(x, return_attention=True)
    separable_route.assert_not_called()
    y_ref, probs_ref = reference(x, return_attention=True)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(probs, probs_ref, rtol=1e-10, atol=1e-12)


def test_the_shared_and_separable_routes_draw_the_same_dropout_mask():
    layer = MultiHeadSelfAttention2d(4, 2, positional="gaussian", dropout=0.3).double().train()
    x = torch.randn(3, 4, 5, 4, dtype=torch.float64)
    torch.manual_seed(7)
    separable_y = layer(x)
    torch.manual_seed(7)
    with mock.patch.object(layer_module, "SHARED_MAX_TOKENS", {"cpu": 20}):
        shared_y = layer(x)
    torch.manual_seed(8)
    other_mask = layer(x)
    torch.testing.assert_close(shared_y, separable_y, rtol=1e-10, atol=1e-12)
    assert not torch.allclose(other_mask, separable_y)  # the mask is random: the seed matters
