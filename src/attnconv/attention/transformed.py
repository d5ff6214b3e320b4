"""``TransformedConv2d``: multi-head self-attention in a convolution's layout, started as the
convolution and free to learn (T-CNN, docs/transform.md).

Theorem 1's construction (docs/theory.md §2) gives a ``Kh×Kw`` convolution ``Kh·Kw`` heads, one
per kernel tap ``(i, j)``, each attending around ``q + Δ_h`` with ``Δ_h = (i·dh − a, j·dw − b)``
(``(a, b)`` the centre tap, ``d`` the dilation) and the head's block of the output projection equal
to the tap's ``W_conv[:, :, i, j]``. This layer is that construction made trainable:

* **Positional attention** (each head ``h``): the isotropic Gaussian score ``−½ s_h² ‖δ − Δ_h‖²``
  over the keys of the input padded as the convolution pads it, with trainable centres ``Δ_h``
  (``position.centers (heads, 2)``, pixels) and inverse standard deviations ``s_h``
  (``position.spread (heads,)``, 1/pixels). With a finite spread it computes a blurred version of
  the convolution; the error falls like ``exp(−s²/2)``.
* **Content attention, gated** (``content=True``): ``P_c^h = softmax(q_h·k_h / √d)`` over the
  image's pixels (queries from the input at the receptive field's centre tap, keys from every
  input pixel), mixed in per head as ConViT's gated positional self-attention mixes it:
  ``P^h = (1 − g_h) P_pos^h + g_h P_c^h``. The gate ``g_h = clamp(gate_h, 0, 1)`` starts at exactly
  zero, so the layer starts as the convolution (with spread ``s``) on every input; it is a
  straight-through clamp (the gradient passes as if unclamped), so a head whose gate the first
  steps push below zero can open again. Why this form (docs/transform.md, "The content term"):
  the content softmax is not saturated by the sharp positional one (a term ``q·k`` *added to* the
  Gaussian logits would be, and learn at ``e^{−s²/2}`` of the rate); the gate's gradient,
  ``⟨∂L/∂y_h, W_h (P_c^h − P_pos^h) x⟩``, is of the order of the layer's output from step 0.
* **Values and output** as in the construction: every head attends over the raw input (no value
  projection) and ``weight (out, in/groups, Kh, Kw)``, in the convolution's own layout, holds each
  head's block of the output projection (block-diagonal over ``groups``); ``bias (out,)``.

The output is read at the convolution's output pixels only: the queries are the receptive
fields' centre taps ``(r·sh + a, c·sw + b)`` of the padded input, so the positional attention
factors as ``R^h (H_out, H_pad) ⊗ C^h (W_out, W_pad)`` and costs ``O(heads·(H_out·H_pad·W_pad +
H_out·W_out·W_pad))`` per channel; no ``N×N`` matrix is built. Shapes: input ``(B, in, H, W)``,
output ``(B, out, H_out, W_out)`` as the convolution computes them.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnconv.attention.positional import GaussianScore
from attnconv.attention.scores import gaussian_axis_logits, softmax_without_subnormals

PADDING_MODES: tuple[str, ...] = ("zeros", "circular", "reflect", "replicate")


def _pair(value: int | tuple[int, ...] | list[int], name: str) -> tuple[int, int]:
    pair = (value, value) if isinstance(value, int) and not isinstance(value, bool) else value
    pair = tuple(pair)
    if len(pair) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in pair):
        raise ValueError(f"{name} must be an int or a pair of ints, got {value!r}")
    return pair


def conv_padding(conv: nn.Conv2d) -> tuple[tuple[int, int], tuple[int, int]]:
    """``((top, bottom), (left, right))``: how ``conv`` pads its input, as PyTorch pads it
    (``"same"`` puts ``⌊d(K−1)/2⌋`` before and the rest after)."""
    pads = []
    for axis in range(2):
        spec = conv.padding if isinstance(conv.padding, str) else conv.padding[axis]
        total = conv.dilation[axis] * (conv.kernel_size[axis] - 1)
        if spec == "valid":
            pads.append((0, 0))
        elif spec == "same":
            pads.append((total // 2, total - total // 2))
        else:
            pads.append((spec, spec))
    return pads[0], pads[1]


class TransformedConv2d(nn.Module):
    """A ``Conv2d`` recast as trainable multi-head self-attention (see the module docstring).

    Args:
        in_channels, out_channels, kernel_size, stride, dilation, groups, bias, padding_mode: as
            for ``nn.Conv2d`` (``kernel_size``, ``stride``, ``dilation``: an int or ``(rows,
            cols)``); ``Kh·Kw`` heads.
        padding: ``((top, bottom), (left, right))`` pixels, as the convolution pads its input.
        spread: the heads' initial inverse standard deviation ``s`` (1/pixels).
        content: add the gated content attention.
        qk_dim: width of each head's queries and keys; default ``max(1, in_channels // heads)``.

    Parameters: ``weight``, ``bias``, ``position.centers``, ``position.spread`` and, with content,
    ``query``/``key`` (``Linear(in, heads·qk_dim)``) and ``gate (heads,)``. A fresh layer starts
    on the taps with zero gates; ``attnconv.transform`` copies a trained convolution in.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        stride: int | tuple[int, int] = 1,
        padding: tuple[tuple[int, int], tuple[int, int]] = ((0, 0), (0, 0)),
        dilation: int | tuple[int, int] = 1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        spread: float = 4.0,
        content: bool = True,
        qk_dim: int | None = None,
        content_heads: int = 1,
    ) -> None:
        super().__init__()
        kernel = _pair(kernel_size, "kernel_size")
        stride, dilation = _pair(stride, "stride"), _pair(dilation, "dilation")
        try:
            pads = tuple(_pair(tuple(axis), "padding") for axis in padding)
        except TypeError:
            pads = ()
        if len(pads) != 2 or any(p < 0 for axis in pads for p in axis):
            raise ValueError(
                f"padding must be ((top, bottom), (left, right)) non-negative ints, got {padding!r}"
            )
        for name, value in (
            ("in_channels", in_channels),
            ("out_channels", out_channels),
            ("groups", groups),
            *(("kernel_size", k) for k in kernel),
            *(("stride", s) for s in stride),
            *(("dilation", d) for d in dilation),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if in_channels % groups or out_channels % groups:
            raise ValueError(
                f"in_channels ({in_channels}) and out_channels ({out_channels}) must be "
                f"divisible by groups ({groups})"
            )
        if padding_mode not in PADDING_MODES:
            raise ValueError(f"padding_mode must be one of {PADDING_MODES}, got {padding_mode!r}")
        if isinstance(spread, bool) or not isinstance(spread, (int, float)) or not (
            math.isfinite(spread) and spread > 0
        ):
            raise ValueError(f"spread must be a positive finite number, got {spread!r}")
        heads = kernel[0] * kernel[1]
        if isinstance(content_heads, bool) or not isinstance(content_heads, int) or not (
            1 <= content_heads <= heads
        ):
            raise ValueError(
                f"content_heads must be an int from 1 to the {heads} heads, got {content_heads!r}"
            )
        if qk_dim is None:
            qk_dim = max(4, in_channels // (4 * content_heads))
        if content and (isinstance(qk_dim, bool) or not isinstance(qk_dim, int) or qk_dim < 1):
            raise ValueError(f"qk_dim must be a positive int, got {qk_dim!r}")

        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.stride, self.dilation = kernel, stride, dilation
        self.padding, self.groups, self.padding_mode = pads, groups, padding_mode
        self.content, self.qk_dim = bool(content), qk_dim if content else None
        self.content_heads = content_heads if content else None
        self.heads = heads
        self.start_spread = float(spread)
        # The query of each output pixel sits on its receptive field's centre tap.
        self.anchor = tuple((k - 1) // 2 * d for k, d in zip(kernel, dilation, strict=True))
        self.position = GaussianScore(heads)
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels // groups, *kernel))
        self.bias = nn.Parameter(torch.empty(out_channels)) if bias else None
        self.query = self.key = self.gate = None
        if content:
            self.query = nn.Linear(in_channels, content_heads * qk_dim)
            self.key = nn.Linear(in_channels, content_heads * qk_dim)
            self.gate = nn.Parameter(torch.zeros(heads))
        self.reset_parameters(float(spread))

    @torch.no_grad()
    def reset_parameters(self, spread: float) -> None:
        """Heads on the taps with inverse std ``spread``, gates at zero, the output projection and
        bias as ``nn.Conv2d`` starts its kernel and bias (queries and keys as ``nn.Linear``)."""
        self.position.centers.copy_(self.tap_offsets())
        self.position.spread.fill_(spread)
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in = self.weight[0].numel()
            nn.init.uniform_(self.bias, -(fan_in**-0.5), fan_in**-0.5)
        if self.gate is not None:
            self.gate.zero_()
            self.query.reset_parameters()
            self.key.reset_parameters()

    @classmethod
    def from_conv(
        cls,
        conv: nn.Conv2d,
        spread: float = 4.0,
        content: bool = True,
        qk_dim: int | None = None,
        content_heads: int = 1,
    ) -> TransformedConv2d:
        """The layer of ``conv``'s shape with its kernel and bias copied in (Theorem 1's
        construction with spread ``spread``), gates at zero, on ``conv``'s device and dtype.

        ``conv`` is a plain ``nn.Conv2d``: any kernel size, stride, dilation, groups, padding
        (ints, ``"same"``, ``"valid"``) and padding mode. Its own forward is assumed (subclasses,
        hooks and parametrizations are the caller's to refuse: ``attnconv.transform`` does).
        """
        if not isinstance(conv, nn.Conv2d):
            raise TypeError(f"expected an nn.Conv2d, got {type(conv).__name__}")
        layer = cls(
            conv.in_channels,
            conv.out_channels,
            conv.kernel_size,
            conv.stride,
            conv_padding(conv),
            conv.dilation,
            conv.groups,
            conv.bias is not None,
            conv.padding_mode,
            spread=spread,
            content=content,
            qk_dim=qk_dim,
            content_heads=content_heads,
        ).to(device=conv.weight.device, dtype=conv.weight.dtype)
        with torch.no_grad():
            layer.weight.copy_(conv.weight)
            if conv.bias is not None:
                layer.bias.copy_(conv.bias)
        layer.weight.requires_grad_(conv.weight.requires_grad)
        if conv.bias is not None:
            layer.bias.requires_grad_(conv.bias.requires_grad)
        return layer

    def tap_offsets(self) -> Tensor:
        """``(heads, 2)`` offsets (row, col) of the kernel taps from the centre tap, in pixels:
        where Theorem 1 puts each head (head ``i·Kw + j`` on tap ``(i, j)``)."""
        (kh, kw), (dh, dw), (a, b) = self.kernel_size, self.dilation, self.anchor
        rows = torch.arange(kh) * dh - a
        cols = torch.arange(kw) * dw - b
        return torch.cartesian_prod(rows, cols).to(self.position.centers)

    def arguments(self) -> dict:
        """The constructor arguments that rebuild this layer's shape (plain values)."""
        return {
            "in_channels": self.in_channels,
            "out_channels": self.out_channels,
            "kernel_size": self.kernel_size,
            "stride": self.stride,
            "padding": self.padding,
            "dilation": self.dilation,
            "groups": self.groups,
            "bias": self.bias is not None,
            "padding_mode": self.padding_mode,
            "content": self.content,
            "qk_dim": self.qk_dim,
            "content_heads": self.content_heads or 1,
        }

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}, padding={self.padding}, dilation={self.dilation}, "
            f"groups={self.groups}, bias={self.bias is not None}, "
            f"padding_mode={self.padding_mode!r}, heads={self.heads}, content={self.content}"
            + (f", content_heads={self.content_heads}, qk_dim={self.qk_dim}" if self.content else "")
        )

    # ------------------------------------------------------------------ sizes

    def output_size(self, height: int, width: int) -> tuple[int, int]:
        """``(H_out, W_out)`` for an ``H×W`` input, as the convolution computes it."""
        (top, bottom), (left, right) = self.padding
        return tuple(
            (n - d * (k - 1) - 1) // s + 1
            for n, k, s, d in zip(
                (height + top + bottom, width + left + right),
                self.kernel_size, self.stride, self.dilation, strict=True,
            )
        )  # fmt: skip

    def query_pixels(self, height: int, width: int) -> tuple[Tensor, Tensor]:
        """Rows ``(H_out,)`` and columns ``(W_out,)`` of the padded input where the queries sit."""
        out_h, out_w = self.output_size(height, width)
        device = self.weight.device
        rows = torch.arange(out_h, device=device) * self.stride[0] + self.anchor[0]
        cols = torch.arange(out_w, device=device) * self.stride[1] + self.anchor[1]
        return rows, cols

    def content_gates(self) -> Tensor:
        """``(heads,)`` the share ``g_h ∈ [0, 1]`` of content attention of each head (zero without
        content): the gate clamped, with a straight-through gradient."""
        if self.gate is None:
            return self.weight.new_zeros(self.heads)
        return self.gate + (self.gate.clamp(0.0, 1.0) - self.gate).detach()

    # ------------------------------------------------------------------ attention

    def positional_kernel(
        self, height: int, width: int, dtype: torch.dtype
    ) -> tuple[Tensor, tuple[int, int]]:
        """The positional attention of every head, projected, as one convolution kernel.

        Each head's attention weighs the key at offset ``δ`` from its query by
        ``p_h(δ) = exp(−½ s_h² ‖δ − Δ_h‖²) / Z_h`` over the input padded as the convolution pads
        it and then by zeros without end, so ``Z_h`` (the sum over every integer offset) is the
        same for every query and ``Σ_h W_h p_h`` is a convolution kernel. Returns that kernel
        ``(out, in/groups, kh', kw')``, weighted by ``1 − g_h``, over the offsets that reach the
        input, and the offset ``(δ1, δ2)`` of its first tap. Probabilities below ``eps(dtype)``
        of a head's peak are left out (of its normaliser too), so the result is exact to rounding.
        """
        sizes = (height + sum(self.padding[0]), width + sum(self.padding[1]))
        outs = self.output_size(height, width)
        factors, starts = [], []
        centers, spread = self.position.centers, self.position.spread
        for axis in range(2):
            lo, hi = self._axis_reach(axis, dtype)
            offsets = torch.arange(lo, hi + 1, device=centers.device, dtype=centers.dtype)
            probs = softmax_without_subnormals(
                gaussian_axis_logits(centers[:, axis], spread, offsets)
            )  # (heads, hi − lo + 1): normalised over every offset that matters
            first = max(lo, -self.anchor[axis] - (outs[axis] - 1) * self.stride[axis])
            last = min(hi, sizes[axis] - 1 - self.anchor[axis])
            if first > last:  # every head looks past the input: its keys are zeros
                first = last = min(max(lo, -self.anchor[axis]), hi)
            factors.append(probs[:, first - lo : last - lo + 1])
            starts.append(first)
        taps = self.weight.reshape(self.out_channels, -1, self.heads)
        keep = 1.0 - self.content_gates()
        kernel = torch.einsum("och,h,ha,hb->ocab", taps, keep, factors[0], factors[1])
        return kernel.to(dtype), (starts[0], starts[1])

    def _axis_reach(self, axis: int, dtype: torch.dtype) -> tuple[int, int]:
        """``(lo, hi)``: every offset along ``axis`` (0 rows, 1 columns) where some head's
        positional weight is at least ``eps(dtype)`` times its peak (on the meta device, where
        only shapes exist: of the heads as they started, on the taps with ``start_spread``)."""
        if self.position.centers.is_meta:  # shapes only (models/complexity.py): as it started
            taps = torch.arange(self.kernel_size[axis]) * self.dilation[axis] - self.anchor[axis]
            centers = taps.to(torch.float64)
            spread = torch.full_like(centers, self.start_spread)
        else:
            centers = self.position.centers.detach()[:, axis]
            spread = self.position.spread.detach().abs().clamp_min(1e-6)
        reach = math.sqrt(-2.0 * math.log(torch.finfo(dtype).eps)) / spread
        return math.ceil(float((centers - reach).min())), math.floor(float((centers + reach).max()))

    def content_map(self) -> Tensor:
        """``(heads,)`` long: the content attention each head mixes in (head ``h`` takes map
        ``⌊h·content_heads / heads⌋``: one map shared by all heads when ``content_heads = 1``,
        ConViT's own content attention per head when ``content_heads = heads``)."""
        return torch.arange(self.heads, device=self.weight.device) * self.content_heads // self.heads

    def content_probs(self, x: Tensor) -> Tensor:
        """``(B, content_heads, H_out·W_out, H·W)`` content attention of ``x (B, in, H, W)``:
        each output pixel's query (the input at its centre tap) against every input pixel's
        key."""
        if self.query is None:
            raise ValueError("this layer has no content attention (content=False)")
        batch = x.shape[0]
        rows, cols = self.query_pixels(x.shape[2], x.shape[3])
        centre = self._pad(x).index_select(2, rows).index_select(3, cols)  # (B, in, H_out, W_out)
        queries = self.query(centre.flatten(2).transpose(1, 2))  # (B, N_out, heads·d)
        keys = self.key(x.flatten(2).transpose(1, 2))  # (B, N, heads·d)
        maps, width = self.content_heads, self.qk_dim
        queries = queries.view(batch, rows.numel() * cols.numel(), maps, width).transpose(1, 2)
        keys = keys.view(batch, x.shape[2] * x.shape[3], maps, width).transpose(1, 2)
        logits = (queries * self.qk_dim**-0.5) @ keys.transpose(-1, -2)
        return logits.softmax(dim=-1)  # (B, content_heads, N_out, N)

    @torch.no_grad()
    def attention(self, x: Tensor) -> Tensor:
        """``(B, heads, H_out·W_out, H·W)``: each head's attention of every output pixel over the
        input's pixels (row-major), ``(1 − g_h) P_pos + g_h P_c``, for figures and analysis. The
        positional part is the softmax over the zero-extended input restricted to the image: a
        row sums to less than one by the mass on padding, which only ever meets zeros (with zero
        padding) or copies of border pixels (other padding modes)."""
        batch, _, height, width = x.shape
        out_h, out_w = self.output_size(height, width)
        dtype = torch.promote_types(x.dtype, self.weight.dtype)
        (top, _), (left, _) = self.padding
        axes = []
        for axis, size, out in ((0, height, out_h), (1, width, out_w)):
            lo, hi = self._axis_reach(axis, dtype)
            offsets = torch.arange(lo, hi + 1, device=x.device, dtype=dtype)
            logits = gaussian_axis_logits(
                self.position.centers[:, axis].to(dtype), self.position.spread.to(dtype), offsets
            )
            probs = softmax_without_subnormals(logits)  # (heads, offsets), normalised over Z
            queries = torch.arange(out, device=x.device) * self.stride[axis] + self.anchor[axis]
            keys = torch.arange(size, device=x.device) + (top, left)[axis]  # padded coordinates
            delta = keys[None, :] - queries[:, None]  # (out, size)
            inside = (delta >= lo) & (delta <= hi)
            index = (delta - lo).clamp(0, hi - lo)
            axes.append(probs[:, index] * inside)  # (heads, out, size)
        row, col = axes
        positional = (row[:, :, None, :, None] * col[:, None, :, None, :]).reshape(
            self.heads, out_h * out_w, height * width
        )[None]
        if self.gate is None:
            return positional.expand(batch, -1, -1, -1).to(x.dtype)
        gates = self.content_gates().to(dtype).view(1, -1, 1, 1)
        content = self.content_probs(x).to(dtype)[:, self.content_map()]
        return (positional + gates * (content - positional)).to(x.dtype)

    @torch.no_grad()
    def head_geometry(self) -> dict[str, Tensor]:
        """``centers (heads, 2)`` (pixels, from the query), ``covariance (heads, 2, 2)``,
        ``condition_number (heads,)`` (1: isotropic), as
        [`head_geometry`][attnconv.attention.layer.MultiHeadSelfAttention2d.head_geometry] gives
        them, and ``gates (heads,)``, each head's share of content attention."""
        return {**self.position.geometry(), "gates": self.content_gates().detach().clone()}

    def _pad(self, x: Tensor) -> Tensor:
        (top, bottom), (left, right) = self.padding
        if top + bottom + left + right == 0:
            return x
        mode = "constant" if self.padding_mode == "zeros" else self.padding_mode
        return F.pad(x, (left, right, top, bottom), mode=mode)

    def _content_active(self) -> bool:
        """Whether the content attention must run: the layer has it and either a gate is open
        or gradients may flow to the gates (on the meta device, where multiply-adds are counted:
        always)."""
        if self.gate is None:
            return False
        if self.gate.is_meta:  # shapes only (models/complexity.py): count what training runs
            return True
        return torch.is_grad_enabled() or bool((self.gate > 0).any())

    def forward(self, x: Tensor) -> Tensor:
        """``x (B, in, H, W)`` → ``(B, out, H_out, W_out)``: the positional attention (a
        convolution with ``positional_kernel``) plus the gated content attention."""
        if not isinstance(x, Tensor) or x.dim() != 4 or x.shape[1] != self.in_channels:
            shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"expected input of shape (B, {self.in_channels}, H, W), got {shape}")
        height, width = x.shape[2], x.shape[3]
        out_h, out_w = self.output_size(height, width)
        if out_h < 1 or out_w < 1:
            raise ValueError(
                f"input {height}x{width} (padded by {self.padding}) is smaller than the dilated "
                f"kernel {self.kernel_size} (dilation {self.dilation})"
            )
        dtype = torch.promote_types(x.dtype, self.weight.dtype)
        kernel, (first_row, first_col) = self.positional_kernel(height, width, dtype)
        padded = self._pad(x)
        # Output pixel r reads the padded input at r·stride + anchor + δ, δ from the kernel's
        # first tap on: pad (or crop) the input so that conv2d's window starts there.
        pads = []
        for axis, first, size in ((1, first_col, padded.shape[3]), (0, first_row, padded.shape[2])):
            before = -(self.anchor[axis] + first)
            span = ((out_h, out_w)[axis] - 1) * self.stride[axis] + kernel.shape[2 + axis]
            pads += [before, span - size - before]
        y = F.conv2d(F.pad(padded, pads), kernel, self.bias, self.stride, groups=self.groups)
        if self._content_active():
            y = y + self._content_output(x, out_h, out_w)
        return y

    def _content_output(self, x: Tensor, out_h: int, out_w: int) -> Tensor:
        """``Σ_h g_h W_h P_c^{m(h)} x``: the gated content attention, projected, ``(B, out,
        H_out, W_out)``; ``m(h)`` is ``content_map``, so each map is applied to the input
        once and projected with the gated taps of the heads that share it."""
        batch, channels, groups, maps = x.shape[0], self.in_channels, self.groups, self.content_heads
        probs = self.content_probs(x)  # (B, maps, N_out, N)
        n_out = out_h * out_w
        # attended[b, c, (m, q)] = Σ_k x[b, c, k] probs[b, m, q, k]
        n = x.shape[2] * x.shape[3]
        attended = x.flatten(2) @ probs.reshape(batch, maps * n_out, n).transpose(1, 2)
        gated = self.weight.reshape(self.out_channels, channels // groups, self.heads)
        gated = gated * self.content_gates()
        if maps < self.heads:  # sum the gated taps of the heads sharing each map
            share = F.one_hot(self.content_map(), maps).to(gated.dtype)  # (heads, maps)
            gated = gated @ share
        taps = gated.reshape(groups, self.out_channels // groups, -1)  # column c·maps + m
        y = taps.to(attended.dtype) @ attended.reshape(batch, groups, taps.shape[-1], n_out)
        return y.reshape(batch, self.out_channels, out_h, out_w)
