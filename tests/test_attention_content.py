"""attention/content.py: the folded content kernel against explicit softmax attention, and the
content layers at the Fashion-MNIST size against the dense reference path."""

from __future__ import annotations

import pytest
import torch

from attention_reference import grad_floor, randomize, rel_err
from attnconv import MultiHeadSelfAttention2d, hardware
from attnconv.attention import content

pytestmark = pytest.mark.usefixtures("one_thread")


def explicit_attention(query, key, value, row, col, bias, height, width):
    """Plain autograd reference: logits over key pixels built entry by entry from the terms."""
    keys = torch.arange(height * width)
    logits = 0.0
    if query is not None:
        logits = query @ key.transpose(-1, -2)
    if row is not None:
        logits = logits + row[..., keys // width] + col[..., keys % width]  # key (k1, k2)
    if bias is not None:
        logits = logits + bias
    probs = torch.softmax(logits, dim=-1)
    return probs @ value, probs


# (content product, row/col terms, bias, per-image row/col, value heads)
CASES = [
    (True, True, False, False, "heads"),  # learned + content, folded shared term
    (True, True, False, True, "heads"),  # content × position: per-image terms
    (True, False, True, False, "heads"),  # a bias that does not separate
    (True, True, True, True, "shared"),  # everything, one value head for all heads
    (False, True, False, True, "heads"),  # content × position without keys
    (True, False, False, False, "shared"),  # content only
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_kernel_matches_explicit_attention_float64_forward_and_gradients(case):
    with_content, with_rows, with_bias, per_image, value_heads = case
    gen = torch.Generator().manual_seed(sum(map(hash, map(str, case))) % 2**16)
    batch, heads, height, width, d, dv = 3, 2, 4, 5, 3, 2
    n = height * width

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64, requires_grad=True)

    query = rand(batch, heads, n, d) if with_content else None
    key = rand(batch, heads, n, d) if with_content else None
    value = rand(batch, heads if value_heads == "heads" else 1, n, dv)
    row = rand(batch if per_image else 1, heads, n, height) if with_rows else None
    col = rand(batch if per_image else 1, heads, n, width) if with_rows else None
    bias = rand(heads, n, n) if with_bias else None
    inputs = [t for t in (query, key, value, row, col, bias) if t is not None]
    out_weight = torch.randn(batch, heads, n, dv, generator=gen, dtype=torch.float64)
    probs_weight = torch.randn(batch, heads, n, n, generator=gen, dtype=torch.float64)

    out, probs = content.content_attention(query, key, value, row, col, bias)
    out_ref, probs_ref = explicit_attention(query, key, value, row, col, bias, height, width)
    assert out.shape == (batch, heads, n, dv) and probs.shape == (batch, heads, n, n)
    assert rel_err(out, out_ref) < 1e-12
    assert rel_err(probs, probs_ref) < 1e-12
    # Gradients through the output and through the returned probabilities.
    loss = (out * out_weight).sum() + (probs * probs_weight).sum()
    loss_ref = (out_ref * out_weight).sum() + (probs_ref * probs_weight).sum()
    grads = torch.autograd.grad(loss, inputs)
    grads_ref = torch.autograd.grad(loss_ref, inputs)
    floor = 0.1 * max(g.abs().max().item() for g in grads_ref)
    for got, expected in zip(grads, grads_ref, strict=True):
        assert got.shape == expected.shape
        assert rel_err(got, expected, floor) < 1e-12
    # Only the probabilities used: no gradient arrives for the output, none leaves for the value.
    _, probs = content.content_attention(query, key, value, row, col, bias)
    _, probs_ref = explicit_attention(query, key, value, row, col, bias, height, width)
    others = [t for t in inputs if t is not value]
    grads = torch.autograd.grad((probs * probs_weight).sum(), others)
    grads_ref = torch.autograd.grad((probs_ref * probs_weight).sum(), others)
    floor = 0.1 * max(g.abs().max().item() for g in grads_ref)
    for got, expected in zip(grads, grads_ref, strict=True):
        assert rel_err(got, expected, floor) < 1e-12


def test_key_indicators_and_per_query_factors():
    indicators = content.key_indicators(2, 3, dtype=torch.float32, device=torch.device("cpu"))
    # key pixel 4 is (row 1, col 1): ones at 1 and 2 + 1
    assert indicators.tolist()[4] == [0, 1, 0, 1, 0]
    assert indicators.sum(-1).tolist() == [2.0] * 6
    row = torch.arange(2 * 2 * 2, dtype=torch.float32).view(2, 2, 2)  # (heads, H, H)
    col = -torch.arange(2 * 3 * 3, dtype=torch.float32).view(2, 3, 3)  # (heads, W, W)
    by_row, by_col = content.per_query(row, col)
    assert by_row.shape == (2, 6, 2) and by_col.shape == (2, 6, 3)
    # query pixel 5 is (row 1, col 2)
    torch.testing.assert_close(by_row[1, 5], row[1, 1])
    torch.testing.assert_close(by_col[1, 5], col[1, 2])


def test_kernel_refuses_unpaired_terms():
    x = torch.randn(1, 1, 4, 2)
    with pytest.raises(ValueError, match="query with key"):
        content.content_attention(x, None, x)
    with pytest.raises(ValueError, match="query and key, or row and col"):
        content.content_attention(None, None, x)
    with pytest.raises(ValueError, match="expected 4"):
        content.content_attention(None, None, x, torch.randn(1, 1, 4, 3), torch.randn(1, 1, 4, 3))


# ---------------------------------------------------------------- the layer at the Fashion size

FORMS = {
    "w·r + q·k/√d": {"positional": "learned", "content": True},
    "three terms": {"positional": "learned", "content": True, "content_positional": True},
    "q·r/√d only": {"positional": "learned", "content_positional": True},
    "q·r/√d + q·k/√d (later original)": {
        "positional": "learned",
        "content": True,
        "content_positional": True,
        "position_term": False,
    },
    "gaussian + content": {"positional": "gaussian", "content": True},
    "gaussian_full + content": {"positional": "gaussian_full", "content": True},
}


def fashion_layer(form: str, seed: int = 0, **kwargs) -> MultiHeadSelfAttention2d:
    """The Fashion content preset's attention: 64 channels, 9 heads of 16, a 14×14 grid."""
    torch.manual_seed(seed)
    layer = MultiHeadSelfAttention2d(64, 9, head_dim=16, max_size=14, **FORMS[form], **kwargs)
    randomize(layer.double(), torch.Generator().manual_seed(seed))
    return layer


def forward_and_grads(layer, x, weight, impl):
    layer.impl = impl
    x = x.detach().requires_grad_(True)
    y, probs = layer(x, return_attention=True)
    (y * weight).sum().backward()
    grads = {name: p.grad.double().clone() for name, p in layer.named_parameters()}
    grads["input"] = x.grad.double()
    layer.zero_grad()
    return y.double(), probs.double(), grads


@pytest.mark.parametrize("form", FORMS)
def test_fashion_size_matches_dense_path_float64_and_float32(form):
    layer = fashion_layer(form)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 14, 14, 64, generator=gen, dtype=torch.float64)
    weight = torch.randn(2, 14, 14, 64, generator=gen, dtype=torch.float64)
    y_ref, probs_ref, g_ref = forward_and_grads(layer, x, weight, "dense")
    floor = grad_floor(g_ref)
    y, probs, grads = forward_and_grads(layer, x, weight, "auto")
    assert rel_err(y, y_ref) < 1e-12 and rel_err(probs, probs_ref) < 1e-12
    for name in g_ref:
        assert rel_err(grads[name], g_ref[name], floor) < 1e-10, name
    y, probs, grads = forward_and_grads(layer.float(), x.float(), weight.float(), "auto")
    assert rel_err(y, y_ref) < 1e-5 and rel_err(probs, probs_ref) < 1e-5
    for name in g_ref:
        assert rel_err(grads[name], g_ref[name], floor) < 1e-5, name


@pytest.mark.parametrize("form", ["w·r + q·k/√d", "three terms"])
def test_content_dropout_equals_dense_path_sample_by_sample(form):
    layer = fashion_layer(form, dropout=0.3).float().train()
    x = torch.randn(2, 6, 5, 64)
    weight = torch.randn(2, 6, 5, 64)
    results = {}
    for impl in ("auto", "dense"):
        torch.manual_seed(7)  # both paths draw their mask with F.dropout on (B, heads, N, N)
        results[impl] = forward_and_grads(layer, x, weight, impl)
    (y, probs, grads), (y_ref, probs_ref, g_ref) = results["auto"], results["dense"]
    assert rel_err(y, y_ref) < 1e-5 and rel_err(probs, probs_ref) < 1e-5
    for name in g_ref:
        assert rel_err(grads[name], g_ref[name], grad_floor(g_ref)) < 1e-5, name
    layer.eval()
    assert rel_err(layer(x).double(), y) > 1e-2  # the mask changed the output


def test_content_dropout_mask_is_independent_per_image_head_and_entry():
    p, batch, heads, n = 0.3, 40, 3, 16
    probs_target = torch.full((batch, heads, n, n), 1.0 / n)
    # Identity values: the output is the dropped and rescaled attention itself.
    value = torch.eye(n).expand(1, 1, n, n)
    torch.manual_seed(0)
    out, probs = content.content_attention(
        torch.zeros(batch, heads, n, 2), torch.zeros(batch, heads, n, 2), value, dropout=p
    )
    torch.testing.assert_close(probs, probs_target)
    kept = out != 0
    values = torch.unique(out[kept])
    torch.testing.assert_close(values, torch.tensor([1.0 / n / (1 - p)]), rtol=1e-6, atol=0)
    assert kept.float().mean().item() == pytest.approx(1 - p, abs=0.01)
    # Independent masks agree on an entry with probability p² + (1 − p)².
    agree = (1 - p) ** 2 + p**2
    for a, b in [(kept[0], kept[1]), (kept[:, 0], kept[:, 1]), (kept[..., 0], kept[..., 1])]:
        assert (a == b).float().mean().item() == pytest.approx(agree, abs=0.03)


@pytest.mark.parametrize("form", ["w·r + q·k/√d", "three terms"])
@pytest.mark.parametrize(("native", "expected"), [(False, torch.float32), (True, torch.bfloat16)])
def test_bfloat16_autocast_computes_in_bfloat16_only_where_native(
    monkeypatch, form, native, expected
):
    monkeypatch.setattr(hardware, "native_bf16", lambda device: (native, "as the test says"))
    layer = fashion_layer(form)
    x = torch.randn(2, 14, 14, 64, dtype=torch.float64)
    weight = torch.randn(2, 14, 14, 64, dtype=torch.float64)
    y_ref, probs_ref, g_ref = forward_and_grads(layer, x, weight, "dense")
    layer.float().impl = "auto"
    x = x.float().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, probs = layer(x, return_attention=True)
    assert probs.dtype == expected
    (y.double() * weight).sum().backward()
    # bfloat16 (8 bits) rounds the Linear layers either way, and where native also the logits and
    # the probabilities.
    tolerance = 2e-2 if expected == torch.float32 else 3e-2
    assert rel_err(y.double(), y_ref) < tolerance
    assert rel_err(probs.double(), probs_ref) < tolerance
    grads = {name: p.grad.double() for name, p in layer.named_parameters()}
    grads["input"] = x.grad.double()
    for name in g_ref:
        assert rel_err(grads[name], g_ref[name], grad_floor(g_ref)) < 2 * tolerance, name
