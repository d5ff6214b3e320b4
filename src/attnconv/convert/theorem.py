"""Theorem 1 as code: a convolution computed exactly by multi-head self-attention.

Construction (design.md §1). A convolution with a ``Kh×Kw`` kernel becomes a
:class:`~attnconv.MultiHeadSelfAttention2d` with one head per kernel tap ``(i, j)``:

* **Padding.** The input is padded exactly as the convolution pads it (zeros, or circular
  wrap-around; ``padding="same"`` pads ``⌊d(K−1)/2⌋`` before and the rest after, as PyTorch does),
  so a query near the border attends a padding token exactly where the convolution reads one.
* **Positions.** On the padded image the convolution's output pixel ``(r, c)`` reads tap ``(i, j)``
  at ``(r·stride + i·dilation, c·stride + j·dilation)``. The attention query for that output is the
  pixel ``(r·stride + a, c·stride + b)`` with ``a = ⌊(Kh−1)/2⌋·dilation`` (``b`` likewise, the
  kernel's centre tap), and head ``(i, j)`` has the quadratic score centred on
  ``Δ = (i·dilation − a, j·dilation − b)``, integers. With ``hard=True`` (the ``s → ∞`` limit) its
  attention is one-hot on ``q + Δ``; with a finite spread ``s`` it is a Gaussian of inverse std
  ``s`` around it, and the construction converges to the convolution as ``s`` grows.
* **Weights.** Each head attends over the raw input (``head_dim = in_channels``, no value
  projection) and the output projection holds the taps: the block of ``out.weight`` for head
  ``(i, j)`` is ``W_conv[:, :, i, j]`` (block-diagonal over groups), ``out.bias`` is the conv bias.
  This is the cheaper of the two factorisations ``W_val W_out`` allows: with a value projection
  to ``heads·Cout`` channels, ``out`` (the sum over heads) still costs ``K²·Cout·Cout``
  multiply-adds per pixel on top of the same ``K²·Cin·Cout`` of the value projection. It is
  also uniform: ``head_dim = dim`` always means no value projection, whereas ``head_dim = Cout``
  would lose its value projection (the layer has none when ``head_dim == dim``) if Cin == Cout.
* **Output.** The attention output is taken at the query pixels above (every ``stride``-th one).

The kernel is stored once: ``out.weight`` is a parametrization (``torch.nn.utils.parametrize``)
of a copy of the convolution's own ``(out, in/groups, Kh, Kw)`` kernel, so the gradient reaching
``AttentionConv.weight`` is the gradient with respect to the convolution's weights, and the
attention layer stays a complete, standalone ``MultiHeadSelfAttention2d`` (``attention_to_conv``
reads the kernel back out of it).

Speed: with hard attention the module applies the layer's one-hot factors as shifted slices of the
padded input (each head's keys sit at a constant offset from its queries) for the queried pixels
only, instead of the layer's ``H×H`` and ``W×W`` products over every pixel; the result is the
same since each factor row holds a single exact 1 (checked each forward; otherwise, with a finite
spread, or with ``attention.impl = "dense"``, the layer's own forward runs). Only the dense
reference builds an ``N×N`` matrix.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import parametrize

from attnconv.attention import MultiHeadSelfAttention2d
from attnconv.attention.scores import hard_gaussian_factors

SUPPORTED_PADDING_MODES: tuple[str, ...] = ("zeros", "circular")


class KernelToOutWeight(nn.Module):
    """Parametrization ``kernel → out.weight (Cout, Kh·Kw·Cin)`` of the layer's output projection.

    ``kernel`` has the convolution's own shape, ``(Cout, Cin/groups, Kh, Kw)`` or
    ``(Cout, Cin/groups, K)`` for a 1-D convolution (``Kh = 1``). Column ``h·Cin + c`` of the output
    weight, for head ``h = i·Kw + j``, holds ``kernel[:, c − g·Cin/groups, i, j]`` for the output
    channels of group ``g`` that reads input channel ``c``, and zero for the other groups
    (block-diagonal over groups). ``right_inverse`` reads the kernel back from the diagonal blocks.
    """

    def __init__(self, kernel_shape: tuple[int, ...], groups: int) -> None:
        super().__init__()
        self.kernel_shape, self.groups = tuple(kernel_shape), groups

    def forward(self, kernel: Tensor) -> Tensor:
        out_channels, in_per_group, *taps = self.kernel_shape
        kh, kw = _as_2d(tuple(taps))
        g = self.groups
        full = kernel.reshape(out_channels, in_per_group, kh, kw)
        if g > 1:
            blocks = full.view(g, out_channels // g, 1, in_per_group, kh, kw)
            eye = torch.eye(g, dtype=kernel.dtype, device=kernel.device)
            full = (blocks * eye[:, None, :, None, None, None]).reshape(
                out_channels, g * in_per_group, kh, kw
            )
        return full.permute(0, 2, 3, 1).reshape(out_channels, -1)

    def right_inverse(self, weight: Tensor) -> Tensor:
        out_channels, _, *taps = self.kernel_shape
        kh, kw = _as_2d(tuple(taps))
        g = self.groups
        full = weight.view(out_channels, kh, kw, -1).permute(0, 3, 1, 2)
        blocks = full.reshape(g, out_channels // g, g, -1, kh, kw).diagonal(dim1=0, dim2=2)
        return blocks.permute(4, 0, 1, 2, 3).reshape(self.kernel_shape)


class AttentionConv(nn.Module):
    """A ``Conv1d``/``Conv2d`` computed through :class:`MultiHeadSelfAttention2d` (Theorem 1).

    Build it with :func:`conv_to_attention`. Input and output have the convolution's layout:
    ``(B, in_channels, H, W) → (B, out_channels, H_out, W_out)`` for a ``Conv2d`` and
    ``(B, in_channels, L) → (B, out_channels, L_out)`` for a ``Conv1d`` (an image with ``H = 1``
    and ``K`` heads).

    Attributes: ``attention`` (the layer: ``Kh·Kw`` heads, ``centers`` = tap offsets in pixels,
    ``spread``, ``out.weight`` parametrized by the kernel), ``weight`` (the kernel, shaped as the
    convolution's), ``bias`` (``(out,)`` or ``None``) and
    the convolution's hyper-parameters (``kernel_size``, ``stride``, ``padding``, ``dilation``,
    ``groups``, ``padding_mode``), as on the original module.
    """

    def __init__(self, conv: nn.Conv1d | nn.Conv2d, spread: float | None = None) -> None:
        super().__init__()
        _check_conv(conv)
        if spread is not None:
            if isinstance(spread, bool) or not isinstance(spread, (int, float)):
                raise TypeError(f"spread must be a float or None (hard attention), got {spread!r}")
            if not (math.isfinite(spread) and spread > 0):
                raise ValueError(f"spread must be a positive finite number, got {spread}")
        self.one_d = isinstance(conv, nn.Conv1d)
        self.in_channels, self.out_channels = conv.in_channels, conv.out_channels
        self.kernel_size, self.stride = conv.kernel_size, conv.stride
        self.padding, self.dilation = conv.padding, conv.dilation
        self.groups, self.padding_mode = conv.groups, conv.padding_mode
        self.spread = None if spread is None else float(spread)

        # Per axis (row, col): kernel size, stride, dilation, padding (before, after).
        kernel, stride, dilation = (
            _as_2d(v) for v in (conv.kernel_size, conv.stride, conv.dilation)
        )
        self._kernel, self._stride, self._dilation = kernel, stride, dilation
        padding = conv.padding
        if self.one_d:  # no padding along the single row
            padding = ("valid", padding if isinstance(padding, str) else padding[0])
        self._pads = tuple(
            _axis_padding(padding, k, d, axis)
            for axis, (k, d) in enumerate(zip(kernel, dilation, strict=True))
        )
        # Query offset of each output pixel inside its receptive field: the centre tap.
        self._anchor = tuple((k - 1) // 2 * d for k, d in zip(kernel, dilation, strict=True))

        heads = kernel[0] * kernel[1]
        weight = conv.weight.detach()
        layer = MultiHeadSelfAttention2d(
            conv.in_channels,
            heads,
            positional="gaussian",
            out_dim=conv.out_channels,
            hard=spread is None,
        ).to(device=weight.device, dtype=weight.dtype)
        if conv.bias is None:
            layer.out.bias = None
        taps = torch.cartesian_prod(
            torch.arange(kernel[0], dtype=weight.dtype, device=weight.device),
            torch.arange(kernel[1], dtype=weight.dtype, device=weight.device),
        ).reshape(heads, 2)
        with torch.no_grad():
            layer.centers.copy_(
                taps * torch.tensor(dilation, dtype=weight.dtype, device=weight.device)
                - torch.tensor(self._anchor, dtype=weight.dtype, device=weight.device)
            )
            layer.spread.fill_(1.0 if spread is None else spread)  # hard heads ignore it
            if conv.bias is not None:
                layer.out.bias.copy_(conv.bias)
            to_out = KernelToOutWeight(weight.shape, conv.groups)
            layer.out.weight.copy_(to_out(weight))
        parametrize.register_parametrization(layer.out, "weight", to_out)
        self.attention = layer
        self.weight.requires_grad_(conv.weight.requires_grad)
        if conv.bias is not None:
            self.bias.requires_grad_(conv.bias.requires_grad)

    @property
    def weight(self) -> Tensor:
        """The convolution kernel (the conv's shape): the parameter behind ``attention.out.weight``."""
        return self.attention.out.parametrizations.weight.original

    @property
    def bias(self) -> Tensor | None:
        """The convolution bias ``(out,)`` (the attention layer's output bias) or ``None``."""
        return self.attention.out.bias

    @property
    def heads(self) -> int:
        return self.attention.heads

    def extra_repr(self) -> str:
        kind = "Conv1d" if self.one_d else "Conv2d"
        regime = "hard" if self.spread is None else f"spread={self.spread:g}"
        return (
            f"{kind}({self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}, padding={self.padding}, dilation={self.dilation}, "
            f"groups={self.groups}, bias={self.bias is not None}, "
            f"padding_mode={self.padding_mode!r}), heads={self.heads}, {regime}"
        )

    # ------------------------------------------------------------------ forward

    def padded_size(self, height: int, width: int) -> tuple[int, int]:
        """Size of the padded image the attention runs on, for an ``H×W`` input."""
        (top, bottom), (left, right) = self._pads
        return height + top + bottom, width + left + right

    def output_size(self, height: int, width: int) -> tuple[int, int]:
        """``(H_out, W_out)`` for an ``H×W`` input, as the convolution computes it."""
        sizes = self.padded_size(height, width)
        return tuple(
            (n - d * (k - 1) - 1) // s + 1
            for n, k, s, d in zip(sizes, self._kernel, self._stride, self._dilation, strict=True)
        )

    def forward(self, x: Tensor) -> Tensor:
        """``x (B, in, H, W)`` (``(B, in, L)`` for a 1-D conv) → ``(B, out, H_out, W_out)``."""
        height, width = self._check_input(x)
        if self.one_d:
            x = x.unsqueeze(2)
        (top, bottom), (left, right) = self._pads
        if top or bottom or left or right:
            mode = "circular" if self.padding_mode == "circular" else "constant"
            x = F.pad(x, (left, right, top, bottom), mode=mode)
        out_h, out_w = self.output_size(height, width)
        rows = torch.arange(out_h, device=x.device) * self._stride[0] + self._anchor[0]
        cols = torch.arange(out_w, device=x.device) * self._stride[1] + self._anchor[1]
        y = self._hard_shift(x, rows, cols)
        if y is None:
            y = self.attention(x.permute(0, 2, 3, 1))  # (B, Hp, Wp, out)
            y = y.index_select(1, rows).index_select(2, cols).permute(0, 3, 1, 2)
        y = y.contiguous()  # a drop-in for the conv: callers may .view() its output
        return y.squeeze(2) if self.one_d else y

    def _hard_shift(self, x: Tensor, rows: Tensor, cols: Tensor) -> Tensor | None:
        """Hard attention applied as shifted slices: ``(B, out, H_out, W_out)``, or None.

        For query ``q`` head ``h`` attends the single key where its row factor ``R^h[q1]`` and
        column factor ``C^h[q2]`` hold a 1, so its output is that key's vector. When every factor
        row of the queried pixels is exactly one-hot and the keys move with the queries (a constant
        offset per head, as for every converted convolution) the keys of a head are one strided
        slice of the padded input; the layer's output projection (the taps) is then applied to the
        concatenated head outputs. Returns None (use the layer's forward) otherwise.
        """
        layer = self.attention
        if not layer.hard or layer.impl != "auto" or (layer.training and layer.dropout > 0):
            return None
        row, col = hard_gaussian_factors(layer.centers, x.shape[2], x.shape[3])
        row_max, row_key = row.index_select(1, rows).max(dim=-1)  # (heads, H_out)
        col_max, col_key = col.index_select(1, cols).max(dim=-1)  # (heads, W_out)
        row_shift, col_shift = row_key - rows, col_key - cols
        if not (
            bool((row_max == 1).all() and (col_max == 1).all())
            and bool(
                (row_shift == row_shift[:, :1]).all() and (col_shift == col_shift[:, :1]).all()
            )
        ):
            return None
        (sh, sw), (out_h, out_w) = self._stride, (rows.numel(), cols.numel())
        pixels = x.permute(0, 2, 3, 1)  # (B, Hp, Wp, C)
        heads_out = [
            pixels[:, r : r + (out_h - 1) * sh + 1 : sh, c : c + (out_w - 1) * sw + 1 : sw]
            for r, c in zip(row_key[:, 0].tolist(), col_key[:, 0].tolist(), strict=True)
        ]
        features = torch.stack(heads_out, dim=3).flatten(3)  # (B, H_out, W_out, heads·C)
        return layer.out(features).permute(0, 3, 1, 2)

    def _check_input(self, x: Tensor) -> tuple[int, int]:
        layout = "(B, C, L)" if self.one_d else "(B, C, H, W)"
        if not isinstance(x, Tensor):
            raise TypeError(f"expected a torch.Tensor of shape {layout}, got {type(x).__name__}")
        if x.dim() != (3 if self.one_d else 4) or x.shape[1] != self.in_channels:
            raise ValueError(
                f"expected input of shape {layout} with C={self.in_channels}, got shape "
                f"{tuple(x.shape)}"
            )
        if x.dtype != self.weight.dtype:
            raise TypeError(
                f"expected input dtype {self.weight.dtype} (the module's), got {x.dtype}"
            )
        height, width = (1, x.shape[2]) if self.one_d else (x.shape[2], x.shape[3])
        padded = self.padded_size(height, width)
        for axis, n, n_pad, k, d, (before, after) in zip(
            ("height", "width"),
            (height, width),
            padded,
            self._kernel,
            self._dilation,
            self._pads,
            strict=True,
        ):
            if n_pad < d * (k - 1) + 1:
                raise ValueError(
                    f"input {axis} {n} (padded {n_pad}) is smaller than the dilated kernel "
                    f"{d * (k - 1) + 1}"
                )
            if self.padding_mode == "circular" and max(before, after) > n:
                raise ValueError(
                    f"circular padding of {max(before, after)} needs an input {axis} of at least "
                    f"that, got {n}"
                )
        return height, width


def conv_to_attention(conv: nn.Conv1d | nn.Conv2d, spread: float | None = None) -> AttentionConv:
    """Turn a convolution into multi-head self-attention that computes the same function.

    Args:
        conv: an ``nn.Conv2d`` or ``nn.Conv1d``: any kernel size, stride, dilation, zero padding
            (ints, ``"same"``, ``"valid"``), ``padding_mode`` ``"zeros"`` or ``"circular"``, bias or
            none, any ``groups`` (depthwise included).
        spread: ``None`` for hard attention (the exact ``s → ∞`` limit), or a finite inverse
            standard deviation ``s`` (in 1/pixels) shared by all heads; the error against the
            convolution falls like ``exp(−s²/2)``.
    Returns:
        An :class:`AttentionConv` with the convolution's layout, on its device and dtype; its
        kernel and bias are copies of the convolution's (trainable, the parameters of the attention).
    """
    return AttentionConv(conv, spread)


def _check_conv(conv: object) -> None:
    if not isinstance(conv, (nn.Conv1d, nn.Conv2d)):
        raise TypeError(f"expected an nn.Conv1d or nn.Conv2d, got {type(conv).__name__}")
    if isinstance(conv.weight, nn.parameter.UninitializedParameter):
        raise ValueError(
            f"{type(conv).__name__} has uninitialized (lazy) parameters; run one forward first"
        )
    if conv.padding_mode not in SUPPORTED_PADDING_MODES:
        raise ValueError(
            f"padding_mode {conv.padding_mode!r} is not supported; supported: "
            f"{', '.join(SUPPORTED_PADDING_MODES)}"
        )


def _as_2d(value: tuple[int, ...]) -> tuple[int, int]:
    """A conv hyper-parameter as (row, col); a 1-D conv is a single-row image."""
    return (1, value[0]) if len(value) == 1 else (value[0], value[1])


def _axis_padding(padding: str | tuple, kernel: int, dilation: int, axis: int) -> tuple[int, int]:
    """``(before, after)`` padding of one axis, as PyTorch pads it."""
    spec = padding if isinstance(padding, str) else padding[axis]
    if spec == "valid":
        return 0, 0
    if spec == "same":
        total = dilation * (kernel - 1)
        return total // 2, total - total // 2
    return spec, spec
