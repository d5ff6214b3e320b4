"""Attention with content scores: the logits of a head from batched matrix products.

The logits of a content layer (docs/theory.md §1) are, for query pixel ``q = (q1, q2)`` and key
pixel ``k = (k1, k2)``,

    A[b, h, q, k] = Q[b, h, q] · K[b, h, k]  +  row[b, h, q, k1] + col[b, h, q, k2]  +  bias[h, q, k]

with ``Q`` the queries already divided by ``√d``. The row and column terms are the per-image
separable ones, the content × position score ``q · r_δ / √d`` (plus the positional score with it).
They are **folded** into the content product: each query is extended by its row and column
logits, each key by the indicators (one-hot) of its row and column,

    Q'[q] = [Q[q], row[q, :], col[q, :]],    K'[k] = [K[k], e_{k1}, e_{k2}],    Q' K'ᵀ = Q Kᵀ + row + col,

so no ``(B, heads, N, N)`` content × position tensor is built, and its gradient arrives through
``Q'`` (``dA · [e_{k1}, e_{k2}]``). A term shared by the batch (the positional score of a layer
without content × position) is instead added as one ``(heads, N, N)`` bias, its gradient summed
over the batch (folding it, a product 16 + 28 wide, cost more than an add from cache).

Routes (``content_attention`` takes the one measured fastest for its key, ``attention/routes.py``,
or where routes are not measured the rules ``uses_sdpa`` and ``block_entries``; all exact, tested
against explicit float64 attention):

* **fused**: where neither the probabilities nor dropout are wanted and nothing is folded,
  ``scaled_dot_product_attention`` with the bias as a ``(1, heads, N, N)`` mask (a 4-D mask is
  what the fused kernels take). The rule (``uses_sdpa``) takes it where it measured faster on the
  machines below; on an Intel Xeon with AMX (one thread, Fashion size, batch 100) it was also the
  faster without gradients in bfloat16 (56 ms against 71 ms for the blocks), which the rule does
  not know and the measured choice finds. On a CPU in float32 or
  float64, without gradients, or with them where there is no bias (its fused kernel has no
  gradient for a mask; a plain ViT's attention has none): at the Fashion-MNIST size (14×14
  tokens, 9 heads of 16, batch 100; AMD EPYC Zen 5, one thread) without gradients as fast as the
  folded route's blocks and 1.35× faster than its whole-batch products, while in bfloat16 the
  blocks ran 1.25× faster than the fused kernel; with gradients, no bias, at the size of
  fashion-mnist-anywhere (16×16 tokens, 9 heads of 16, batch 100; Intel Xeon with AMX, two
  threads) forward+backward took 194 ms fused against 408 ms folded in float32 (a whole
  ``vit-anywhere`` training step 1.7× faster), and 476 ms against 254 ms in bfloat16. On a GPU
  in 16-bit floats, with gradients (the memory-efficient kernel returns the mask's) or without:
  on an NVIDIA H200 at batch 1000, 1.2× (forward+backward) and 2.6× (no-grad) faster than the
  folded route in bfloat16, while in float32 the folded route was faster (1.35× and 1.1×).
* **folded**: ``torch.softmax`` (one pass; a hand-written max-subtract / exp / sum / divide took
  twice as long), dropout, the weighted sum, and a custom backward with the products the
  gradients need (none for the indicators). On a CPU the ``(B, heads, N, N)`` products run a block
  of (image, head) slices at a time (``blocks``), so that the logits, the probabilities and their
  gradients of a block are used while in the core's cache, the bias is added within the product
  of a one-image block (``baddbmm``) and its gradient summed there; the block size is measured
  among sizes scaled to the core's L2 cache (``block_budgets``; the rule: ``BLOCK_ENTRIES``). On
  other devices one block is the whole batch (small products would idle a GPU). Without gradients
  and probabilities nothing is kept for a backward.

Attention dropout is the usual independent mask per image, head and entry, drawn by ``F.dropout``
on a tensor of the probabilities' shape as the layer's dense path draws it (the same random numbers
give the same mask). The products run in the dtype that is fast on the device
(``attnconv.hardware.compute_dtype``): bfloat16 where it is native, float32 where bfloat16 would be
emulated.
"""

from __future__ import annotations

import contextlib
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.flop_counter import flop_registry, register_flop_formula, sdpa_flop_count

from attnconv import hardware
from attnconv.attention import routes
from attnconv.hardware import compute_dtype

_CPU_SDPA = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
if _CPU_SDPA not in flop_registry:  # torch counts its GPU attention kernels only

    @register_flop_formula(_CPU_SDPA)
    def _cpu_sdpa_flops(
        query_shape: tuple[int, ...], key_shape: tuple[int, ...], value_shape: tuple[int, ...],
        *args: Any, **kwargs: Any,
    ) -> int:
        """FLOPs of the fused route's CPU kernel for ``FlopCounterMode`` (as torch counts its GPU
        ones: the two products), so that multiply-adds counted as they run
        (``attnconv.models.complexity``) include it."""
        return sdpa_flop_count(query_shape, key_shape, value_shape)


def key_indicators(height: int, width: int, *, dtype: torch.dtype, device: torch.device) -> Tensor:
    """``(N, H + W)``: for each key pixel ``(k1, k2)`` (row-major), ones at ``k1`` and ``H + k2``."""
    rows = torch.arange(height, device=device).repeat_interleave(width)  # k1 of each pixel
    cols = torch.arange(width, device=device).repeat(height)  # k2 of each pixel
    return torch.cat([F.one_hot(rows, height), F.one_hot(cols, width)], dim=-1).to(dtype)


def per_query(row: Tensor, col: Tensor) -> tuple[Tensor, Tensor]:
    """Separable logits by query pixel: ``row (heads, H, H)`` and ``col (heads, W, W)`` over
    (query row, key row) and (query col, key col) → ``(heads, N, H)`` and ``(heads, N, W)`` with
    ``out[h, (q1, q2), k1] = row[h, q1, k1]`` and ``out[h, (q1, q2), k2] = col[h, q2, k2]``."""
    heads, height, _ = row.shape
    width = col.shape[-1]
    rows = row[:, :, None, :].expand(heads, height, width, height)
    cols = col[:, None, :, :].expand(heads, height, width, width)
    return rows.reshape(heads, -1, height), cols.reshape(heads, -1, width)


def content_attention(
    query: Tensor | None,
    key: Tensor | None,
    value: Tensor,
    row: Tensor | None = None,
    col: Tensor | None = None,
    bias: Tensor | None = None,
    dropout: float = 0.0,
    return_probs: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """Softmax attention over the logits of the module docstring; returns ``(out, probs)``.

    Args:
        query: ``(B, heads, N, d)`` queries already divided by ``√d``, or ``None`` (no content
            product; then ``row`` and ``col`` are needed).
        key: ``(B, heads, N, d)``, or ``None`` exactly when ``query`` is.
        value: ``(B, heads|1, N, dv)``; one head is shared by all heads.
        row, col: ``(B|1, heads, N, H)`` and ``(B|1, heads, N, W)``, the logit each query adds for
            a key in row ``k1`` and column ``k2``; both or neither.
        bias: ``(heads, N, N)`` logits shared by the batch, added as they are.
        dropout: probability of dropping each attention weight (0 outside training).
        return_probs: return the probabilities; ``False`` returns ``None`` in their place and lets
            the fused route run (module docstring).
    Returns:
        ``out (B, heads, N, dv)`` and ``probs (B, heads, N, N)`` (or ``None``), the attention
        before dropout; both carry gradients. Both are in the compute dtype: the inputs' common
        dtype, or where autocast is on (and that is not float64) autocast's dtype for matrix
        products; float32 where the device would emulate it (``attnconv.hardware.compute_dtype``).
    """
    if (query is None) != (key is None) or (row is None) != (col is None):
        raise ValueError("content_attention needs query with key and row with col")
    if query is None and row is None:
        raise ValueError("content_attention needs query and key, or row and col, or both")
    batch, _, n, _ = value.shape
    heads = (row if query is None else query).shape[1]
    device_type = value.device.type
    dtype = torch.promote_types(value.dtype, (row if query is None else query).dtype)
    # The meta device (shapes only: models/complexity.py counts multiply-adds there) has no
    # autocast.
    autocasts = device_type != "meta"
    if autocasts and torch.is_autocast_enabled(device_type) and dtype != torch.float64:
        dtype = torch.get_autocast_dtype(device_type)  # what autocast gives matrix products
    dtype = compute_dtype(dtype, value.device)
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (query, key, value, row, col, bias)
    )
    if row is not None and row.shape[-1] * col.shape[-1] != n:
        raise ValueError(
            f"row and col cover {row.shape[-1]}x{col.shape[-1]} keys, expected {n} (N of the "
            "queries)"
        )
    with torch.autocast(device_type, enabled=False) if autocasts else contextlib.nullcontext():
        fusable = (
            not return_probs
            and dropout == 0.0
            and row is None
            and query is not None
            and value.shape[-1] == query.shape[-1]
        )
        # Block sizes that cut the batch alike are one route (the rule's first).
        partitions = {}
        for budget in (block_entries(value.device), *block_budgets(value.device)):
            partitions.setdefault(slices_per_block(batch, heads, n, budget), budget)
        candidates = {FUSED: None} if fusable else {}
        candidates |= {folded_route(budget): budget for budget in sorted(partitions.values())}
        rule = folded_route(block_entries(value.device))
        if fusable and uses_sdpa(value.device, dtype, needs_grad, masked=bias is not None):
            rule = FUSED
        shape = {
            "batch": batch,
            "heads": heads,
            "tokens": n,
            "query": 0 if query is None else query.shape[-1],
            "folded": 0 if row is None else row.shape[-1] + col.shape[-1],
            "value": f"{value.shape[1]}x{value.shape[-1]}",
            "bias": bias is not None,
            "probs": return_probs,
            "dropout": dropout > 0.0,
        }
        options = (dropout, return_probs, dtype, needs_grad)

        def run(name: str, *tensors: Tensor | None) -> Tensor:
            return _content_route(candidates[name], *tensors, *options)[0]

        tensors = (query, key, value, row, col, bias)
        route = routes.SELECTOR.choose(
            routes.route_key("content", shape, dtype, needs_grad, value.device),
            {name: routes.trial(partial(run, name), tensors, (), needs_grad)
             for name in candidates},
            rule,
            value.device,
        )
        return _content_route(candidates[route], *tensors, *options)


FUSED = "fused"
"""The fused route's name (``scaled_dot_product_attention``)."""


def folded_route(budget: float) -> str:
    """The name of the folded route with blocks of at most ``budget`` entries of logits."""
    return "folded, whole batch" if budget == float("inf") else f"folded, blocks of {int(budget)}"


def _content_route(
    budget: float | None,
    query: Tensor | None,
    key: Tensor | None,
    value: Tensor,
    row: Tensor | None,
    col: Tensor | None,
    bias: Tensor | None,
    dropout: float,
    return_probs: bool,
    dtype: torch.dtype,
    needs_grad: bool,
) -> tuple[Tensor, Tensor | None]:
    """``content_attention`` on one route, in ``dtype`` (autocast off): the fused one where
    ``budget`` is ``None``, else the folded one in blocks of at most ``budget`` entries."""
    batch, _, n, _ = value.shape
    heads = (row if query is None else query).shape[1]
    if budget is None:
        out = F.scaled_dot_product_attention(
            query.to(dtype),
            key.to(dtype),
            value.to(dtype).expand(batch, heads, n, value.shape[-1]),
            attn_mask=None if bias is None else bias.to(dtype)[None],
            scale=1.0,
        )
        return out, None
    parts, indicators = [], None
    if query is not None:
        parts.append(query.to(dtype))
        key = key.to(dtype).contiguous()  # used in two products: one copy, not two
    if row is not None:
        height, width = row.shape[-1], col.shape[-1]
        parts += [
            row.to(dtype).expand(batch, heads, n, height),
            col.to(dtype).expand(batch, heads, n, width),
        ]
        indicators = key_indicators(height, width, dtype=dtype, device=value.device)
    queries = parts[0].contiguous() if len(parts) == 1 else torch.cat(parts, dim=-1)
    value = value.to(dtype).contiguous()
    bias = None if bias is None else bias.to(dtype)
    if not (needs_grad or return_probs or dropout > 0.0):
        keys = _keys(key, indicators, batch, heads, n)
        return _attend(queries, keys, value, bias, budget)[0], None
    out, probs = _FoldedAttention.apply(
        queries, key, indicators, value, bias, float(dropout), budget
    )
    return out, probs if return_probs else None


def uses_sdpa(device: torch.device, dtype: torch.dtype, needs_grad: bool, masked: bool) -> bool:
    """The rule, where routes are not measured: whether attention the fused route can compute (no
    probabilities, dropout or folded terms) takes it on ``device`` in ``dtype``, where it measured
    faster than the folded route on the machines of the module docstring; ``masked``: a bias is
    added to the logits. On a CPU in float32 or float64, without gradients or unmasked; elsewhere
    (a GPU) in 16-bit floats, with gradients or without."""
    if device.type == "cpu":
        return dtype in (torch.float32, torch.float64) and not (needs_grad and masked)
    return dtype in (torch.bfloat16, torch.float16)


BLOCK_ENTRIES = 1 << 19
"""Entries of ``(N, N)`` logits the rule-based folded route computes at a time per CPU thread
(``blocks``; the measured route picks among ``block_budgets``). Measured on an AMD EPYC Zen 5 (1
MiB of L2 cache per core), one thread, at the Fashion-MNIST size (one image: 9 heads of 196 × 196
= 346k entries, 1.4 MB in float32): forward+backward with blocks of one image (this budget) took
0.74× the time of whole-batch products in float32 and 0.82× in bfloat16; blocks of three images
0.83× and 0.80×, of six heads 0.75× and 0.91×."""
BLOCK_STEPS = (1 / 4, 1, 4)
"""The blocks measured (``block_budgets``): these multiples of the float32 entries one core's L2
cache holds, beside ``BLOCK_ENTRIES``, per thread."""


def block_entries(device: torch.device) -> float:
    """Entries of logits per block of the rule-based folded route on ``device``:
    ``BLOCK_ENTRIES`` per thread on a CPU, unbounded elsewhere (one block, the whole batch: a GPU
    wants few, large products)."""
    return BLOCK_ENTRIES * torch.get_num_threads() if device.type == "cpu" else float("inf")


def block_budgets(device: torch.device) -> list[float]:
    """Block sizes (entries of logits) the folded route is measured with on ``device``: on a CPU
    ``BLOCK_STEPS`` times the float32 entries this CPU's L2 cache holds (``BLOCK_ENTRIES``
    standing for it where the cache size is unknown) and ``BLOCK_ENTRIES``, per thread; elsewhere
    the whole batch only."""
    if device.type != "cpu":
        return [float("inf")]
    l2 = hardware.cache_bytes(2)
    base = BLOCK_ENTRIES if l2 is None else l2 // 4
    threads = torch.get_num_threads()
    per_thread = {BLOCK_ENTRIES, *(max(1, int(base * step)) for step in BLOCK_STEPS)}
    return sorted(budget * threads for budget in per_thread)


def slices_per_block(batch: int, heads: int, n: int, budget: float) -> int:
    """``(image, head)`` slices of ``n × n`` entries a block of at most ``budget`` entries holds
    (at least one, at most all ``batch · heads``): what decides how ``blocks`` cuts a batch."""
    return max(1, int(min(batch * heads, budget // (n * n))))


def blocks(batch: int, heads: int, n: int, budget: float) -> list[tuple[slice, slice]]:
    """``(images, heads)`` index pairs of the blocks covering ``(batch, heads)`` slices of ``n × n``
    entries, at most ``budget`` entries a block (at least one slice): whole images when one fits,
    else the heads of one image a few at a time."""
    per_block = slices_per_block(batch, heads, n, budget)
    if per_block < heads:
        return [
            (slice(b, b + 1), slice(h, min(heads, h + per_block)))
            for b in range(batch)
            for h in range(0, heads, per_block)
        ]
    images = per_block // heads
    return [(slice(b, min(batch, b + images)), slice(None)) for b in range(0, batch, images)]


def _keys(key: Tensor | None, indicators: Tensor | None, batch: int, heads: int, n: int) -> Tensor:
    """``K' = [K, E]`` ``(B, heads, N, d + H + W)``, or ``K`` or ``E`` alone (module docstring)."""
    if indicators is None:
        return key
    indicators = indicators.expand(batch, heads, n, indicators.shape[-1])
    return indicators if key is None else torch.cat([key, indicators], dim=-1)


def _value_block(value: Tensor, images: slice, heads: slice) -> Tensor:
    """The values of a block: its heads, or the one head all heads share."""
    return value[images] if value.shape[1] == 1 else value[images, heads]


def _weighted_sum(weights: Tensor, value: Tensor) -> Tensor:
    """``weights (B, heads, N, N) @ value (B, heads|1, N, dv)`` → ``(B, heads, N, dv)``; a value
    shared by the heads takes one ``(heads·N, N) @ (N, dv)`` product per image."""
    batch, heads, n, _ = weights.shape
    if value.shape[1] == heads:
        return weights @ value
    return (weights.reshape(batch, heads * n, n) @ value[:, 0]).view(batch, heads, n, -1)


def _attend(
    queries: Tensor,
    keys: Tensor,
    value: Tensor,
    bias: Tensor | None,
    budget: float,
    noise: Tensor | None = None,
    keep_probs: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """``out = (softmax(Q' K'ᵀ + bias) ∘ noise) V`` in blocks of at most ``budget`` entries
    (``blocks``); also the probabilities ``(B, heads, N, N)`` with ``keep_probs``."""
    batch, heads, n, _ = queries.shape
    out = value.new_empty(batch, heads, n, value.shape[-1])
    probs = queries.new_empty(batch, heads, n, n) if keep_probs else None
    for images, hs in blocks(batch, heads, n, budget):
        block_queries, block_keys = queries[images, hs], keys[images, hs].transpose(-1, -2)
        if bias is not None and block_queries.shape[0] == 1:  # one image: bias + Q Kᵀ in one
            logits = torch.baddbmm(bias[hs], block_queries[0], block_keys[0])[None]
        else:
            logits = block_queries @ block_keys
            if bias is not None:
                logits += bias[hs]
        weights = torch.softmax(logits, -1, out=None if probs is None else probs[images, hs])
        del logits
        if noise is not None:
            weights = weights * noise[images, hs]
        out[images, hs] = _weighted_sum(weights, _value_block(value, images, hs))
    return out, probs


class _FoldedAttention(torch.autograd.Function):
    """``A = Q' K'ᵀ (+ bias)``, ``P = softmax(A)``, ``out = dropout(P) V``, with ``K' = [K, E]``
    (``E`` the key indicators, no gradient), in blocks of at most ``budget`` entries
    (``blocks``). Returns ``(out, P)``."""

    @staticmethod
    def forward(
        ctx: Any,
        queries: Tensor,
        key: Tensor | None,
        indicators: Tensor | None,
        value: Tensor,
        bias: Tensor | None,
        dropout: float,
        budget: float,
    ) -> tuple[Tensor, Tensor]:
        batch, heads, n, _ = queries.shape
        keys = _keys(key, indicators, batch, heads, n)
        noise = None
        if dropout > 0.0:
            # The mask F.dropout draws for probs, rescaled: the same random numbers as the dense
            # path's F.dropout(probs), kept for the backward.
            noise = F.dropout(queries.new_ones(batch, heads, n, n), dropout, training=True)
        out, probs = _attend(queries, keys, value, bias, budget, noise, keep_probs=True)
        ctx.save_for_backward(queries, keys, value, probs, noise)
        ctx.budget = budget
        ctx.set_materialize_grads(False)  # no zeros for unused probs (d_probs is then None)
        ctx.key_width = 0 if key is None else key.shape[-1]
        return out, probs

    @staticmethod
    def backward(ctx: Any, d_out: Tensor, d_probs: Tensor | None) -> tuple[Tensor | None, ...]:
        queries, keys, value, probs, noise = ctx.saved_tensors
        need_queries, need_key, _, need_value, need_bias, _, _ = ctx.needs_input_grad
        batch, heads, n, _ = probs.shape
        width = ctx.key_width
        d_queries = torch.empty_like(queries) if need_queries else None
        d_key = queries.new_empty(batch, heads, n, width) if need_key else None
        d_value = None
        if need_value and d_out is not None:  # summed over the heads when they share one
            d_value = torch.zeros_like(value) if value.shape[1] == 1 else torch.empty_like(value)
        # The bias gradient, a sum over the batch, is accumulated in at least float32.
        d_bias = None
        if need_bias:
            d_bias = probs.new_zeros(
                heads, n, n, dtype=torch.promote_types(probs.dtype, torch.float32)
            )
        shared = value.shape[1] == 1  # one value head for all heads
        for images, hs in blocks(batch, heads, n, ctx.budget):
            p = probs[images, hs]
            if d_out is None:  # only the probabilities were used
                d_weights = d_probs[images, hs]
            else:
                applied = p if noise is None else p * noise[images, hs]
                v, grad = _value_block(value, images, hs), d_out[images, hs]
                if shared:  # products over (heads·N) rows per image
                    block, block_heads = p.shape[:2]
                    grad = grad.reshape(block, block_heads * n, -1)
                    if d_value is not None:
                        flat = applied.reshape(block, block_heads * n, n)
                        d_value[images] += (flat.transpose(1, 2) @ grad)[:, None]
                    d_weights = (grad @ v[:, 0].transpose(1, 2)).view_as(p)
                else:
                    if d_value is not None:
                        d_value[images, hs] = applied.transpose(-1, -2) @ grad
                    d_weights = grad @ v.transpose(-1, -2)  # gradient of the applied weights
                del applied
                if noise is not None:
                    d_weights *= noise[images, hs]
                if d_probs is not None:
                    d_weights += d_probs[images, hs]
            # softmax's own backward, P ∘ (dP − Σ_k dP ∘ P) in one pass (the same from public
            # operations took 3× as long)
            d_logits = torch._softmax_backward_data(d_weights, p, -1, p.dtype)
            del d_weights
            if need_queries:
                d_queries[images, hs] = d_logits @ keys[images, hs]
            if need_key:
                d_key[images, hs] = d_logits.transpose(-1, -2) @ queries[images, hs, :, :width]
            if need_bias:  # (a bfloat16 sum over a dimension of one ran 10× slower on a CPU)
                d_bias[hs] += (
                    d_logits[0] if d_logits.shape[0] == 1 else d_logits.sum(0, dtype=d_bias.dtype)
                )
        if d_bias is not None:
            d_bias = d_bias.to(probs.dtype)
        return d_queries, d_key, None, d_value, d_bias, None, None
