r"""Positional attention scores of the paper, as logits over key pixels.

Conventions ([the mathematics, §1][1-pixels-offsets-and-the-attention-layer]): pixels are
``(row, col)``; a query $q$ and a key $k$ have the relative offset $\delta = k - q$; logits are
indexed ``[head, query, key]``. The isotropic Gaussian and the learned relative score are sums of a
row term and a column term, so they are returned as two factors: ``row (heads, H, H)`` over
``(query row, key row)`` and ``col (heads, W, W)`` over ``(query col, key col)``. The full score over pixels is ``row[h, q1, k1] + col[h, q2, k2]``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def relative_offsets(n: int, *, device: torch.device, dtype: torch.dtype) -> Tensor:
    """``(n, n)`` matrix of ``key − query`` offsets along one axis: ``out[q, k] = k − q``."""
    idx = torch.arange(n, device=device, dtype=dtype)
    return idx[None, :] - idx[:, None]


def gaussian_axis_logits(center: Tensor, spread: Tensor, offsets: Tensor) -> Tensor:
    r"""One axis of the isotropic quadratic score: $-\frac12 s_h^2 (\delta - c_h)^2$.

    Args:
        center: ``(heads,)`` centre offset along this axis, in pixels.
        spread: ``(heads,)`` inverse standard deviations $s$.
        offsets: any shape $S$ of offsets $\delta$ along this axis.
    Returns:
        ``(heads, *S)`` logits.
    """
    extra = (1,) * offsets.dim()
    diff = offsets[None] - center.view(-1, *extra)
    return -0.5 * spread.square().view(-1, *extra) * diff.square()


def gaussian_factors(
    centers: Tensor, spread: Tensor, height: int, width: int
) -> tuple[Tensor, Tensor]:
    r"""Row and column logits of the isotropic quadratic score
    $-\frac12 s^2 \lVert \delta - \Delta \rVert^2$.

    Args:
        centers: ``(heads, 2)`` centre offsets $\Delta$ in pixels, (row, col).
        spread: ``(heads,)`` inverse standard deviations $s$.
    Returns:
        ``row (heads, H, H)`` and ``col (heads, W, W)`` logits whose outer sum is the score.
    """
    opts = {"device": centers.device, "dtype": centers.dtype}
    row = gaussian_axis_logits(centers[:, 0], spread, relative_offsets(height, **opts))
    col = gaussian_axis_logits(centers[:, 1], spread, relative_offsets(width, **opts))
    return row, col


def hard_gaussian_factors(centers: Tensor, height: int, width: int) -> tuple[Tensor, Tensor]:
    r"""Probabilities of the $s \to \infty$ limit of the isotropic Gaussian score, as row/col
    factors.

    In the limit each head puts all its mass on the key pixels nearest to $q + \Delta$ (inside the
    image), shared equally among ties. Returns ``row (heads, H, H)`` and ``col (heads, W, W)``
    probability factors (each row sums to one); the attention over pixels is their product.
    """
    opts = {"device": centers.device, "dtype": centers.dtype}
    return (
        nearest_offset_probs(centers[:, 0], relative_offsets(height, **opts)),
        nearest_offset_probs(centers[:, 1], relative_offsets(width, **opts)),
    )


def nearest_offset_probs(center: Tensor, offsets: Tensor) -> Tensor:
    r"""$s \to \infty$ limit along one axis: uniform over the offsets (last dim) nearest ``center``.

    ``center (heads,)``, ``offsets (..., n)`` → ``(heads, ..., n)``; not differentiable in
    ``center`` (the limit is piecewise constant).
    """
    dist = (offsets[None] - center.detach().view(-1, *(1,) * offsets.dim())).square()
    nearest = (dist == dist.amin(dim=-1, keepdim=True)).to(center.dtype)
    return nearest / nearest.sum(dim=-1, keepdim=True)


def quadratic_form_logits(
    centers: Tensor, spread_matrix: Tensor, row_offsets: Tensor, col_offsets: Tensor
) -> Tensor:
    r"""Generalized quadratic score $-\frac12 (\delta - \Delta)^\top S S^\top (\delta - \Delta)$ on
    broadcast offset grids.

    Args:
        centers: ``(heads, 2)`` centre offsets $\Delta$ in pixels.
        spread_matrix: ``(heads, 2, 2)`` matrices $S$ with $\Sigma^{-1} = S S^\top$.
        row_offsets, col_offsets: offsets $\delta_1$, $\delta_2$ of broadcastable shapes.
    Returns:
        ``(heads, *broadcast shape)`` logits.
    """
    dims = max(row_offsets.dim(), col_offsets.dim())
    extra = (1,) * dims
    precision = spread_matrix @ spread_matrix.transpose(-1, -2)
    p00, p01, p11 = (precision[:, i, j].view(-1, *extra) for i, j in ((0, 0), (0, 1), (1, 1)))
    e1 = row_offsets[None] - centers[:, 0].view(-1, *extra)
    e2 = col_offsets[None] - centers[:, 1].view(-1, *extra)
    return -0.5 * (p00 * e1.square() + 2.0 * p01 * e1 * e2 + p11 * e2.square())


def gaussian_full_logits(centers: Tensor, spread_matrix: Tensor, height: int, width: int) -> Tensor:
    """Logits of the generalized quadratic score over all pixel pairs of an ``H×W`` image.

    ``centers (heads, 2)``, ``spread_matrix (heads, 2, 2)`` → ``(heads, H·W, H·W)``, row-major
    pixel order, rows are queries.
    """
    heads = centers.shape[0]
    opts = {"device": centers.device, "dtype": centers.dtype}
    # Axes (q1, q2, k1, k2): row offsets vary over (q1, k1), column offsets over (q2, k2).
    rows = relative_offsets(height, **opts)[:, None, :, None]
    cols = relative_offsets(width, **opts)[None, :, None, :]
    n = height * width
    return quadratic_form_logits(centers, spread_matrix, rows, cols).reshape(heads, n, n)


def learned_offset_tables(
    row_embedding: Tensor, col_embedding: Tensor, weight: Tensor
) -> tuple[Tensor, Tensor]:
    r"""Learned relative score per head and offset: $w_h^\top r^\text{row}_{\delta_1}$ and
    $w_h^\top r^\text{col}_{\delta_2}$.

    Args:
        row_embedding: ``(2M−1, d_row)`` one vector per row offset ``−(M−1)..M−1``.
        col_embedding: ``(2M−1, d_col)`` one vector per column offset.
        weight: ``(heads, d_row + d_col)`` the per-head vectors $w_h$.
    Returns:
        ``row (heads, 2M−1)`` and ``col (heads, 2M−1)``; index ``M−1`` is offset 0.
    """
    d_row = row_embedding.shape[1]
    return weight[:, :d_row] @ row_embedding.T, weight[:, d_row:] @ col_embedding.T


def learned_factors(
    row_embedding: Tensor, col_embedding: Tensor, weight: Tensor, height: int, width: int
) -> tuple[Tensor, Tensor]:
    r"""Row ``(heads, H, H)`` and column ``(heads, W, W)`` logits of the learned relative score
    $w_h^\top [r^\text{row}_{\delta_1}; r^\text{col}_{\delta_2}]$ (arguments as in
    [`learned_offset_tables`][])."""
    row_table, col_table = learned_offset_tables(row_embedding, col_embedding, weight)
    return _gather_offsets(row_table, height), _gather_offsets(col_table, width)


def offset_index(n: int, table_size: int, device: torch.device) -> Tensor:
    """``(n, n)`` long indices into an offset table of ``table_size = 2M−1`` rows for ``k − q``."""
    centre = (table_size - 1) // 2
    idx = torch.arange(n, device=device)
    return idx[None, :] - idx[:, None] + centre


def _gather_offsets(table: Tensor, n: int) -> Tensor:
    """``table (heads, 2M−1)`` indexed by ``k − q``: returns ``(heads, n, n)``."""
    return table[:, offset_index(n, table.shape[1], table.device)]


def content_positional_factors(
    query: Tensor, row_embedding: Tensor, col_embedding: Tensor, height: int, width: int
) -> tuple[Tensor, Tensor]:
    r"""Content × position terms per query pixel and key row / key column, not yet scaled.

    ``row[b, h, q, k1] = q_h[:d_row] · r_row(k1 − q1)`` and
    ``col[b, h, q, k2] = q_h[d_row:] · r_col(k2 − q2)``; the logit of key ``(k1, k2)`` is
    $(\text{row} + \text{col}) / \sqrt d$.

    Args:
        query: ``(B, heads, H·W, d)`` query vectors with ``d = d_row + d_col``.
        row_embedding, col_embedding: ``(2M−1, d_row)`` / ``(2M−1, d_col)`` as in
            [`learned_offset_tables`][].
    Returns:
        ``row (B, heads, H·W, H)`` and ``col (B, heads, H·W, W)``.
    """
    batch, heads, n, dim = query.shape
    d_row = row_embedding.shape[1]
    q = query.view(batch, heads, height, width, dim)  # (B, heads, N, d) -> (B, heads, H, W, d)
    # Score of every query against every row (resp. column) offset, then pick the key's offset.
    # The tables enter transposed and contiguous: autograd then computes their gradient as
    # ``qᵀ · grad`` (for a transposed view it takes ``(gradᵀ · q)ᵀ``, the orientation of this
    # skinny product that ran 10× slower on a CPU at the Fashion content size).
    by_row_offset = q[..., :d_row] @ row_embedding.T.contiguous()  # (B, heads, H, W, 2M−1)
    by_col_offset = q[..., d_row:] @ col_embedding.T.contiguous()
    row_idx = offset_index(height, row_embedding.shape[0], query.device)  # [q1, k1]
    col_idx = offset_index(width, col_embedding.shape[0], query.device)  # [q2, k2]
    row_term = torch.gather(
        by_row_offset, -1, row_idx[:, None, :].expand(batch, heads, height, width, height)
    )  # (B, heads, H, W, H) over key rows
    col_term = torch.gather(
        by_col_offset, -1, col_idx[None, :, :].expand(batch, heads, height, width, width)
    )  # (B, heads, H, W, W) over key cols
    # (B, heads, H, W, ·) -> (B, heads, N, ·): query pixels row-major
    return row_term.reshape(batch, heads, n, height), col_term.reshape(batch, heads, n, width)


def content_positional_logits(
    query: Tensor, row_embedding: Tensor, col_embedding: Tensor, height: int, width: int
) -> Tensor:
    r"""Logits $q_h^\top r_\delta / \sqrt d$ (content × position) for every query and key pixel.

    Args: as [`content_positional_factors`][].
    Returns:
        ``(B, heads, H·W, H·W)`` logits.
    """
    batch, heads, n, dim = query.shape
    row, col = content_positional_factors(query, row_embedding, col_embedding, height, width)
    logits = row[..., :, None] + col[..., None, :]  # (B, heads, N, H, W) over key pixels
    return logits.reshape(batch, heads, n, n) / math.sqrt(dim)


def kron_factors(row: Tensor, col: Tensor) -> Tensor:
    """Pixel-level matrix from row/col factors: ``out[h, (q1,q2), (k1,k2)] = row[h,q1,k1]·col[h,q2,k2]``.

    ``row (heads, H, H)``, ``col (heads, W, W)`` → ``(heads, H·W, H·W)``.
    """
    heads, height, _ = row.shape
    width = col.shape[1]
    n = height * width
    return (row[:, :, None, :, None] * col[:, None, :, None, :]).reshape(heads, n, n)


def kron_sum_factors(row: Tensor, col: Tensor) -> Tensor:
    """Pixel-level logits from row/col logits: ``out[h, (q1,q2), (k1,k2)] = row + col``."""
    heads, height, _ = row.shape
    width = col.shape[1]
    n = height * width
    return (row[:, :, None, :, None] + col[:, None, :, None, :]).reshape(heads, n, n)


def underflow_log_threshold(dtype: torch.dtype) -> float:
    """Logit gap below the row maximum past which a probability is flushed to exactly zero.

    Probabilities smaller than ``sqrt(tiny)`` (≈1e-19 in float32, 1e-154 in float64) are zeroed so
    that neither they nor their products with activations are subnormal numbers, which run ~10×
    slower in CPU matrix products. The change to any output is below ``N · sqrt(tiny)`` relative.
    """
    return 0.5 * math.log(torch.finfo(dtype).tiny)


def softmax_without_subnormals(logits: Tensor) -> Tensor:
    """``softmax(logits, -1)`` with probabilities below ``sqrt(tiny)`` set to exactly zero.

    Done on the logits (masked to ``−inf`` when more than ``underflow_log_threshold`` below the
    row maximum), so the softmax never produces subnormals in forward or backward.
    """
    gap = logits - logits.detach().amax(dim=-1, keepdim=True)
    logits = logits.masked_fill(gap < underflow_log_threshold(logits.dtype), float("-inf"))
    return logits.softmax(dim=-1)
