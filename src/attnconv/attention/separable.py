"""Separable position-only attention fused with the output projection, one head at a time.

For position-only scores that factor as ``P^h = R^h ⊗ C^h`` the layer computes

    y[b, q] = bias + Σ_h W_h · Σ_k P^h[q, k] v_h[b, k]        (W_h: the head's block of ``out``)

The plain autograd route builds the attended values of all heads, ``(B, heads, H, W, d)``, permutes
them next to each other for one ``Linear(heads·d → out)`` and keeps them for the backward pass: a
few passes over a tensor ``heads`` times the size of the input, which on a CPU cost more than the
attention arithmetic itself. :func:`separable_attention_project` instead loops over heads: attend
one head (``(B, H, W, d)``, small enough to stay in cache), multiply it into the output with one
matrix product, and in the backward pass recompute it rather than store it. Nothing of size
``heads × input`` is ever allocated, every tensor stays in the input's ``(B, H, W, ·)`` layout (no
permutes), and the matrix products are the same size as the projection's.

Gradients flow to the values, both factors and the projection (weight and bias), so dropout masks,
softmax and value projections are differentiated by autograd outside. No double backward.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _head_values(values: Tensor, head: int) -> Tensor:
    """Contiguous ``values (B, H, W, heads|1, d)`` → the ``(B·H, W, d)`` view of ``head``'s values."""
    batch, height, width, groups, d = values.shape
    return values[:, :, :, head if groups > 1 else 0].view(batch * height, width, d)


class _Buffers:
    """Per-call scratch tensors, reused by every head.

    Allocating a fresh ``(B, H, W, d)`` tensor per head and operation makes glibc's allocator map
    and fault in new pages every time, which costs more than the products themselves; writing into
    the same few buffers keeps them resident (and in cache).
    """

    def __init__(self, values: Tensor) -> None:
        batch, height, width, _, d = values.shape
        self.shape = batch, height, width, d
        self.columns = values.new_empty(batch * height, width, d)  # attended along columns
        self.rows = values.new_empty(batch, height, width * d)  # then along rows

    def attend(self, row: Tensor, col: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """``(R ⊗ C) v`` for ``row (H, H)``, ``col (W, W)``, ``v (B·H, W, d)``.

        Returns ``t (B·H, W, d)``, ``t[b, k1, q2] = Σ_k2 col[q2, k2] v[b, k1, k2]``, and the result
        ``(B, H, W·d)``, ``Σ_k1 row[q1, k1] t[b, k1, q2]``; both are the shared buffers.
        """
        batch, height, width, d = self.shape
        torch.bmm(col.expand(batch * height, width, width), v, out=self.columns)
        columns = self.columns.view(batch, height, width * d)
        torch.bmm(row.expand(batch, height, height), columns, out=self.rows)
        return self.columns, self.rows


class _SeparableAttentionProject(torch.autograd.Function):
    @staticmethod
    def forward(ctx, values, row, col, weight, bias):
        with torch.autocast(values.device.type, enabled=False):
            out = _SeparableAttentionProject._forward(values, row, col, weight, bias)
        ctx.save_for_backward(values, row, col, weight)
        return out

    @staticmethod
    def _forward(values: Tensor, row: Tensor, col: Tensor, weight: Tensor, bias: Tensor | None):
        batch, height, width, _, d = values.shape
        heads, out_dim = row.shape[0], weight.shape[0]
        # Accumulate in at least float32: a bf16 sum over heads would round once per head.
        acc_dtype = torch.promote_types(values.dtype, torch.float32)
        out = values.new_zeros(batch * height * width, out_dim, dtype=acc_dtype)
        if bias is not None:
            out += bias
        head_out = out if acc_dtype == values.dtype else torch.empty_like(out, dtype=values.dtype)
        buffers = _Buffers(values)
        for h in range(heads):
            _, attended = buffers.attend(row[h], col[h], _head_values(values, h))
            w = weight[:, h * d : (h + 1) * d]  # (out, d)
            if head_out is out:
                torch.addmm(out, attended.view(-1, d), w.t(), out=out)  # counted by FlopCounterMode
            else:
                torch.mm(attended.view(-1, d), w.t(), out=head_out)
                out += head_out
        return out.to(values.dtype).view(batch, height, width, out_dim)

    @staticmethod
    def backward(ctx, grad_out):
        values, row, col, weight = ctx.saved_tensors
        with torch.autocast(values.device.type, enabled=False):
            grads = _SeparableAttentionProject._backward(
                values, row, col, weight, grad_out, ctx.needs_input_grad
            )
        return grads

    @staticmethod
    def _backward(values, row, col, weight, grad_out, needs_grad):
        batch, height, width, _, d = values.shape
        grad_out = grad_out.reshape(-1, weight.shape[0]).to(values.dtype)
        grad_values = torch.zeros_like(values) if needs_grad[0] else None
        grad_row = torch.empty_like(row) if needs_grad[1] else None
        grad_col = torch.empty_like(col) if needs_grad[2] else None
        grad_weight = torch.empty_like(weight) if needs_grad[3] else None
        buffers = _Buffers(values)
        grad_attended = values.new_empty(batch * height * width, d)
        grad_columns = values.new_empty(batch, height, width * d)
        for h in range(row.shape[0]):
            v = _head_values(values, h)
            w = weight[:, h * d : (h + 1) * d]  # (out, d)
            t, attended = buffers.attend(row[h], col[h], v)  # recomputed, not stored
            if grad_weight is not None:
                grad_weight[:, h * d : (h + 1) * d] = grad_out.t() @ attended.view(-1, d)
            g = torch.mm(grad_out, w, out=grad_attended).view(batch, height, width * d)
            if grad_row is not None:
                # d/d row[q1, k1] = Σ_{b, q2, c} g[b, q1, q2, c] t[b, k1, q2, c]
                t_rows = t.view(batch, height, width * d).transpose(1, 2)
                grad_row[h] = torch.bmm(g, t_rows).sum(0)
            # u = Rᵀ g: the gradient of the column-attended values t.
            u = torch.bmm(row[h].t().expand(batch, height, height), g, out=grad_columns)
            u = u.view(batch * height, width, d)
            if grad_col is not None:
                # d/d col[q2, k2] = Σ_{b, k1, c} u[b, k1, q2, c] v[b, k1, k2, c]
                grad_col[h] = torch.bmm(u, v.transpose(1, 2)).sum(0)
            if grad_values is not None:
                colt = col[h].t().expand(batch * height, width, width)
                _head_values(grad_values, h).baddbmm_(colt, u)
        grad_bias = grad_out.sum(0) if needs_grad[4] else None
        return grad_values, grad_row, grad_col, grad_weight, grad_bias


def _autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype autocast runs matrix products in on ``device_type`` now, or ``None`` when off."""
    if hasattr(torch, "get_autocast_dtype"):  # torch >= 2.4
        enabled = torch.is_autocast_enabled(device_type)
        return torch.get_autocast_dtype(device_type) if enabled else None
    if device_type == "cpu":
        return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else None
    return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() else None


def separable_attention_project(
    values: Tensor, row: Tensor, col: Tensor, weight: Tensor, bias: Tensor | None
) -> Tensor:
    """``Σ_h (R^h ⊗ C^h) v_h W_hᵀ + bias`` for every image, without a per-head activation tensor.

    Args:
        values: ``(B, H, W, heads, d)``, or ``(B, H, W, 1, d)`` when every head attends over the
            same values (the raw input).
        row: ``(heads, H, H)`` row factors, ``row[h, q1, k1]`` the weight of key row ``k1``.
        col: ``(heads, W, W)`` column factors.
        weight: ``(out_dim, heads·d)``, head ``h`` owning columns ``h·d … (h+1)·d − 1``.
        bias: ``(out_dim,)`` or ``None``.

    Returns:
        ``(B, H, W, out_dim)``. All arguments are cast to one dtype: autocast's when it is on
        (the sum over heads still accumulates in float32), else that of ``values``.
    """
    dtype = _autocast_dtype(values.device.type) or values.dtype
    values = values.to(dtype).contiguous()  # a no-op for the layer's own (permuted) values
    cast = [None if t is None else t.to(dtype) for t in (row, col, weight, bias)]
    return _SeparableAttentionProject.apply(values, *cast)
