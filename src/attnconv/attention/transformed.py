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
  ``P^h = (1 − g_h) P_pos^h + g_h P_c^h``. Why this form (docs/transform.md, "The content term"):
  the content softmax is not saturated by the sharp positional one (a term ``q·k`` *added to* the
  Gaussian logits would be, and learn at ``e^{−s²/2}`` of the rate); the gate's gradient,
  ``⟨∂L/∂y_h, W_h (P_c^h − P_pos^h) x⟩``, is of the order of the layer's output from step 0.
  Two gates (``GATES``), each started at ``g_h = opening``:

  - ``"sigmoid"``, ConViT's: ``g_h = σ(gate_h)``, never exactly 0 or 1, so the queries and keys
    always receive a gradient (``g_h`` times the content path's);
  - ``"clamp"``, attnconv's first form: ``g_h = clamp(gate_h, 0, 1)`` with a straight-through
    gradient. Started shut (``opening = 0``) the layer is exactly the blurred convolution on
    every input, but a gate held at 0 passes no gradient to the queries and keys behind it:
    content maps that start uniform make opening a gate blend a global average into the
    network, the first steps push the gates below 0, and the content path never learns
    (measured on ``tcnn-fashion-small``: every content map stayed uniform).

  Queries and keys start as ``nn.Linear`` starts (``qk_init="default"``: ``q·k ≈ 0``, uniform
  content maps) or mimetic (``"mimetic"``, after Trockman & Kolter, 2023): ``W_q = W_k = c·U``
  with ``U`` random orthonormal rows, so ``W_qᵀW_k`` is ``c²`` times a projection and a pixel
  attends to the pixels whose features are like its own (``TransformedConv2d.calibrate_mimetic``
  sets ``c`` from real inputs).
* **Values and output** as in the construction: every head attends over the raw input (no value
  projection) and ``weight (out, in/groups, Kh, Kw)``, in the convolution's own layout, holds each
  head's block of the output projection (block-diagonal over ``groups``); ``bias (out,)``.

The output is read at the convolution's output pixels only: the queries are the receptive
fields' centre taps ``(r·sh + a, c·sw + b)`` of the padded input, so the positional attention
factors as ``R^h (H_out, H_pad) ⊗ C^h (W_out, W_pad)`` and costs ``O(heads·(H_out·H_pad·W_pad +
H_out·W_out·W_pad))`` per channel; no ``N×N`` matrix is built. Its normaliser is the sum over
every integer offset, in closed form where a head is wide (``axis_log_normaliser``), so the
kernel spans at most the offsets that reach the input however small a spread training makes.
Shapes: input ``(B, in, H, W)``, output ``(B, out, H_out, W_out)`` as the convolution computes
them.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnconv.attention.positional import GaussianScore
from attnconv.attention.scores import gaussian_axis_logits, underflow_log_threshold

PADDING_MODES: tuple[str, ...] = ("zeros", "circular", "reflect", "replicate")
GATES: tuple[str, ...] = ("clamp", "sigmoid")
"""How a head's share of content attention is parametrised (see the module docstring)."""
QK_INITS: tuple[str, ...] = ("default", "mimetic")
"""How queries and keys start (see the module docstring)."""
CLOSED_FORM_SPREAD = 1.0
"""Below this inverse std (1/pixels) ``axis_log_normaliser`` sums a head's Gaussian over every
integer offset in closed form; at or above it, over the offsets near its centre."""
_DIRECT_RADIUS = 9
# ½·9² = 40.5 > −ln(eps(float64)) = 36.0: at spread ≥ 1 the terms past 9 offsets from the
# nearest integer to the centre are below float64 rounding of the sum.


def axis_log_normaliser(center: Tensor, spread: Tensor) -> Tensor:
    r"""``(heads,)`` $\log Z_h = \log \sum_{n \in \mathbb{Z}} e^{-\frac12 s_h^2 (n - c_h)^2}$: one axis
    of a Gaussian head's normaliser over every integer offset (``center``, ``spread``:
    ``(heads,)``, pixels and 1/pixels), exact to float64 rounding and differentiable.

    Wide heads (``|s| < CLOSED_FORM_SPREAD``) use Poisson summation,
    $Z = \frac{\sqrt{2\pi}}{s} \sum_k e^{-2\pi^2 k^2 / s^2} \cos(2\pi k c)$, whose terms past
    $|k| = 1$ are below $e^{-8\pi^2} \approx 10^{-34}$ relative; narrow ones sum the
    ``2·9 + 1`` offsets around the centre directly. So the cost does not grow as a spread shrinks.
    """
    spread = spread.abs().clamp_min(1e-6)
    wide = spread < CLOSED_FORM_SPREAD
    wide_spread = torch.where(wide, spread, torch.ones_like(spread))  # finite in both branches
    closed = (
        0.5 * math.log(2 * math.pi)
        - wide_spread.log()
        + torch.log1p(
            2 * torch.exp(-2 * math.pi**2 / wide_spread.square()) * torch.cos(2 * math.pi * center)
        )
    )
    nearest = center.detach().round()
    offsets = nearest[:, None] + torch.arange(
        -_DIRECT_RADIUS, _DIRECT_RADIUS + 1, device=center.device, dtype=center.dtype
    )
    narrow_spread = torch.where(wide, torch.ones_like(spread), spread)
    direct = torch.logsumexp(
        -0.5 * narrow_spread[:, None].square() * (offsets - center[:, None]).square(), dim=-1
    )
    return torch.where(wide, closed, direct)


def _pair(value: int | tuple[int, ...] | list[int], name: str) -> tuple[int, int]:
    pair = (value, value) if isinstance(value, int) and not isinstance(value, bool) else value
    pair = tuple(pair)
    if len(pair) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in pair):
        raise ValueError(f"{name} must be an int or a pair of ints, got {value!r}")
    return pair


def check_content_start(gate: str, opening: float, qk_init: str) -> None:
    """ValueError saying what is expected unless ``gate`` is one of ``GATES``, ``opening``
    a share that gate can start at and ``qk_init`` one of ``QK_INITS``."""
    if gate not in GATES:
        raise ValueError(f"gate must be one of {', '.join(GATES)}, got {gate!r}")
    if qk_init not in QK_INITS:
        raise ValueError(f"qk_init must be one of {', '.join(QK_INITS)}, got {qk_init!r}")
    if isinstance(opening, bool) or not isinstance(opening, (int, float)):
        raise ValueError(f"opening must be a number, got {opening!r}")
    if gate == "sigmoid" and not 0.0 < opening < 1.0:
        raise ValueError(f"a sigmoid gate's opening must be in (0, 1), got {opening!r}")
    if not 0.0 <= opening <= 1.0:
        raise ValueError(f"opening must be in [0, 1], got {opening!r}")


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
        qk_dim: width of each content map's queries and keys; default
            ``max(4, in_channels // (4·content_heads))``.
        content_heads: content maps (1: one shared by every head; ``Kh·Kw``: one per head).
        gate: how the gates are parametrised, one of ``GATES``.
        opening: every gate's share of content attention at the start, in ``[0, 1]`` for
            ``"clamp"`` and ``(0, 1)`` for ``"sigmoid"``; 0 starts as the blurred convolution.
        qk_init: how queries and keys start, one of ``QK_INITS``.

    Parameters: ``weight``, ``bias``, ``position.centers``, ``position.spread`` and, with content,
    ``query``/``key`` (``Linear(in, content_heads·qk_dim)``) and ``gate (heads,)`` (the clamped
    share, or the sigmoid's logit). A fresh layer starts on the taps with its gates at
    ``opening``; ``attnconv.transform`` copies a trained convolution in. The defaults are
    the first form's (clamped gates started shut, ``nn.Linear`` queries and keys), which
    checkpoints written before the other forms existed hold.
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
        gate: str = "clamp",
        opening: float = 0.0,
        qk_init: str = "default",
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
        if content:
            check_content_start(gate, opening, qk_init)

        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.stride, self.dilation = kernel, stride, dilation
        self.padding, self.groups, self.padding_mode = pads, groups, padding_mode
        self.content, self.qk_dim = bool(content), qk_dim if content else None
        self.content_heads = content_heads if content else None
        self.gate_kind, self.opening, self.qk_init = gate, float(opening), qk_init
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
        """Heads on the taps with inverse std ``spread``, gates at ``opening``, the output
        projection and bias as ``nn.Conv2d`` starts its kernel and bias, queries and keys as
        ``qk_init`` says."""
        self.position.centers.copy_(self.tap_offsets())
        self.position.spread.fill_(spread)
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in = self.weight[0].numel()
            nn.init.uniform_(self.bias, -(fan_in**-0.5), fan_in**-0.5)
        if self.gate is None:
            return
        if self.gate_kind == "sigmoid":
            self.gate.fill_(math.log(self.opening / (1.0 - self.opening)))
        else:
            self.gate.fill_(self.opening)
        self.query.reset_parameters()
        self.key.reset_parameters()
        if self.qk_init == "mimetic":
            self.set_mimetic(1.0)

    @torch.no_grad()
    def set_mimetic(self, scale: float) -> None:
        """Queries and keys mimetic with gain ``scale``: for each content map, ``W_q = W_k =
        scale·U`` with ``U (qk_dim, in)`` random orthonormal rows (orthonormal columns where
        ``qk_dim > in``) from torch's global generator, zero biases; so ``q·k/√d =
        scale²·(U x_q)·(U x_k)/√d``, the similarity of the two pixels' features."""
        if self.query is None:
            raise ValueError("this layer has no content attention (content=False)")
        rows = []
        for _ in range(self.content_heads):
            gaussian = torch.randn(self.in_channels, self.qk_dim, dtype=torch.float64)
            basis, _ = torch.linalg.qr(gaussian)  # (in, min(in, qk_dim)) orthonormal columns
            block = torch.zeros(self.qk_dim, self.in_channels, dtype=torch.float64)
            block[: basis.shape[1]] = basis.T
            rows.append(block)
        weight = scale * torch.cat(rows)
        for linear in (self.query, self.key):
            linear.weight.copy_(weight)
            linear.bias.zero_()

    @torch.no_grad()
    def calibrate_mimetic(self, x: Tensor, logit_std: float) -> float:
        """Rescale mimetic queries and keys (``set_mimetic``) so that the content logits of
        ``x (B, in, H, W)`` (real inputs of this layer) have standard deviation ``logit_std`` over
        each query's keys, averaged over queries, maps and images; returns the gain applied
        (logits scale with its square; 1 on a grid of one pixel, whose map is that pixel)."""
        if self.query is None or self.qk_init != "mimetic":
            raise ValueError("calibrate_mimetic needs a layer with qk_init='mimetic'")
        if not (math.isfinite(logit_std) and logit_std > 0):
            raise ValueError(f"logit_std must be a positive finite number, got {logit_std!r}")
        logits = self._content_logits(x)
        if logits.shape[-1] == 1:  # one key: the map is that key whatever the logits
            return 1.0
        measured = float(logits.double().std(dim=-1).mean())
        if not (math.isfinite(measured) and measured > 0):
            raise ValueError("the inputs give constant content logits: nothing to calibrate")
        gain = math.sqrt(logit_std / measured)
        self.query.weight.mul_(gain)
        self.key.weight.mul_(gain)
        return gain

    @classmethod
    def from_conv(
        cls,
        conv: nn.Conv2d,
        spread: float = 4.0,
        content: bool = True,
        qk_dim: int | None = None,
        content_heads: int = 1,
        gate: str = "clamp",
        opening: float = 0.0,
        qk_init: str = "default",
    ) -> TransformedConv2d:
        """The layer of ``conv``'s shape with its kernel and bias copied in (Theorem 1's
        construction with spread ``spread``), gates at ``opening``, on ``conv``'s device and
        dtype (the other arguments as the constructor takes them).

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
            gate=gate,
            opening=opening,
            qk_init=qk_init,
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
            "gate": self.gate_kind,
            "opening": self.opening,
            "qk_init": self.qk_init,
        }

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}, padding={self.padding}, dilation={self.dilation}, "
            f"groups={self.groups}, bias={self.bias is not None}, "
            f"padding_mode={self.padding_mode!r}, heads={self.heads}, content={self.content}"
            + (
                f", content_heads={self.content_heads}, qk_dim={self.qk_dim}, "
                f"gate={self.gate_kind!r}, opening={self.opening:g}, qk_init={self.qk_init!r}"
                if self.content
                else ""
            )
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
        content): ``σ(gate)``, or the gate clamped with a straight-through gradient."""
        if self.gate is None:
            return self.weight.new_zeros(self.heads)
        if self.gate_kind == "sigmoid":
            return torch.sigmoid(self.gate)
        return self.gate + (self.gate.clamp(0.0, 1.0) - self.gate).detach()

    # ------------------------------------------------------------------ attention

    def positional_kernel(
        self, height: int, width: int, dtype: torch.dtype
    ) -> tuple[Tensor, tuple[int, int]]:
        """The positional attention of every head, projected, as one convolution kernel.

        Each head's attention weighs the key at offset ``δ`` from its query by
        ``p_h(δ) = exp(−½ s_h² ‖δ − Δ_h‖²) / Z_h`` over the input padded as the convolution pads
        it and then by zeros without end, so ``Z_h`` (the sum over every integer offset,
        ``axis_log_normaliser``) is the same for every query and ``Σ_h W_h p_h`` is a
        convolution kernel. Returns that kernel ``(out, in/groups, kh', kw')``, weighted by
        ``1 − g_h``, over the offsets that reach the input (so at most about twice the padded
        input's size along each axis, however wide the heads), and the offset ``(δ1, δ2)`` of its
        first tap. Offsets where every head's weight is below ``eps(dtype)`` of its peak are left
        out of the kernel (not of the normaliser), so the result is exact to rounding.
        """
        (rows, cols), starts = self._positional_factors(height, width, dtype)
        keep = 1.0 - self.content_gates()
        taps = self.weight.reshape(-1, self.heads)  # (out·in/groups, heads)
        # Σ_h taps[:, h] (1 − g_h) R_h[a] C_h[b] as one matrix product (an einsum over the four
        # factors ran ~10x slower forward and backward on a 512->512 layer)
        per_head = (keep[:, None, None] * rows[:, :, None] * cols[:, None, :]).flatten(1)
        kernel = (taps @ per_head.to(taps.dtype)).view(
            self.out_channels, -1, rows.shape[1], cols.shape[1]
        )
        return kernel.to(dtype), (starts[0], starts[1])

    def _positional_factors(
        self, height: int, width: int, dtype: torch.dtype
    ) -> tuple[tuple[Tensor, Tensor], tuple[int, int]]:
        """Each head's positional weights along rows ``(heads, kh')`` and columns ``(heads,
        kw')`` over the offsets that reach an ``H×W`` input (``_axis_window``), and the offsets
        ``(δ1, δ2)`` of their first entries: the head's kernel is their outer product."""
        sizes = (height + sum(self.padding[0]), width + sum(self.padding[1]))
        outs = self.output_size(height, width)
        factors, starts = [], []
        for axis in range(2):
            first, last = self._axis_window(axis, sizes[axis], outs[axis], dtype)
            factors.append(self._axis_probs(axis, first, last))  # (heads, last − first + 1)
            starts.append(first)
        return (factors[0], factors[1]), (starts[0], starts[1])

    def _axis_window(self, axis: int, size: int, out: int, dtype: torch.dtype) -> tuple[int, int]:
        """``(first, last)``: the offsets along ``axis`` from a query to a key of the input padded
        to ``size`` (for ``out`` queries), where some head's weight is at least ``eps(dtype)`` of
        its peak; where every head looks past the input, one offset inside it (its keys meet
        only the zeros beyond the padding)."""
        lo, hi = self._axis_reach(axis, dtype)
        reach_first = -self.anchor[axis] - (out - 1) * self.stride[axis]
        reach_last = size - 1 - self.anchor[axis]
        first, last = max(lo, reach_first), min(hi, reach_last)
        if first > last:
            first = last = min(max(lo, reach_first), reach_last)
        return first, last

    def _axis_probs(self, axis: int, first: int, last: int) -> Tensor:
        """``(heads, last − first + 1)``: each head's positional weight along ``axis`` at the
        offsets ``first..last``, normalised over every integer offset, probabilities below
        ``sqrt(tiny)`` flushed to zero (no subnormals forward or backward)."""
        centers, spread = self.position.centers[:, axis], self.position.spread
        offsets = torch.arange(first, last + 1, device=centers.device, dtype=centers.dtype)
        log_probs = gaussian_axis_logits(centers, spread, offsets)
        log_probs = log_probs - axis_log_normaliser(centers, spread)[:, None]
        underflow = log_probs.detach() < underflow_log_threshold(log_probs.dtype)
        return log_probs.masked_fill(underflow, float("-inf")).exp()

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
        return self._content_logits(x).softmax(dim=-1)

    def _content_logits(self, x: Tensor) -> Tensor:
        """``(B, content_heads, H_out·W_out, H·W)`` the logits ``q·k/√d`` of
        ``content_probs``."""
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
        return (queries * self.qk_dim**-0.5) @ keys.transpose(-1, -2)

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
        sizes = (height + sum(self.padding[0]), width + sum(self.padding[1]))
        for axis, size, out in ((0, height, out_h), (1, width, out_w)):
            lo, hi = self._axis_window(axis, sizes[axis], out, dtype)
            probs = self._axis_probs(axis, lo, hi).to(dtype)  # (heads, offsets), normalised over Z
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
        (a sigmoid gate always is) or gradients may flow to the gates (on the meta device, where
        multiply-adds are counted: always)."""
        if self.gate is None:
            return False
        if self.gate.is_meta:  # shapes only (models/complexity.py): count what training runs
            return True
        return torch.is_grad_enabled() or bool((self.content_gates() > 0).any())

    def forward(self, x: Tensor) -> Tensor:
        """``x (B, in, H, W)`` → ``(B, out, H_out, W_out)``: the positional attention plus the
        gated content attention.

        The positional part takes one of two exact routes (``_separable_pays`` picks). One
        convolution with ``positional_kernel``; or, where the blur widens the heads' kernels
        (spread 3 gives a 3×3 convolution's heads 5×5 kernels) and the layer is wide, each head
        first blurs the input with its separable kernel (a row then a column matrix product,
        cheap) and one matrix product over channels and heads projects the result: the
        convolution's own multiply-adds, not ``kh'·kw'/(Kh·Kw)`` times them, and no
        ``(out, in, kh', kw')`` kernel to build, differentiate and reorder at every step."""
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
        (rows, cols), starts = self._positional_factors(height, width, dtype)
        window = self._window(x, starts, (rows.shape[1], cols.shape[1]), (out_h, out_w))
        if self._separable_pays(rows.shape[1] * cols.shape[1], x.shape[0] * out_h * out_w):
            y = self._separable_positional(window, rows, cols, (out_h, out_w))
        else:
            kernel, _ = self.positional_kernel(height, width, dtype)
            y = F.conv2d(window, kernel, self.bias, self.stride, groups=self.groups)
        if self._content_active():
            y = y + self._content_output(x, out_h, out_w)
        return y

    def _separable_pays(self, kernel_taps: int, output_pixels: int) -> bool:
        """Whether the separable route beats the kernel route: the blurred kernel spans more
        taps than there are heads, and the layer's weights outnumber the batch's output pixels
        (``out·in/groups ≥ B·H_out·W_out``: the kernel route's build, its gradient and the
        reorder of a new kernel at every step then dominate). Measured fwd+bwd on one thread of
        an Intel Xeon (AMX), spread 3: 512 channels on 4×4 for 8 images 3.3x the CNN's
        convolution against 12x; 256 on 7×7, 2.1x against 5.8x; 72 on 4×4 for 100 images (the
        separable route) 3.5x against 4.0x; 36 on 7×7 for 100 images (the kernel route) 1.8x
        against 4.7x."""
        weights = self.out_channels * self.in_channels // self.groups
        return kernel_taps > self.heads and weights >= output_pixels

    def _window(
        self, x: Tensor, starts: tuple[int, int], taps: tuple[int, int], outs: tuple[int, int]
    ) -> Tensor:
        """The input padded as the convolution pads it, then padded (or cropped) so that output
        pixel ``r`` reads rows ``r·stride .. r·stride + taps − 1`` of the result at the offsets
        ``starts[0] ..`` from its query (columns alike): what a convolution with a
        ``taps``-sized kernel and no padding reads. ``(B, in, (H_out−1)·sh + kh', (W_out−1)·sw
        + kw')``."""
        padded = self._pad(x)
        pads = []
        for axis in (1, 0):  # F.pad takes the last dimension first
            before = -(self.anchor[axis] + starts[axis])
            span = (outs[axis] - 1) * self.stride[axis] + taps[axis]
            pads += [before, span - padded.shape[2 + axis] - before]
        return F.pad(padded, pads)

    def _band(self, factor: Tensor, axis: int, out: int) -> Tensor:
        """``(heads, out, (out−1)·stride + k)``: each head's weights ``factor (heads, k)`` along
        ``axis`` placed at every output pixel's window (row ``r`` holds them from column
        ``r·stride`` on, zeros elsewhere): the attention along that axis as a matrix."""
        taps, stride = factor.shape[1], self.stride[axis]
        keys = torch.arange((out - 1) * stride + taps, device=factor.device)
        index = keys[None, :] - torch.arange(out, device=factor.device)[:, None] * stride
        inside = (index >= 0) & (index < taps)
        return factor[:, index.clamp(0, taps - 1)] * inside

    def _separable_positional(
        self, window: Tensor, rows: Tensor, cols: Tensor, outs: tuple[int, int]
    ) -> Tensor:
        """``Σ_h (1 − g_h) W_h (R_h ⊗ C_h) x + bias``: each head's separable blur of ``window``
        (``_window``'s), along rows as one matrix product over every image and channel, along
        columns as one per head, then one product over channels and heads for every output
        pixel of the batch at once, ``(B, out, H_out, W_out)``."""
        batch, channels, height, width = window.shape
        heads, groups, (out_h, out_w) = self.heads, self.groups, outs
        row_band = self._band(rows, 0, out_h).to(window.dtype)  # (heads, H_out, height)
        col_band = self._band(cols, 1, out_w).to(window.dtype)  # (heads, W_out, width)
        planes = window.permute(2, 0, 1, 3).reshape(height, batch * channels * width)
        along_rows = row_band.reshape(heads * out_h, height) @ planes
        along_rows = along_rows.view(heads, out_h * batch * channels, width)
        blurred = along_rows @ col_band.transpose(1, 2)  # (heads, H_out·B·in, W_out)
        blurred = blurred.view(heads, out_h, batch, channels, out_w).permute(3, 0, 2, 1, 4)
        blurred = blurred.reshape(groups, channels // groups * heads, batch * out_h * out_w)
        keep = 1.0 - self.content_gates()
        taps = self.weight.reshape(self.out_channels, channels // groups, heads) * keep
        taps = taps.reshape(groups, self.out_channels // groups, -1).to(window.dtype)
        y = (taps @ blurred).view(self.out_channels, batch, out_h, out_w).transpose(0, 1)
        return y if self.bias is None else y + self.bias.to(y.dtype)[:, None, None]

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
