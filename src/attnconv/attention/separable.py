r"""Separable position-only attention fused with the output projection, one head at a time.

For position-only scores that factor as $P^h = R^h \otimes C^h$, with every head attending over the
same values (the raw input: the paper's model, which has no value projection), the layer computes,
with $W_h$ the head's block of ``out``,

$$
y_{b,q} = \text{bias} + \sum_h W_h \sum_k P^h_{q,k} \, x_{b,k}.
$$

The plain autograd route builds the attended values of all heads, ``(B, heads, H, W, d)``, permutes
them next to each other for one ``Linear(heads·d → out)`` and keeps them for the backward pass: a
few passes over a tensor ``heads`` times the size of the input, which on a CPU cost more than the
attention arithmetic itself. [`separable_attention_project`][] instead loops over chunks of
images and over heads: attend one head of one chunk (two small matrix products into scratch
buffers), multiply it into the output with one matrix product, and in the backward pass recompute
it rather than store it. In float32 nothing of size ``heads × input`` is ever allocated; in 16
bits the heads' outputs of one chunk are gathered for a single projection product
(``_Projection``): ``heads`` times a chunk, bounded by the chunk size whatever the batch (``heads ×
input`` only where one chunk holds the whole batch). The projection's arithmetic is unchanged.

The loop runs in one of two layouts of a chunk (``LAYOUTS``; the route selector measures both,
``attention/routes.py``). ``"images"``: the chunk as it comes, ``(b, H, W, d)``; a head's column
attention is a batch of ``b·H`` products of ``W × W`` by ``W × d`` and its row attention a batch of
``b`` products of ``H × H`` by ``H × W·d``. ``"pixels"``: the chunk copied once, pixels first,
``(H, W, b, d)``, which every head shares; a head's row attention is then one product of ``H × H``
by ``H × W·b·d`` and its column attention ``H`` products of ``W × W`` by ``W × b·d``, and the
row-factor gradient one product instead of a batch summed; the output (and in the backward pass
the output's gradient and the values' gradient) is held in the same order and permuted once per
chunk. Fewer, larger products against three copies of a chunk: which pays depends on the machine,
the sizes and the dtype (one thread of an Intel Xeon with AMX, forward and backward, the best chunk
of each: in float32 the pixels-first loop 9% faster at the Fashion size and 7% at the paper's, in
bfloat16 4–13% slower; ``docs/layers.md``).

Gradients flow to the values, both factors and the projection (weight and bias), so dropout masks
and the softmax are differentiated by autograd outside. No double backward.
"""

from __future__ import annotations

import itertools

import torch
from torch import Tensor

from attnconv import hardware

CHUNK_ELEMENTS = 1 << 18
"""At most this many values of one head per chunk of images (1 MiB in float32), or one image where
an image holds more: the chunk the rule-based route takes (``attention/routes.py``), where the
measured one (``chunk_candidates``) is not. Bounds the scratch memory (two buffers of this size in
the forward pass, four in the backward, and in 16 bits ``heads`` more for the gathered outputs,
``_Projection``) whatever the batch and image size, and keeps a chunk's
tensors near the core while every head passes over them: the attention products have inner
dimension ``H`` or ``W`` and are bound by memory traffic. Measured on an AMD EPYC Zen 5 (1 MiB L2
per core, 1 thread, fwd+bwd in float32, CPU time): at the Fashion size (batch 100, 14×14, 9
heads, dim 64) the layer took 1.9× its projection floor with the whole batch in one chunk
(``1 << 22``) and 1.4× with chunks of 20 images (``1 << 18``), 1.5× with 10 or 41 (with freed
memory reused, ``attnconv.memory``, whose floor is faster: 2.5× → 2.0×); at the paper's size
(16×16, dim 400) 1.25× with 40 images and 1.1–1.15× with 2 to 5. On an Intel Xeon with AMX (2 MiB
L2 per core, 1 thread) bfloat16 wants larger chunks, whose products its matrix unit runs faster:
at the paper's size forward and backward took 808 ms with ``1 << 18`` and 588 ms with ``1 << 20``,
while float32 took 1.77 s and 1.81 s (``docs/layers.md``)."""
LAYOUTS = ("images", "pixels")
"""The orders a chunk is attended in (module docstring): images first as it comes, or copied
pixels first."""
CHUNK_STEPS = (4, 1, 1 / 4)
"""The chunks measured (``chunk_candidates``): these multiples of the values one core's L2 cache
holds in float32, beside ``CHUNK_ELEMENTS``."""


def chunk_candidates() -> list[int]:
    """Chunk sizes (values of one head) the per-head route is measured with, largest first:
    ``CHUNK_STEPS`` times the float32 values that fit this CPU's L2 cache (``CHUNK_ELEMENTS``
    standing for it where the cache size is unknown), and ``CHUNK_ELEMENTS`` itself."""
    l2 = hardware.cache_bytes(2)
    base = CHUNK_ELEMENTS if l2 is None else l2 // 4
    return sorted({CHUNK_ELEMENTS, *(max(1, int(base * step)) for step in CHUNK_STEPS)},
                  reverse=True)


def _by_rows(values: Tensor) -> Tensor:
    """Contiguous ``(b, H, W, d)`` → the ``(b·H, W, d)`` view the column products work on."""
    batch, height, width, d = values.shape
    return values.view(batch * height, width, d)


def _image_chunks(values: Tensor, chunk_elements: int) -> list[slice]:
    """Slices of the batch into as few chunks of equal size (± one image) as hold at most
    ``chunk_elements`` values of one head each (or one image, when it holds more)."""
    batch, height, width, d = values.shape
    count = -(-batch // max(1, chunk_elements // (height * width * d)))
    bounds = [-(-batch * i // count) for i in range(count + 1)]  # the first chunk is the largest
    return [slice(start, stop) for start, stop in itertools.pairwise(bounds)]


class _Scratch:
    """Scratch tensors for one chunk of images, reused by every chunk and head.

    Allocating a fresh ``(b, H, W, d)`` tensor per head and operation makes glibc's allocator map
    and fault in new pages every time, which on a CPU costs more than the products themselves;
    writing into the same few buffers keeps them resident.
    """

    def __init__(self, values: Tensor, images: int) -> None:
        _, height, width, d = values.shape
        self.columns = values.new_empty(images * height, width, d)  # attended along columns
        self.rows = values.new_empty(images, height, width * d)  # then along rows

    def attend(self, row: Tensor, col: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """``(R ⊗ C) v`` for ``row (H, H)``, ``col (W, W)``, ``v (b·H, W, d)``, ``b`` images.

        Returns ``t (b·H, W, d)``, ``t[i, k1, q2] = Σ_k2 col[q2, k2] v[i, k1, k2]``, and the result
        ``(b, H, W·d)``, ``Σ_k1 row[q1, k1] t[i, k1, q2]``; both are views of the scratch buffers.
        """
        height, width = row.shape[0], col.shape[0]
        images = v.shape[0] // height
        columns = self.columns[: images * height]
        torch.bmm(col.expand(images * height, width, width), v, out=columns)
        rows = self.rows[:images]
        torch.bmm(row.expand(images, height, height), columns.view(images, height, -1), out=rows)
        return columns, rows


class _Projection:
    """``out = bias + Σ_h attended_h @ W_hᵀ`` over the rows of one chunk, the heads given one at a
    time (``W_h``: the head's ``(out_dim, d)`` block of ``weight``).

    In float32 and float64 each head's product is added into ``out`` in place (``addmm``, counted
    by FlopCounterMode, unlike ``addmm_``). In 16 bits the heads' outputs are gathered side by side,
    ``(rows, heads·d)``, and projected by one product when the chunk ends, rounded once as
    autocast's ``Linear`` rounds: a 16-bit product per head summed in float32 ran 1.2–1.5× slower
    on an Intel Xeon with AMX (the mixed-dtype sum cost twice the product), and a 16-bit running
    sum would round once per head. The gathered buffer is ``heads`` times a chunk, bounded by the
    chunk size like the other scratch; in float32 the same gathering ran 1.7× slower."""

    def __init__(self, values: Tensor, weight: Tensor, bias: Tensor | None, rows: int) -> None:
        self.weight, self.bias, self.d = weight, bias, values.shape[-1]
        gather = values.dtype.itemsize < 4
        self.gathered = values.new_empty(rows, weight.shape[1]) if gather else None
        self.out: Tensor | None = None

    def begin(self, out: Tensor) -> None:
        """Start a chunk whose result goes to ``out (rows, out_dim)``, in the values' dtype."""
        self.out = out
        if self.gathered is None:
            out[:] = 0.0 if self.bias is None else self.bias

    def add(self, head: int, attended: Tensor) -> None:
        """Head ``head``'s attended values of the chunk, ``(rows, d)``."""
        columns = slice(head * self.d, (head + 1) * self.d)
        if self.gathered is None:
            torch.addmm(self.out, attended, self.weight[:, columns].t(), out=self.out)
        else:
            self.gathered[: attended.shape[0], columns] = attended

    def end(self) -> None:
        """Finish the chunk: in 16 bits, project the gathered heads into ``out``."""
        if self.gathered is None:
            return
        gathered = self.gathered[: self.out.shape[0]]
        if self.bias is None:
            torch.mm(gathered, self.weight.t(), out=self.out)
        else:
            torch.addmm(self.bias, gathered, self.weight.t(), out=self.out)


class _SeparableAttentionProject(torch.autograd.Function):
    """The per-head loop in either order of a chunk (``LAYOUTS``: ``_ImagesFirst``,
    ``_PixelsFirst``), autocast off within: the loops cast nothing themselves."""

    @staticmethod
    def forward(ctx, values, row, col, weight, bias, chunk_elements, layout):
        loop = _LOOPS[layout]
        with torch.autocast(values.device.type, enabled=False):
            out = loop.forward(values, row, col, weight, bias, chunk_elements)
        ctx.save_for_backward(values, row, col, weight)
        ctx.chunk_elements, ctx.loop = chunk_elements, loop
        return out

    @staticmethod
    def backward(ctx, grad_out):
        values, row, col, weight = ctx.saved_tensors
        with torch.autocast(values.device.type, enabled=False):
            grads = ctx.loop.backward(
                values, row, col, weight, grad_out, ctx.needs_input_grad, ctx.chunk_elements
            )
        return (*grads, None, None)


class _ImagesFirst:
    """The per-head loop over each chunk as it comes, ``(b, H, W, d)``."""

    @staticmethod
    def forward(
        values: Tensor,
        row: Tensor,
        col: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        chunk_elements: int,
    ):
        batch, height, width, d = values.shape
        heads, out_dim = row.shape[0], weight.shape[0]
        out = values.new_empty(batch, height * width, out_dim)
        chunks = _image_chunks(values, chunk_elements)
        scratch = _Scratch(values, chunks[0].stop)
        projection = _Projection(values, weight, bias, out[chunks[0]].view(-1, out_dim).shape[0])
        for chunk in chunks:
            v = _by_rows(values[chunk])
            projection.begin(out[chunk].view(-1, out_dim))
            for h in range(heads):
                _, attended = scratch.attend(row[h], col[h], v)
                projection.add(h, attended.view(-1, d))
            projection.end()
        return out.view(batch, height, width, out_dim)

    @staticmethod
    def backward(values, row, col, weight, grad_out, needs_grad, chunk_elements):
        batch, height, width, d = values.shape
        heads, out_dim = row.shape[0], weight.shape[0]
        grad_out = grad_out.reshape(batch, height * width, out_dim).to(values.dtype)
        grad_values = torch.zeros_like(values) if needs_grad[0] else None
        grad_row = torch.zeros_like(row) if needs_grad[1] else None
        grad_col = torch.zeros_like(col) if needs_grad[2] else None
        grad_weight = weight.new_zeros(heads, out_dim, d) if needs_grad[3] else None
        chunks = _image_chunks(values, chunk_elements)
        scratch = _Scratch(values, chunks[0].stop)
        grad_attended = scratch.rows.new_empty(scratch.rows.shape)  # (b, H, W·d), reused
        grad_columns = scratch.rows.new_empty(scratch.rows.shape)
        for chunk in chunks:
            images = chunk.stop - chunk.start
            grad_out_chunk = grad_out[chunk].view(-1, out_dim)
            v, grad_v = _by_rows(values[chunk]), None
            if grad_values is not None:
                grad_v = _by_rows(grad_values[chunk])
            for h in range(heads):
                w = weight[:, h * d : (h + 1) * d]  # (out, d)
                t, attended = scratch.attend(row[h], col[h], v)  # recomputed, not stored
                if grad_weight is not None:
                    gw = grad_weight[h]
                    torch.addmm(gw, grad_out_chunk.t(), attended.view(-1, d), out=gw)
                g = grad_attended[:images]  # d loss / d attended
                torch.mm(grad_out_chunk, w, out=g.view(-1, d))
                if grad_row is not None:
                    # d/d row[q1, k1] = Σ_{b, q2, c} g[b, q1, q2, c] t[b, k1, q2, c]
                    t_rows = t.view(images, height, width * d).transpose(1, 2)
                    grad_row[h] += torch.bmm(g, t_rows).sum(0)
                # u = Rᵀ g: the gradient of the column-attended values t.
                u = grad_columns[:images]
                torch.bmm(row[h].t().expand(images, height, height), g, out=u)
                u = u.view(images * height, width, d)
                if grad_col is not None:
                    # d/d col[q2, k2] = Σ_{b, k1, c} u[b, k1, q2, c] v[b, k1, k2, c]
                    grad_col[h] += torch.bmm(u, v.transpose(1, 2)).sum(0)
                if grad_v is not None:
                    grad_v.baddbmm_(col[h].t().expand(images * height, width, width), u)
        if grad_weight is not None:  # (heads, out, d) → (out, heads·d)
            grad_weight = grad_weight.permute(1, 0, 2).reshape(out_dim, heads * d)
        grad_bias = grad_out.sum((0, 1)) if needs_grad[4] else None
        return grad_values, grad_row, grad_col, grad_weight, grad_bias


def _pixels_first(values: Tensor, buffer: Tensor) -> Tensor:
    """``values (b, H, W, c)`` copied pixels first into the start of the flat ``buffer``; returns
    that copy as ``(H, W, b·c)``."""
    batch, height, width, c = values.shape
    copy = buffer[: values.numel()].view(height, width, batch, c)
    copy.copy_(values.permute(1, 2, 0, 3))
    return copy.view(height, width, batch * c)


def _chunk_buffer(values: Tensor, chunks: list[slice], channels: int,
                  dtype: torch.dtype | None = None) -> Tensor:
    """A flat buffer for ``channels`` numbers per pixel of the largest (the first) of ``chunks``,
    reused by every chunk: fresh pages per chunk cost the allocator's page faults
    (``_Scratch``)."""
    _, height, width, _ = values.shape
    pixels = (chunks[0].stop - chunks[0].start) * height * width
    return values.new_empty(pixels * channels, dtype=dtype)


class _PixelsFirst:
    """The per-head loop with each chunk of images held pixels first (module docstring)."""

    @staticmethod
    def forward(values, row, col, weight, bias, chunk_elements):
        batch, height, width, d = values.shape
        heads, out_dim = row.shape[0], weight.shape[0]
        out = values.new_empty(batch, height, width, out_dim)
        chunks = _image_chunks(values, chunk_elements)
        pixels_first = _chunk_buffer(values, chunks, d)  # the chunk, (H, W, b·d)
        columns = _chunk_buffer(values, chunks, d)  # (H, W, b·d)
        attended = _chunk_buffer(values, chunks, d)  # (H, W·b·d) = (N·b, d), pixels first
        projected = _chunk_buffer(values, chunks, out_dim)  # (N·b, out), pixels first
        projection = _Projection(values, weight, bias, projected.numel() // out_dim)
        for chunk in chunks:
            v = _pixels_first(values[chunk], pixels_first)
            rows = height * width * (chunk.stop - chunk.start)
            t, y = columns[: rows * d].view(v.shape), attended[: rows * d]
            o = projected[: rows * out_dim].view(rows, out_dim)
            projection.begin(o)
            for h in range(heads):
                # t[k1, q2, (b, c)] = Σ_k2 col[q2, k2] v[k1, k2, (b, c)]
                torch.bmm(col[h].expand(height, width, width), v, out=t)
                # y[q1, (q2, b, c)] = Σ_k1 row[q1, k1] t[k1, (q2, b, c)]
                torch.mm(row[h], t.view(height, -1), out=y.view(height, -1))
                projection.add(h, y.view(rows, d))
            projection.end()
            out[chunk] = o.view(height, width, -1, out_dim).permute(2, 0, 1, 3)
        return out

    @staticmethod
    def backward(values, row, col, weight, grad_out, needs_grad, chunk_elements):
        _, height, width, d = values.shape
        heads, out_dim = row.shape[0], weight.shape[0]
        grad_out = grad_out.to(values.dtype)
        grad_values = torch.empty_like(values) if needs_grad[0] else None
        grad_row = torch.zeros_like(row) if needs_grad[1] else None
        grad_col = torch.zeros_like(col) if needs_grad[2] else None
        grad_weight = weight.new_zeros(heads, out_dim, d) if needs_grad[3] else None
        chunks = _image_chunks(values, chunk_elements)
        # the chunk and its output's gradient pixels first, and t, y, d/dy, d/dt, d/dv
        pixels_first, grad_out_first = (_chunk_buffer(values, chunks, c) for c in (d, out_dim))
        t_flat, y_flat, g_flat, u_flat = (_chunk_buffer(values, chunks, d) for _ in range(4))
        grad_v_flat = None if grad_values is None else _chunk_buffer(values, chunks, d)
        for chunk in chunks:
            v = _pixels_first(values[chunk], pixels_first)  # (H, W, b·d)
            g_out = _pixels_first(grad_out[chunk], grad_out_first).view(-1, out_dim)  # (N·b, out)
            rows = g_out.shape[0]
            t = t_flat[: rows * d].view(v.shape)
            y, g, u = (flat[: rows * d].view(height, -1) for flat in (y_flat, g_flat, u_flat))
            grad_v = None if grad_v_flat is None else grad_v_flat[: rows * d].view(v.shape).zero_()
            for h in range(heads):
                w = weight[:, h * d : (h + 1) * d]  # (out, d)
                torch.bmm(col[h].expand(height, width, width), v, out=t)  # recomputed
                torch.mm(row[h], t.view(height, -1), out=y)
                if grad_weight is not None:
                    gw = grad_weight[h]
                    torch.addmm(gw, g_out.t(), y.view(rows, d), out=gw)
                torch.mm(g_out, w, out=g.view(rows, d))  # d loss / d y
                if grad_row is not None:
                    # d/d row[q1, k1] = Σ_{q2, b, c} g[q1, (q2, b, c)] t[k1, (q2, b, c)]
                    grad_row[h] += g @ t.view(height, -1).t()
                torch.mm(row[h].t(), g, out=u)  # d loss / d t
                u3 = u.view(height, width, -1)
                if grad_col is not None:
                    # d/d col[q2, k2] = Σ_{k1, b, c} u[k1, q2, (b, c)] v[k1, k2, (b, c)]
                    grad_col[h] += torch.bmm(u3, v.transpose(1, 2)).sum(0)
                if grad_v is not None:
                    grad_v.baddbmm_(col[h].t().expand(height, width, width), u3)
            if grad_values is not None:
                images = chunk.stop - chunk.start
                grad_values[chunk] = grad_v.view(height, width, images, d).permute(2, 0, 1, 3)
        if grad_weight is not None:  # (heads, out, d) → (out, heads·d)
            grad_weight = grad_weight.permute(1, 0, 2).reshape(out_dim, heads * d)
        grad_bias = grad_out.sum((0, 1, 2)) if needs_grad[4] else None
        return grad_values, grad_row, grad_col, grad_weight, grad_bias


_LOOPS = {"images": _ImagesFirst, "pixels": _PixelsFirst}
"""The loop of each of ``LAYOUTS``."""


def _autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype autocast runs matrix products in on ``device_type`` now, or ``None`` when off."""
    if hasattr(torch, "get_autocast_dtype"):  # torch >= 2.4
        enabled = torch.is_autocast_enabled(device_type)
        return torch.get_autocast_dtype(device_type) if enabled else None
    if device_type == "cpu":
        return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else None
    return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() else None


def separable_attention_project(
    values: Tensor,
    row: Tensor,
    col: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    chunk_elements: int | None = None,
    layout: str = "images",
) -> Tensor:
    r"""$\sum_h (R^h \otimes C^h) \, x W_h^\top + \text{bias}$ for every image, without a per-head
    activation tensor.

    Args:
        values: ``(B, H, W, d)``, attended over by every head.
        row: ``(heads, H, H)`` row factors, ``row[h, q1, k1]`` the weight of key row ``k1``.
        col: ``(heads, W, W)`` column factors.
        weight: ``(out_dim, heads·d)``, head ``h`` owning columns ``h·d … (h+1)·d − 1``.
        bias: ``(out_dim,)`` or ``None``.
        chunk_elements: at most this many values of one head per chunk of images (or one image);
            default ``CHUNK_ELEMENTS``.
        layout: the order a chunk is attended in, ``"images"`` (as it comes) or ``"pixels"``
            (copied pixels first; module docstring).

    Returns:
        ``(B, H, W, out_dim)``. All arguments are cast to one dtype: autocast's when it is on
        (the sum over heads still accumulates in float32), else that of ``values``.
    """
    dtype = _autocast_dtype(values.device.type) or values.dtype
    values = values.to(dtype).contiguous()
    cast = [None if t is None else t.to(dtype) for t in (row, col, weight, bias)]
    chunk_elements = CHUNK_ELEMENTS if chunk_elements is None else chunk_elements
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return _SeparableAttentionProject.apply(values, *cast, chunk_elements, layout)
