r"""Theorem 1 as code: a convolution computed exactly by multi-head self-attention.

Construction ([the mathematics, §2][2-theorem-1-attention-can-be-any-convolution]). A convolution
with a $K_h \times K_w$ kernel becomes a [`MultiHeadSelfAttention2d`][] with one head
per kernel tap ``(i, j)``:

* **Padding.** The input is padded exactly as the convolution pads it (zeros, circular wrap-around,
  reflection or replication; ``padding="same"`` pads $\lfloor d(K-1)/2 \rfloor$ before and the rest
  after, as PyTorch does), so a query near the border attends a padding token exactly where the
  convolution reads one. ``dynamic_same=True`` pads as TensorFlow's ``"SAME"`` does for each input
  size (the convolution subclasses of TensorFlow ports that pad in ``forward``).
* **Positions.** On the padded image the convolution's output pixel $(r, c)$ reads tap $(i, j)$ at
  $(rt + i\ell, ct + j\ell)$, for stride $t$ and dilation $\ell$. The attention query for that
  output is the pixel $(rt + a, ct + b)$ with $a = \lfloor (K_h - 1)/2 \rfloor \ell$ ($b$ likewise,
  the kernel's centre tap), and head $(i, j)$ has the quadratic score centred on
  $\Delta = (i\ell - a, j\ell - b)$, integers. With ``hard=True`` (the $s \to \infty$ limit) its
  attention is one-hot on $q + \Delta$; with a finite spread $s$ it is a Gaussian of inverse std $s$
  around it, and the construction converges to the convolution as $s$ grows.
* **Weights.** Each head attends over the raw input (``head_dim = in_channels``, no value
  projection) and the output projection holds the taps: the block of ``out.weight`` for head
  ``(i, j)`` is $W_\text{conv}[:, :, i, j]$ (block-diagonal over groups), ``out.bias`` is the conv
  bias. This is the cheaper of the two factorisations $W_\text{val} W_\text{out}$ allows: with a
  value projection to $K^2 C_\text{out}$ channels, ``out`` (the sum over heads) still costs
  $K^2 C_\text{out}^2$ multiply-adds per pixel on top of the same $K^2 C_\text{in} C_\text{out}$ of
  the value projection. It is also uniform: ``head_dim = dim`` always means no value projection,
  whereas ``head_dim = Cout`` would lose its value projection (the layer has none when
  ``head_dim == dim``) if Cin == Cout.
* **Output.** The attention output is taken at the query pixels above (every ``stride``-th one).

The kernel is stored once, as the module's own ``weight`` (the convolution's
``(out, in/groups, Kh, Kw)`` shape) and ``bias``: the attention layer's ``out.weight`` is a
parametrization (``torch.nn.utils.parametrize``) whose original *is* that parameter, and its
``out.bias`` is the same parameter as ``bias``. So the gradient reaching ``weight`` is the gradient
with respect to the convolution's weights, the attention layer stays a complete, standalone
``MultiHeadSelfAttention2d`` (``attention_to_conv`` reads the kernel back out of it), and the
module's ``state_dict`` is the convolution's: ``weight`` and ``bias`` only (the head geometry is
fixed by the construction, rebuilt from the hyper-parameters, and frozen).

Speed. With hard attention each head's attention is one-hot on the key at a constant offset from
its query, so the head's output (its attended values) is one strided slice of the padded input, and
the output projection of all heads is applied per group: a ``(Cout/groups, Kh·Kw·Cin/groups)``
matrix per group on the stacked slices, or, when each group reads one input channel (depthwise),
a multiply-add of each head's slice with its tap. The cost is the convolution's: no block-diagonal
``(Cout, Kh·Kw·Cin)`` weight, nothing of size ``groups ×`` the kernel, no ``H×H``/``W×W``/``L×L``
factor. The slice offsets are Python integers fixed at construction; in eager mode each forward
checks the layer's centres still equal the taps (otherwise, with a finite spread, with
``attention.impl = "dense"``, or with attention dropout in training, the layer's own forward runs).
Traced, compiled, exported and scripted modules always take the shift route (the checks are
data-dependent); scripting supports hard attention only.
"""

from __future__ import annotations

import copy
import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import parametrize

from attnconv.attention import MultiHeadSelfAttention2d

SUPPORTED_PADDING_MODES: tuple[str, ...] = ("zeros", "circular", "reflect", "replicate")


class KernelToOutWeight(nn.Module):
    """Parametrization ``kernel → out.weight (Cout, Kh·Kw·Cin)`` of the layer's output projection.

    ``kernel`` has the convolution's own shape, ``(Cout, Cin/groups, Kh, Kw)`` or
    ``(Cout, Cin/groups, K)`` for a 1-D convolution (``Kh = 1``); ``transform`` (identity by
    default, e.g. [`Standardize`][]) is applied to it first. Column ``h·Cin + c`` of the output
    weight, for head ``h = i·Kw + j``, holds ``kernel[:, c − g·Cin/groups, i, j]`` for the output
    channels of group ``g`` that reads input channel ``c``, and zero for the other groups
    (block-diagonal over groups). Only the layer's own forward and ``attention_to_conv`` build it;
    the converted module's shift route never does.
    """

    def __init__(
        self, kernel_shape: tuple[int, ...], groups: int, transform: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.kernel_shape, self.groups = tuple(kernel_shape), groups
        self.transform = nn.Identity() if transform is None else transform

    def forward(self, kernel: Tensor) -> Tensor:
        out_channels, in_per_group, *taps = self.kernel_shape
        kh, kw = _as_2d(tuple(taps))
        g = self.groups
        full = self.transform(kernel).reshape(out_channels, in_per_group, kh, kw)
        if g > 1:
            blocks = full.view(g, out_channels // g, 1, in_per_group, kh, kw)
            eye = torch.eye(g, dtype=kernel.dtype, device=kernel.device)
            full = (blocks * eye[:, None, :, None, None, None]).reshape(
                out_channels, g * in_per_group, kh, kw
            )
        return full.permute(0, 2, 3, 1).reshape(out_channels, -1)


class Standardize(nn.Module):
    r"""Weight standardisation:
    $W \mapsto (W - \operatorname{mean} W) / \sqrt{\operatorname{var} W + \varepsilon}$ for a kernel
    $W$ ``(Cout, …)``, $\varepsilon$ = ``eps``.

    Mean and (biased) variance are taken per output channel, over all its input channels and taps,
    as the weight-standardised convolutions of BiT-style networks compute them (NFNet also scales
    the result: [`ScaledStandardize`][]).
    """

    def __init__(self, eps: float = 1e-5) -> None:
        super().__init__()
        if not (isinstance(eps, (int, float)) and not isinstance(eps, bool) and eps >= 0):
            raise ValueError(f"eps must be a non-negative number, got {eps!r}")
        self.eps = float(eps)

    def forward(self, kernel: Tensor) -> Tensor:
        dims = list(range(1, kernel.dim()))
        mean = kernel.mean(dim=dims, keepdim=True)
        var = kernel.var(dim=dims, unbiased=False, keepdim=True)
        return (kernel - mean) / torch.sqrt(var + self.eps)

    def extra_repr(self) -> str:
        return f"eps={self.eps:g}"


class ScaledStandardize(Standardize):
    r"""Scaled weight standardisation (NFNet): [`Standardize`][], then each output channel times
    $g \cdot c$:
    $W \mapsto (W - \operatorname{mean} W) / \sqrt{\operatorname{var} W + \varepsilon} \cdot g \cdot c$.

    $g$ = ``gain``: a trainable ``(Cout, 1, …)`` parameter of this module; $c$ = ``scale``: a
    constant (timm's ``ScaledStdConv2d``: $\gamma \cdot \text{fan\_in}^{-1/2}$,
    $\text{fan\_in} = C_\text{in} / \text{groups} \cdot K_h K_w$).
    """

    def __init__(self, gain: Tensor, scale: float, eps: float = 1e-6) -> None:
        super().__init__(eps)
        self.gain = nn.Parameter(gain.detach().clone(), requires_grad=gain.requires_grad)
        self.scale = float(scale)

    def forward(self, kernel: Tensor) -> Tensor:
        return super().forward(kernel) * (self.gain * self.scale)

    def extra_repr(self) -> str:
        return f"eps={self.eps:g}, scale={self.scale:g}"


class AttentionConv(nn.Module):
    """A ``Conv1d``/``Conv2d`` computed through [`MultiHeadSelfAttention2d`][] (Theorem 1).

    Build it with [`conv_to_attention`][]. Input and output have the convolution's layout:
    ``(B, in_channels, H, W) → (B, out_channels, H_out, W_out)`` for a ``Conv2d`` and
    ``(B, in_channels, L) → (B, out_channels, L_out)`` for a ``Conv1d`` (an image with ``H = 1``
    and ``K`` heads).

    Attributes: ``weight`` (the kernel, shaped as the convolution's), ``bias`` (``(out,)`` or
    ``None``), ``weight_transform`` (applied to ``weight`` each forward: identity, or e.g.
    [`Standardize`][]), ``attention`` (the layer: ``Kh·Kw`` hard or finite-spread heads,
    ``position.centers`` = tap offsets in pixels, ``out.weight`` parametrized by ``weight``,
    ``out.bias`` is ``bias``), ``dynamic_same`` and the convolution's hyper-parameters
    (``kernel_size``, ``stride``, ``padding``, ``dilation``, ``groups``, ``padding_mode``), as on
    the original module.
    ``state_dict()`` holds ``weight`` and ``bias`` only, as the convolution's does, and loads the
    convolution's; a weight transform's parameters ([`ScaledStandardize`][]'s ``gain``) sit
    beside them, as on the layer it reproduces. The module pickles (``torch.save``) and takes
    unbatched input, ``(in, H, W)`` or ``(in, L)``, as the convolution does.
    """

    __jit_ignored_attributes__ = ("attention",)  # the shift route below is the scripted forward
    __jit_unused_properties__ = ("heads",)

    def __init__(
        self,
        conv: nn.Conv1d | nn.Conv2d,
        spread: float | None = None,
        *,
        weight_transform: nn.Module | None = None,
        dynamic_same: bool = False,
    ) -> None:
        super().__init__()
        _check_conv(conv)
        if spread is not None:
            if isinstance(spread, bool) or not isinstance(spread, (int, float)):
                raise TypeError(f"spread must be a float or None (hard attention), got {spread!r}")
            if not (math.isfinite(spread) and spread > 0):
                raise ValueError(f"spread must be a positive finite number, got {spread}")
        if dynamic_same and (isinstance(conv.padding, str) or any(conv.padding)):
            raise ValueError(
                f"dynamic_same=True pads for each input size and needs the convolution's own "
                f"padding to be 0, got padding={conv.padding}"
            )
        self.one_d = isinstance(conv, nn.Conv1d)
        self.in_channels, self.out_channels = conv.in_channels, conv.out_channels
        self.kernel_size, self.stride = conv.kernel_size, conv.stride
        self.padding, self.dilation = conv.padding, conv.dilation
        self.groups, self.padding_mode = conv.groups, conv.padding_mode
        self.spread = None if spread is None else float(spread)
        self.dynamic_same = bool(dynamic_same)
        self._pad_mode = "constant" if conv.padding_mode == "zeros" else conv.padding_mode

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
        # Key of head (i, j) for output pixel (0, 0) of the padded image: (i·dh, j·dw).
        self._keys = [
            (i * dilation[0], j * dilation[1]) for i in range(kernel[0]) for j in range(kernel[1])
        ]

        heads = kernel[0] * kernel[1]
        source = conv.weight.detach()
        opts = {"device": source.device, "dtype": source.dtype}
        self.weight = nn.Parameter(source.clone(), requires_grad=conv.weight.requires_grad)
        if conv.bias is None:
            self.register_parameter("bias", None)
        else:
            self.bias = nn.Parameter(
                conv.bias.detach().clone(), requires_grad=conv.bias.requires_grad
            )
        self.weight_transform = nn.Identity() if weight_transform is None else weight_transform

        layer = MultiHeadSelfAttention2d(
            conv.in_channels,
            heads,
            positional="gaussian",
            out_dim=conv.out_channels,
            hard=spread is None,
        ).to(**opts)
        offsets = torch.tensor(self._keys, **opts) - torch.tensor(self._anchor, **opts)
        with torch.no_grad():
            layer.position.centers.copy_(offsets)
            layer.position.spread.fill_(1.0 if spread is None else spread)  # hard heads ignore it
        layer.position.requires_grad_(False)  # the geometry is the construction's
        self.register_buffer("_tap_centers", offsets, persistent=False)
        layer.out.bias = self.bias
        layer.out.weight = self.weight  # the parametrization's original: this very parameter
        to_out = KernelToOutWeight(self.weight.shape, conv.groups, self.weight_transform)
        parametrize.register_parametrization(layer.out, "weight", to_out, unsafe=True)
        self.attention = layer
        self.register_state_dict_post_hook(_drop_attention_keys)
        self.register_load_state_dict_pre_hook(_fill_attention_keys)

    def __getstate__(self) -> dict:
        """Pickle (and deepcopy) state: the attention layer without its parametrization (which
        torch does not pickle), its output projection a plain ``nn.Linear`` holding ``weight`` and
        ``bias`` themselves. Built beside the live modules, which are left as they are (removing
        the parametrization from a copy would strip ``weight`` from the class the original
        shares), so a module pickles, deep-copies and converts any number of times."""
        out = self.attention.out
        plain = nn.Linear.__new__(nn.Linear)
        plain.__dict__.update(out.__dict__)
        plain._parameters = {**out._parameters, "weight": self.weight}
        plain._modules = {k: v for k, v in out._modules.items() if k != "parametrizations"}
        kept = {id(t): t for t in (self.weight, self.bias, self.weight_transform) if t is not None}
        layer = copy.deepcopy(self.attention, memo={**kept, id(out): plain})
        state = self.__dict__.copy()
        state["_modules"] = {**self._modules, "attention": layer}
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        to_out = KernelToOutWeight(self.weight.shape, self.groups, self.weight_transform)
        parametrize.register_parametrization(self.attention.out, "weight", to_out, unsafe=True)

    @property
    def heads(self) -> int:
        return self.attention.heads

    def extra_repr(self) -> str:
        kind = "Conv1d" if self.one_d else "Conv2d"
        regime = "hard" if self.spread is None else f"spread={self.spread:g}"
        same = ", dynamic_same=True" if self.dynamic_same else ""
        return (
            f"{kind}({self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}, padding={self.padding}, dilation={self.dilation}, "
            f"groups={self.groups}, bias={self.bias is not None}, "
            f"padding_mode={self.padding_mode!r}{same}), heads={len(self._keys)}, {regime}"
        )

    # ------------------------------------------------------------------ sizes

    def input_padding(self, height: int, width: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """``((top, bottom), (left, right))`` padding of an ``H×W`` input, as the conv pads it."""
        if not self.dynamic_same:
            return self._pads[0], self._pads[1]
        (kh, kw), (sh, sw), (dh, dw) = self._kernel, self._stride, self._dilation
        return _same_padding(height, kh, sh, dh), _same_padding(width, kw, sw, dw)

    def padded_size(self, height: int, width: int) -> tuple[int, int]:
        """Size of the padded image the attention runs on, for an ``H×W`` input."""
        (top, bottom), (left, right) = self.input_padding(height, width)
        return height + top + bottom, width + left + right

    def output_size(self, height: int, width: int) -> tuple[int, int]:
        """``(H_out, W_out)`` for an ``H×W`` input, as the convolution computes it."""
        sizes = self.padded_size(height, width)
        return tuple(
            (n - d * (k - 1) - 1) // s + 1
            for n, k, s, d in zip(sizes, self._kernel, self._stride, self._dilation, strict=True)
        )

    # ------------------------------------------------------------------ forward

    def forward(self, x: Tensor) -> Tensor:
        """``x (B, in, H, W)`` (``(B, in, L)`` for a 1-D conv) → ``(B, out, H_out, W_out)``;
        unbatched ``(in, H, W)`` (``(in, L)``) → ``(out, H_out, W_out)``, as the convolution."""
        # A trace records tensor operations, not Python checks: checking sizes while tracing
        # would only turn each comparison into a TracerWarning.
        if not torch.jit.is_scripting() and not torch.jit.is_tracing():
            self._check_input(x)
        unbatched = x.dim() == (2 if self.one_d else 3)
        if unbatched:
            x = x.unsqueeze(0)
        y = self._batched_forward(x)
        return y.squeeze(0) if unbatched else y

    def _batched_forward(self, x: Tensor) -> Tensor:
        """``forward`` of a batch ``(B, in, H, W)`` (``(B, in, L)``)."""
        if not torch.jit.is_scripting():
            if self._runs_layer():
                return self._layer_forward(x)
            if torch.is_autocast_enabled(x.device.type):
                return self._autocast_shift(x)
        return self._shift(x, self.weight_transform(self.weight), self.bias)

    def _shift(self, x: Tensor, kernel: Tensor, bias: Optional[Tensor]) -> Tensor:  # noqa: UP045
        """Hard attention as shifted slices, projected per group: ``(B, out, H_out, W_out)``.

        ``kernel`` is the (transformed) convolution kernel. Head ``(i, j)`` attends, for the
        output pixel ``(r, c)``, the single padded-image key ``(r·sh + i·dh, c·sw + j·dw)``: its
        outputs for all queried pixels are one strided slice ``(B, Cin, H_out, W_out)``. The output
        projection (the taps) maps the heads' outputs of group ``g`` to its output channels.
        """
        if self.one_d:
            x = x.unsqueeze(2)
        (top, bottom), (left, right) = self.input_padding(x.shape[2], x.shape[3])
        if top + bottom + left + right > 0:
            x = F.pad(x, [left, right, top, bottom], mode=self._pad_mode)
        (kh, kw), (sh, sw), (dh, dw) = self._kernel, self._stride, self._dilation
        out_h = (x.shape[2] - dh * (kh - 1) - 1) // sh + 1
        out_w = (x.shape[3] - dw * (kw - 1) - 1) // sw + 1
        attended = [
            x[:, :, r : r + (out_h - 1) * sh + 1 : sh, c : c + (out_w - 1) * sw + 1 : sw]
            for r, c in self._keys
        ]  # one (B, Cin, H_out, W_out) slice per head
        batch, heads, groups = x.shape[0], len(self._keys), self.groups
        cin, cout = self.in_channels // groups, self.out_channels // groups
        if cin == 1:  # depthwise: each head's slice times its tap, channel by channel
            taps = kernel.reshape(groups, cout, heads)
            y = attended[0].unsqueeze(2) * taps[:, :, 0, None, None]  # (B, groups, cout, ...)
            for h in range(1, heads):
                y.addcmul_(attended[h].unsqueeze(2), taps[:, :, h, None, None])
            if bias is not None:
                y.add_(bias.view(groups, cout, 1, 1))
        else:  # per group: (cout, heads·cin) taps times the stacked slices (heads·cin, pixels)
            taps = kernel.reshape(groups, cout, cin, heads).transpose(2, 3)
            taps = taps.reshape(groups, cout, heads * cin)
            if heads == 1:
                stacked = attended[0].reshape(batch, groups, cin, out_h * out_w)
            else:
                stacked = torch.stack(
                    [t.reshape(batch, groups, cin, out_h, out_w) for t in attended], dim=2
                ).reshape(batch, groups, heads * cin, out_h * out_w)
            y = torch.matmul(taps, stacked)  # (B, groups, cout, pixels)
            if bias is not None:
                y.add_(bias.view(groups, cout, 1))
        shape = (
            [batch, self.out_channels, out_w]
            if self.one_d
            else [batch, self.out_channels, out_h, out_w]
        )
        return y.reshape(shape).contiguous()  # a drop-in for the conv: callers may .view() it

    @torch.jit.unused
    def _autocast_shift(self, x: Tensor) -> Tensor:
        """The shift route as a convolution runs under autocast: inputs, kernel and bias rounded
        to the autocast dtype, products accumulated in float32, the output in the autocast dtype."""
        device = x.device.type
        low = torch.get_autocast_dtype(device)
        bias = self.bias
        with torch.autocast(device, enabled=False):
            kernel = self.weight_transform(self.weight).to(low).float()
            bias = None if bias is None else bias.to(low).float()
            return self._shift(x.to(low).float(), kernel, bias).to(low)

    @torch.jit.unused
    def _runs_layer(self) -> bool:
        """Whether the layer's own forward must run instead of the shift route (eager only)."""
        layer = self.attention
        if not layer.hard or layer.impl != "auto" or (layer.training and layer.dropout > 0):
            return True
        if torch.compiler.is_compiling() or torch.jit.is_tracing():
            return False
        return not torch.equal(layer.position.centers, self._tap_centers)

    @torch.jit.unused
    def _layer_forward(self, x: Tensor) -> Tensor:
        """The attention layer's own forward on the padded image, read at the query pixels."""
        if self.one_d:
            x = x.unsqueeze(2)
        height, width = x.shape[2], x.shape[3]
        (top, bottom), (left, right) = self.input_padding(height, width)
        if top + bottom + left + right > 0:
            x = F.pad(x, (left, right, top, bottom), mode=self._pad_mode)
        out_h, out_w = self.output_size(height, width)
        rows = torch.arange(out_h, device=x.device) * self._stride[0] + self._anchor[0]
        cols = torch.arange(out_w, device=x.device) * self._stride[1] + self._anchor[1]
        y = self.attention(x.permute(0, 2, 3, 1))  # (B, Hp, Wp, out)
        y = y.index_select(1, rows).index_select(2, cols).permute(0, 3, 1, 2)
        y = y.contiguous()  # a drop-in for the conv: callers may .view() its output
        return y.squeeze(2) if self.one_d else y

    @torch.jit.unused
    def _check_input(self, x: Tensor) -> None:
        layout = "(B, C, L) or (C, L)" if self.one_d else "(B, C, H, W) or (C, H, W)"
        if not isinstance(x, Tensor):
            raise TypeError(f"expected a torch.Tensor of shape {layout}, got {type(x).__name__}")
        batched = 3 if self.one_d else 4
        if x.dim() not in (batched, batched - 1) or x.shape[-batched + 1] != self.in_channels:
            raise ValueError(
                f"expected input of shape {layout} with C={self.in_channels}, got shape "
                f"{tuple(x.shape)}"
            )
        if x.dtype != self.weight.dtype and not torch.is_autocast_enabled(x.device.type):
            raise TypeError(
                f"expected input dtype {self.weight.dtype} (the module's), got {x.dtype}"
            )
        height, width = (1, x.shape[-1]) if self.one_d else (x.shape[-2], x.shape[-1])
        pads = self.input_padding(height, width)
        padded = self.padded_size(height, width)
        for axis, n, n_pad, k, d, (before, after) in zip(
            ("height", "width"), (height, width), padded, self._kernel, self._dilation, pads,
            strict=True,
        ):  # fmt: skip
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
            if self.padding_mode == "reflect" and max(before, after) >= n:
                raise ValueError(
                    f"reflect padding of {max(before, after)} needs an input {axis} larger than "
                    f"that, got {n}"
                )


def _drop_attention_keys(module: AttentionConv, state_dict: dict, prefix: str, _meta) -> None:
    """State-dict post-hook: keep the convolution's keys only (``weight``, ``bias``, and the
    weight transform's, without their ``weight_transform.`` prefix, as the layer names them)."""
    for key in [k for k in state_dict if k.startswith(prefix + "attention.")]:
        del state_dict[key]
    transform = prefix + "weight_transform."
    for key in [k for k in state_dict if k.startswith(transform)]:
        state_dict[prefix + key.removeprefix(transform)] = state_dict.pop(key)


def _fill_attention_keys(module: AttentionConv, state_dict: dict, prefix: str, *_args) -> None:
    """Load pre-hook: the weight transform's and the attention layer's entries from the
    convolution's and the construction."""
    layer = prefix + "attention."
    for key in module.weight_transform.state_dict():
        if prefix + key in state_dict:
            value = state_dict.pop(prefix + key)
            state_dict[prefix + "weight_transform." + key] = value
            state_dict[layer + "out.parametrizations.weight.0.transform." + key] = value
    derived = {
        layer + "position.centers": module.attention.position.centers.detach(),
        layer + "position.spread": module.attention.position.spread.detach(),
    }
    if prefix + "weight" in state_dict:
        derived[layer + "out.parametrizations.weight.original"] = state_dict[prefix + "weight"]
    if prefix + "bias" in state_dict:
        derived[layer + "out.bias"] = state_dict[prefix + "bias"]
    for key, value in derived.items():
        state_dict.setdefault(key, value)


def conv_to_attention(conv: nn.Conv1d | nn.Conv2d, spread: float | None = None) -> AttentionConv:
    r"""Turn a convolution into multi-head self-attention that computes the same function.

    Args:
        conv: an ``nn.Conv2d`` or ``nn.Conv1d``: any kernel size, stride, dilation, padding (ints,
            ``"same"``, ``"valid"``), ``padding_mode`` (zeros, circular, reflect, replicate), bias
            or none, any ``groups`` (depthwise included). Its class's own ``forward`` is assumed;
            [`convert_model`][attnconv.convert.model.convert_model] checks it.
        spread: ``None`` for hard attention (the exact $s \to \infty$ limit), or a finite inverse
            standard deviation $s$ (in 1/pixels) shared by all heads; the error against the
            convolution falls like $\exp(-s^2/2)$.
    Returns:
        An [`AttentionConv`][] with the convolution's layout, on its device and dtype; its
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


def _same_padding(size: int, kernel: int, stride: int, dilation: int) -> tuple[int, int]:
    """TensorFlow's ``"SAME"`` padding ``(before, after)`` of one axis: ``⌈size/stride⌉`` outputs."""
    out = (size + stride - 1) // stride
    total = max((out - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)
    return total // 2, total - total // 2


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
