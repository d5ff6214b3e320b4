"""attention/content.py: the folded content kernel against explicit softmax attention, and the
content layers at the Fashion-MNIST size against the dense reference path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

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


# Entries of logits per block of the folded route (content.BLOCK_ENTRIES, one thread) for 3 images
# of 3 heads of 20 × 20: every way ``blocks`` cuts a batch.
BUDGETS = {
    "whole batch": 1 << 40,
    "one head at a time": 400,
    "two heads, then one": 800,
    "one image": 1200,
    "two images, then one": 2400,
}


def test_blocks_cover_the_batch_once():
    for budget, expected in [
        (1 << 40, [(slice(0, 3), slice(None))]),
        (400, [(slice(b, b + 1), slice(h, h + 1)) for b in range(3) for h in range(3)]),
        (800, [(slice(b, b + 1), s) for b in range(3) for s in (slice(0, 2), slice(2, 3))]),
        (1200, [(slice(b, b + 1), slice(None)) for b in range(3)]),
        (2400, [(slice(0, 2), slice(None)), (slice(2, 3), slice(None))]),
        (10, [(slice(b, b + 1), slice(h, h + 1)) for b in range(3) for h in range(3)]),
    ]:
        assert content.blocks(3, 3, 20, budget) == expected, budget


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_kernel_matches_explicit_attention_float64_forward_and_gradients(
    monkeypatch, case, budget
):
    monkeypatch.setattr(content, "BLOCK_ENTRIES", BUDGETS[budget])
    with_content, with_rows, with_bias, per_image, value_heads = case
    gen = torch.Generator().manual_seed(sum(map(hash, map(str, case))) % 2**16)
    batch, heads, height, width, d, dv = 3, 3, 4, 5, 3, 2
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


ROUTE_CASES = {
    "content + bias": (True, "heads"),
    "content only": (False, "heads"),
    "content + bias, one value head": (True, "shared"),
}


def route_inputs(case: str, dtype: torch.dtype = torch.float64):
    """Queries, keys, values (as wide as the queries: what the fused route needs) and bias."""
    with_bias, value_heads = ROUTE_CASES[case]
    gen = torch.Generator().manual_seed(len(case))
    batch, heads, n, d = 3, 3, 20, 4

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype).requires_grad_()

    value = rand(batch, heads if value_heads == "heads" else 1, n, d)
    return rand(batch, heads, n, d), rand(batch, heads, n, d), value, (
        rand(heads, n, n) if with_bias else None
    )


def count_routes(monkeypatch) -> dict[str, int]:
    """Counts of the fused route's SDPA calls, of the folded route's autograd function, and of its
    blocks' forward (``_attend``: in the function, or alone without gradients)."""
    calls = {"sdpa": 0, "folded": 0, "_attend": 0}

    def counted(name, function):
        def call(*args, **kwargs):
            calls[name] += 1
            return function(*args, **kwargs)

        return call

    monkeypatch.setattr(F, "scaled_dot_product_attention",
                        counted("sdpa", F.scaled_dot_product_attention))
    monkeypatch.setattr(content._FoldedAttention, "apply",
                        counted("folded", content._FoldedAttention.apply))
    monkeypatch.setattr(content, "_attend", counted("_attend", content._attend))
    return calls


@pytest.mark.parametrize("case", ROUTE_CASES)
@pytest.mark.parametrize("route", ["fused", "folded"])
def test_routes_without_probabilities_match_explicit_attention_float64(monkeypatch, case, route):
    """Without the probabilities, each route, with gradients and without, is explicit attention.
    With gradients and a bias a CPU never takes the fused route; forcing it runs the code a GPU
    runs (SDPA, then its mask's gradient), on SDPA's CPU kernel."""
    monkeypatch.setattr(content, "BLOCK_ENTRIES", 800)  # blocks of two heads, then one
    monkeypatch.setattr(content, "uses_sdpa", lambda *args, **kwargs: route == "fused")
    calls = count_routes(monkeypatch)
    query, key, value, bias = route_inputs(case)
    inputs = [t for t in (query, key, value, bias) if t is not None]
    out_ref, _ = explicit_attention(query, key, value, None, None, bias, 4, 5)
    weight = torch.randn(out_ref.shape, dtype=torch.float64)
    grads_ref = torch.autograd.grad((out_ref * weight).sum(), inputs)
    out, probs = content.content_attention(query, key, value, bias=bias, return_probs=False)
    assert probs is None
    assert rel_err(out, out_ref) < 1e-12
    grads = torch.autograd.grad((out * weight).sum(), inputs)
    floor = 0.1 * max(g.abs().max().item() for g in grads_ref)
    for got, expected in zip(grads, grads_ref, strict=True):
        assert rel_err(got, expected, floor) < 1e-12
    with torch.no_grad():
        out, probs = content.content_attention(query, key, value, bias=bias, return_probs=False)
    assert probs is None and rel_err(out, out_ref) < 1e-12
    expected_calls = {"fused": {"sdpa": 2, "folded": 0, "_attend": 0},
                      "folded": {"sdpa": 0, "folded": 1, "_attend": 2}}
    assert calls == expected_calls[route]


@pytest.mark.parametrize("case", ROUTE_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_routes_in_float32_and_bfloat16_against_float64(monkeypatch, case, dtype):
    """The routes a CPU takes in float32 and bfloat16 (with native bfloat16), against float64
    explicit attention: float32 to 1e-5 of the largest value (output and every gradient);
    bfloat16, whose 8 bits round the inputs, the logits and the probabilities, to 3e-2 (output)
    and 6e-2 (gradients)."""
    monkeypatch.setattr(hardware, "native_bf16", lambda device: (True, "as the test says"))
    monkeypatch.setattr(content, "BLOCK_ENTRIES", 800)
    calls = count_routes(monkeypatch)
    tolerance, grad_tolerance = (1e-5, 1e-5) if dtype == torch.float32 else (3e-2, 6e-2)
    low = route_inputs(case, dtype)
    exact = [None if t is None else t.detach().double().requires_grad_() for t in low]
    query, key, value, bias = exact
    out_ref, _ = explicit_attention(query, key, value, None, None, bias, 4, 5)
    weight = torch.randn(out_ref.shape, dtype=torch.float64)
    grads_ref = torch.autograd.grad((out_ref * weight).sum(), [t for t in exact if t is not None])
    query, key, value, bias = low
    with torch.no_grad():
        out, _ = content.content_attention(query, key, value, bias=bias, return_probs=False)
    assert out.dtype == dtype and rel_err(out.double(), out_ref) < tolerance
    out, _ = content.content_attention(query, key, value, bias=bias, return_probs=False)
    grads = torch.autograd.grad((out.double() * weight).sum(), [t for t in low if t is not None])
    assert rel_err(out.double(), out_ref) < tolerance
    floor = 0.1 * max(g.abs().max().item() for g in grads_ref)
    for got, expected in zip(grads, grads_ref, strict=True):
        assert got.dtype == dtype
        assert rel_err(got.double(), expected, floor) < grad_tolerance
    # float32 takes the fused route without gradients, and with them where there is no bias;
    # bfloat16 the folded one.
    if dtype == torch.bfloat16:
        assert calls == {"sdpa": 0, "folded": 1, "_attend": 2}
    elif bias is None:
        assert calls == {"sdpa": 2, "folded": 0, "_attend": 0}
    else:
        assert calls == {"sdpa": 1, "folded": 1, "_attend": 1}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("case", ROUTE_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("return_probs", [False, True], ids=["fused", "folded"])
def test_cuda_routes_match_explicit_attention_float64(monkeypatch, case, dtype, return_probs):
    """On a GPU: without the probabilities in bfloat16 the fused route, with gradients (the
    mask's too) and without; else the folded route, one block. Against explicit float64 attention
    on the CPU, to 1e-5 (float32) or 3e-2 and 6e-2 (bfloat16: output, gradients)."""
    calls = count_routes(monkeypatch)
    tolerance, grad_tolerance = (1e-5, 1e-5) if dtype == torch.float32 else (3e-2, 6e-2)
    exact = route_inputs(case)
    out_ref, probs_ref = explicit_attention(*exact[:3], None, None, exact[3], 4, 5)
    weight = torch.randn(out_ref.shape, dtype=torch.float64)
    present = [t for t in exact if t is not None]
    grads_ref = torch.autograd.grad((out_ref * weight).sum(), present)
    low = [None if t is None else t.detach().to("cuda", dtype).requires_grad_() for t in exact]
    query, key, value, bias = low
    with torch.no_grad():
        out, _ = content.content_attention(query, key, value, bias=bias, return_probs=return_probs)
    assert rel_err(out.double().cpu(), out_ref) < tolerance
    out, probs = content.content_attention(
        query, key, value, bias=bias, return_probs=return_probs
    )
    assert out.dtype == dtype and out.device.type == "cuda"
    assert rel_err(out.double().cpu(), out_ref) < tolerance
    if return_probs:
        assert rel_err(probs.double().cpu(), probs_ref) < tolerance
    present = [t for t in low if t is not None]
    grads = torch.autograd.grad((out.double().cpu() * weight).sum(), present)
    floor = 0.1 * max(g.abs().max().item() for g in grads_ref)
    for got, expected in zip(grads, grads_ref, strict=True):
        assert rel_err(got.double().cpu(), expected, floor) < grad_tolerance
    if return_probs:
        assert calls == {"sdpa": 0, "folded": 2, "_attend": 2}
    elif dtype == torch.bfloat16:
        assert calls == {"sdpa": 2, "folded": 0, "_attend": 0}
    else:  # without gradients the folded route's forward alone
        assert calls == {"sdpa": 0, "folded": 1, "_attend": 2}


def test_the_fused_route_runs_where_it_is_fastest():
    cpu, cuda, meta = (torch.device(name) for name in ("cpu", "cuda", "meta"))
    for dtype in (torch.float32, torch.float64):
        for masked in (False, True):
            assert content.uses_sdpa(cpu, dtype, needs_grad=False, masked=masked)
        # SDPA's CPU kernel has no gradient for a mask
        assert content.uses_sdpa(cpu, dtype, needs_grad=True, masked=False)
        assert not content.uses_sdpa(cpu, dtype, needs_grad=True, masked=True)
    for needs_grad in (False, True):
        assert not content.uses_sdpa(cpu, torch.bfloat16, needs_grad, masked=False)
        for masked in (False, True):
            for dtype in (torch.bfloat16, torch.float16):
                assert content.uses_sdpa(cuda, dtype, needs_grad, masked)
            for dtype in (torch.float32, torch.float64):
                assert not content.uses_sdpa(cuda, dtype, needs_grad, masked)
            # Counting multiply-adds (float32, on the meta device) goes through the folded route.
            assert not content.uses_sdpa(meta, torch.float32, needs_grad, masked)
    # The folded route: blocks within a CPU core's cache, the whole batch on a GPU.
    assert content.block_entries(cpu) == content.BLOCK_ENTRIES * torch.get_num_threads()
    assert content.block_entries(cuda) == float("inf")


def test_flop_counter_counts_the_fused_route_as_the_folded_one(monkeypatch):
    """torch's FlopCounterMode has no formula for SDPA's CPU kernel; content.py gives it one, so
    multiply-adds counted as a CPU runs the fused route are those of the folded route."""
    from torch.utils.flop_counter import FlopCounterMode

    query, key, value, bias = (t.detach() for t in route_inputs("content + bias"))
    counts = {}
    for route in ("fused", "folded"):
        monkeypatch.setattr(
            content, "uses_sdpa", lambda *args, route=route, **kwargs: route == "fused"
        )
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            content.content_attention(query, key, value, bias=bias, return_probs=False)
        counts[route] = counter.get_total_flops()
    assert counts["fused"] == counts["folded"] == 2 * 2 * 3 * 3 * 20 * 20 * 4


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


def forward_and_grads(layer, x, weight, impl, return_attention=True):
    layer.impl = impl
    x = x.detach().requires_grad_(True)
    y, probs = layer(x, return_attention=True) if return_attention else (layer(x), None)
    (y * weight).sum().backward()
    grads = {name: p.grad.double().clone() for name, p in layer.named_parameters()}
    grads["input"] = x.grad.double()
    layer.zero_grad()
    return y.double(), None if probs is None else probs.double(), grads


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


@pytest.mark.parametrize("form", FORMS)
def test_fashion_size_without_probabilities_matches_dense_path(monkeypatch, form):
    """What training, eval and analysis run (no probabilities returned): with gradients the
    folded route in blocks (of 5 heads, then 4, here), without them the fused route or the
    folded one without keeping the probabilities; float64 to 1e-12 (gradients 1e-10) and
    float32 to 1e-5 of the dense path in float64."""
    monkeypatch.setattr(content, "BLOCK_ENTRIES", 5 * 196 * 196)
    layer = fashion_layer(form)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(3, 14, 14, 64, generator=gen, dtype=torch.float64)
    weight = torch.randn(3, 14, 14, 64, generator=gen, dtype=torch.float64)
    y_ref, _, g_ref = forward_and_grads(layer, x, weight, "dense")
    floor = grad_floor(g_ref)
    for dtype, tolerance, grad_tolerance in [(torch.float64, 1e-12, 1e-10),
                                             (torch.float32, 1e-5, 1e-5)]:
        layer.to(dtype)
        y, _, grads = forward_and_grads(layer, x.to(dtype), weight.to(dtype), "auto", False)
        assert rel_err(y, y_ref) < tolerance
        for name in g_ref:
            assert rel_err(grads[name], g_ref[name], floor) < grad_tolerance, name
        with torch.no_grad():
            assert rel_err(layer(x.to(dtype)).double(), y_ref) < tolerance


@pytest.mark.parametrize("budget", [1 << 40, 4 * 30 * 30], ids=["whole batch", "4 heads"])
@pytest.mark.parametrize("form", ["w·r + q·k/√d", "three terms"])
def test_content_dropout_equals_dense_path_sample_by_sample(monkeypatch, form, budget):
    monkeypatch.setattr(content, "BLOCK_ENTRIES", budget)
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
