r"""``MultiHeadSelfAttention2d``: self-attention over the pixels of an image.

Each head $h$ computes $P^h = \operatorname{softmax}(A^h)$ over key pixels, with $A^h$ a sum of the
scores it is configured with ([the mathematics, §1][1-pixels-offsets-and-the-attention-layer]), and
the layer returns $\sum_h P^h V^h W^h_\text{out} + b_\text{out}$.

Routes, all exact (tested against ``impl="dense"``, the plain per-image $N \times N$ reference, and
against float64 explicit attention):

* position-only, separable (isotropic ``gaussian``, ``learned``): $P^h = R^h \otimes C^h$; attend
  along rows with $R^h$ ($H \times H$) and along columns with $C^h$ ($W \times W$). $O(N (H + W))$
  per head and image, no $N \times N$ tensor: ``separable``, all heads at once (two batched
  products), or without a value projection ``per head, chunks of C`` (and ``per head, pixels
  first, chunks of C``, each chunk held pixels first), heads attended and projected one at a time
  over chunks of images, so that in float32 no tensor of ``heads ×`` the input's size exists
  either (in 16 bits one of ``heads ×`` a chunk; ``attention/separable.py``).
* position-only, ``shared``: $P^h$ ($N \times N$) built once per forward and applied to the whole
  batch as one matrix product; the only route of a score that does not separate
  (``gaussian_full``).
* with content scores (``attention/content.py``): per-image ``(B, heads, N, N)`` logits from
  batched products, on a CPU a block of images at a time: a positional term shared by the batch
  is added as one ``(heads, N, N)`` bias; the per-image content × position term (with the
  positional one) is folded into the queries and keys. Where the probabilities are not returned
  and nothing is folded, ``scaled_dot_product_attention`` with the bias as mask is a route too.

Which route runs is measured (``attention/routes.py``): on the first call with a key (the route
family, the shapes, the dtype, with or without gradients, the device and threads) each candidate
is timed on the real tensors and the fastest is kept. Where routes are not measured (timing off,
``torch.compile``, tracing) the rules decide: ``use_shared_route`` and ``use_fused_route`` here,
``content.uses_sdpa`` and ``content.block_entries`` for content scores.

Attention dropout (probability ``dropout``) acts on the probabilities. With content scores it is the
usual independent mask per image, head and entry. Position-only probabilities are the same for
every image, and the layer keeps them shared: one mask per forward, shared by the batch, **factored
as** $M = M_\text{row} \otimes M_\text{col}$ with independent Bernoulli masks on the row and column
factors, each keeping an entry with probability $\sqrt{1 - p}$ and rescaled by $1/\sqrt{1 - p}$.
Each entry of $P$ is kept with probability $1 - p$ and the expectation of the output is unchanged,
as with plain dropout; entries sharing a row (or column) offset pair are dropped together. The dense
reference path draws and applies exactly the same factored mask, so both paths agree sample by
sample.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnconv.attention import content, routes, scores, separable
from attnconv.attention.positional import Positional, PositionalScore, positional_score_class
from attnconv.attention.separable import separable_attention_project
from attnconv.errors import warn_deprecated

IMPLEMENTATIONS: tuple[str, ...] = ("auto", "dense")
FUSED_MIN_ELEMENTS = 1 << 16
"""Separable layers without a value projection (every head attends over the raw input, as in the
paper) whose input holds at least this many numbers attend one head at a time, fused with the
output projection (``attention/separable.py``). Smaller inputs attend all heads at once: there the
per-head loop's fixed cost per operation dominates. With a value projection the input is already
``heads`` values wide and the batched route measured as fast or faster."""
FUSED_DEVICE_TYPES: tuple[str, ...] = ("cpu",)


SHARED_MAX_TOKENS: dict[str, int] = {"cuda": 32 * 32}
"""Separable position-only layers on a device of these types, with at most this many tokens, attend
through the shared ``(heads, N, N)`` matrix (``_forward_shared``: one matrix product over the
whole batch) instead of the separable factors, where routes are not measured
(``attention/routes.py``). Measured with ``benchmarks/gpu.sh`` on an NVIDIA H200 ([the
figures][on-a-gpu]), forward and backward in float32: the one product beat the separable route's
two batched products and their permutations 1.6× at 16×16 (the paper's size) and tied at 32×32;
the separable route won 5.5× at 64×64. On an AMD EPYC Zen 5 the separable route was faster at
every size measured, so the CPU has no entry; on an Intel Xeon with AMX in bfloat16 the shared
matrix is faster at 14×14 and 16×16 (its matrix unit runs the one large product), which the
measured choice finds there."""


def use_shared_route(device: torch.device, tokens: int) -> bool:
    """Whether a separable position-only layer attends through the shared ``(heads, N, N)``
    matrix on ``device`` for an image of ``tokens`` pixels (see ``SHARED_MAX_TOKENS``)."""
    return tokens <= SHARED_MAX_TOKENS.get(device.type, 0)


def use_fused_route(device: torch.device, numel: int, value_projection: bool) -> bool:
    """Whether a separable layer attends one head at a time (``separable_attention_project``)
    where routes are not measured (``attention/routes.py``).

    Only on a CPU (``FUSED_DEVICE_TYPES``), without a value projection, for an input of at least
    ``FUSED_MIN_ELEMENTS`` numbers. The per-head loop was measured faster only on CPUs, where it
    saves memory traffic; on a GPU its ``heads`` small launches per product would idle the device,
    so CUDA takes the batched route (two batched products for all heads). That GPU choice is
    unmeasured.
    """
    return (device.type in FUSED_DEVICE_TYPES and not value_projection
            and numel >= FUSED_MIN_ELEMENTS)


Projection = tuple[Tensor, Tensor | None]
"""A linear map's ``(weight (out, in), bias (out,) | None)``, as ``F.linear`` takes them."""
PositionRoute = Callable[[Tensor, bool, Projection], tuple[Tensor, Tensor | None]]
"""A position-only route: ``(x, return_attention, projection)`` → ``(y, probs | None)``."""


def per_head_route(chunk: int, layout: str = "images") -> str:
    """The name of the per-head separable route with chunks of ``chunk`` values, in ``layout``
    (``separable.LAYOUTS``; ``"pixels"``: each chunk held pixels first)."""
    order = "" if layout == "images" else " pixels first,"
    return f"per head,{order} chunks of {chunk}"


def fold_pays(first: nn.Linear, then: nn.Linear, tokens: int) -> bool:
    """Whether ``then(first(y))`` for ``tokens`` rows of ``y`` takes fewer multiply-adds as one map
    (``fold_linear``: ``then.weight @ first.weight`` once, then one product per row) than as
    two. For square maps that is when the rows outnumber ``first``'s inputs (plus one for its
    bias): a BERT layer's dense map folds into the output projection of ``heads·head_dim``
    channels once the batch has more pixels than that (at 14×14 with 144 channels, always; at
    16×16 with 3,600 channels, from 15 images)."""
    inner, middle, outer = first.in_features, first.out_features, then.out_features
    two_maps = tokens * (inner * middle + middle * outer)
    composite = outer * middle * (inner + (first.bias is not None))  # weight and bias
    return composite + tokens * inner * outer < two_maps


def fold_linear(first: nn.Linear, then: nn.Linear) -> Projection:
    """``then ∘ first`` as one map: weight ``then.weight @ first.weight`` ``(then.out, first.in)``
    and bias ``then.weight @ first.bias + then.bias``. The same function (to rounding), and the
    gradients reach both maps' parameters through the composite by the chain rule, so training is
    unchanged; only the products differ."""
    weight = then.weight @ first.weight
    if first.bias is None:
        return weight, then.bias
    return weight, F.linear(first.bias, then.weight, then.bias)


_LEGACY_NAMES = {
    "centers": "centers",
    "spread": "spread",
    "row_embedding": "row_embedding",
    "col_embedding": "col_embedding",
    "positional_weight": "weight",
}
"""Layer attribute / state-dict name before the scores were modules → name in ``position``."""


def _rename_legacy_keys(
    layer: MultiHeadSelfAttention2d, state_dict: dict, prefix: str, *_args
) -> None:
    """Load pre-hook: state dicts saved before the scores were modules (``centers``,
    ``positional_weight``, …) load into ``position.centers``, ``position.weight``, …."""
    for old, new in _LEGACY_NAMES.items():
        if prefix + old in state_dict:
            state_dict[f"{prefix}position.{new}"] = state_dict.pop(prefix + old)


def _legacy_attribute(layer: MultiHeadSelfAttention2d, old: str) -> Tensor:
    """``layer.<old>`` (deprecated): ``layer.position.<new>``, with one DeprecationWarning."""
    new = _LEGACY_NAMES[old]
    if layer.position is None or not hasattr(layer.position, new):
        raise AttributeError(
            f"{type(layer).__name__} with positional={layer.positional!r} has no {old!r}"
        )
    warn_deprecated(
        f"MultiHeadSelfAttention2d.{old}",
        f"MultiHeadSelfAttention2d.{old} is deprecated; use layer.position.{new} "
        "(the positional score module)",
        stacklevel=3,
    )
    return getattr(layer.position, new)


class MultiHeadSelfAttention2d(nn.Module):
    r"""Multi-head self-attention over an ``H×W`` grid of ``dim``-channel pixels.

    Args:
        dim: channels of the input pixels.
        heads: number of heads ``Nh``.
        head_dim: channels each head attends over; defaults to ``dim``. When equal to ``dim`` there
            is no value projection: every head attends over the raw input (the paper's model, where
            $W_\text{val} W_\text{out}$ is one matrix per head held by ``out``).
        positional: ``"gaussian"`` (isotropic quadratic), ``"gaussian_full"`` (generalized
            quadratic, $\Sigma^{-1} = S S^\top$), ``"learned"`` (learned relative row/column
            embeddings) or ``None``.
        content: add the content score $(X_q W_\text{qry})^\top (X_k W_\text{key}) / \sqrt d$, $d$ =
            ``head_dim``.
        content_positional: add $(X_q W_\text{qry})^\top r_\delta / \sqrt d$; needs
            ``positional="learned"``.
        position_term: ``positional="learned"`` only: keep its position-only term
            $w_h^\top r_\delta$ (default). ``False`` drops it (and the head vectors $w_h$): the
            tables then enter only through ``content_positional``, which must be on. The three
            content forms of [the mathematics, §1][content-models]: the paper's code
            $w \cdot r + q \cdot k / \sqrt d$ (``content=True``), its later variant
            $q \cdot r / \sqrt d + q \cdot k / \sqrt d$
            (``content=True, content_positional=True, position_term=False``), all three terms
            (``content=True, content_positional=True``).
        positional_init: initialisation of the positional score, ``"original"`` (the paper's code:
            learned tables $\mathcal N(0, 1)$, head keys $\mathcal U(\pm 1/\sqrt{\text{fan\_in}})$)
            or ``"bert"`` (tables $\mathcal N(0, 0.02^2)$); see ``attention/positional.py``.
            Gaussian scores start as the paper says under both, or with ``"grid"`` on the taps of a
            $K \times K$ kernel ($K^2$ = ``heads``, inverse std ``GRID_SPREAD``), Theorem 1's
            construction as a start.
        dropout: attention dropout probability on the probabilities (see module docstring).
        out_dim: channels of the output pixels; defaults to ``dim``.
        max_size: largest image side the learned embeddings cover (offsets ``±(max_size−1)``).
        hard: ``gaussian`` only: use the exact $s \to \infty$ limit of the score (all mass on the
            pixel nearest $q + \Delta$), as in the constructive proof of Theorem 1.
        impl: ``"auto"`` (fastest exact path) or ``"dense"`` (explicit per-image ``N×N``
            reference); settable after construction.

    Shapes: input ``(B, H, W, dim)`` → output ``(B, H, W, out_dim)``; any ``H×W``.
    Submodules: ``position``, the positional score (``attention/positional.py``; ``None`` without
    one), which holds its parameters: ``centers (heads, 2)`` offsets in pixels (row, col) and
    ``spread`` ``(heads,)`` inverse std or ``(heads, 2, 2)`` = $S$; or ``row_embedding`` /
    ``col_embedding`` ``(2·max_size−1, ·)`` and ``weight (heads, head_dim)``. ``query``/``key``
    ``Linear(dim, heads·head_dim)``; ``value`` (only when ``head_dim ≠ dim``); ``out``
    ``Linear(heads·head_dim, out_dim)``.
    """

    position: PositionalScore | None

    def __init__(
        self,
        dim: int,
        heads: int,
        head_dim: int | None = None,
        positional: Positional | None = "gaussian",
        content: bool = False,
        content_positional: bool = False,
        dropout: float = 0.0,
        out_dim: int | None = None,
        max_size: int = 32,
        hard: bool = False,
        impl: Literal["auto", "dense"] = "auto",
        position_term: bool = True,
        positional_init: str = "original",
    ) -> None:
        super().__init__()
        head_dim = dim if head_dim is None else head_dim
        out_dim = dim if out_dim is None else out_dim
        for name, value in (
            ("dim", dim),
            ("heads", heads),
            ("head_dim", head_dim),
            ("out_dim", out_dim),
            ("max_size", max_size),
        ):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        score = None if positional is None else positional_score_class(positional)
        if score is None and not content:
            raise ValueError("a layer needs a score: set positional and/or content=True")
        if content_positional and not (score is not None and score.has_embeddings):
            raise ValueError(
                f"content_positional=True needs positional='learned' (relative embeddings r_δ), "
                f"got positional={positional!r}"
            )
        if not position_term and not content_positional:
            raise ValueError(
                "position_term=False drops the learned score's only position-only term; it needs "
                "content_positional=True, where the tables still enter the logits"
            )
        if hard and (score is None or content):
            raise ValueError(
                "hard=True is the s → ∞ limit of positional='gaussian' without content"
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")

        self.dim, self.heads, self.head_dim, self.out_dim = dim, heads, head_dim, out_dim
        self.content, self.content_positional = content, content_positional
        self.dropout, self.max_size = float(dropout), max_size
        self.impl = impl

        # ``position`` is registered first, so its parameters come first in state dicts and
        # optimizer groups as before it was a module (old optimizer states still line up), and
        # built last, so a seed draws the same initial weights as before.
        self.register_module("position", None)
        self.query = nn.Linear(dim, heads * head_dim) if (content or content_positional) else None
        self.key = nn.Linear(dim, heads * head_dim) if content else None
        self.value = nn.Linear(dim, heads * head_dim) if head_dim != dim else None
        self.out = nn.Linear(heads * head_dim, out_dim)
        if score is not None:
            self.position = score.for_layer(
                heads, head_dim, max_size, hard, init=positional_init, position_term=position_term
            )
        self.register_load_state_dict_pre_hook(_rename_legacy_keys)

    def __getattr__(self, name: str) -> Tensor | nn.Module:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name not in _LEGACY_NAMES:
                raise
        # Deprecated (one release): the score's parameters as the layer held them before.
        return _legacy_attribute(self, name)

    # ------------------------------------------------------------------ parameters

    @property
    def impl(self) -> str:
        return self._impl

    @impl.setter
    def impl(self, value: str) -> None:
        if value not in IMPLEMENTATIONS:
            raise ValueError(f"impl must be one of {IMPLEMENTATIONS}, got {value!r}")
        self._impl = value

    @property
    def positional(self) -> str | None:
        """Name of the positional score (a key of ``POSITIONAL_SCORES``), or ``None``."""
        return None if self.position is None else self.position.name

    @property
    def position_term(self) -> bool:
        """True when the positional score adds its position-only term to the logits (every
        positional score, except a learned one built with ``position_term=False``)."""
        return self.position is not None and self.position.position_term

    @property
    def hard(self) -> bool:
        r"""True for the $s \to \infty$ limit of the isotropic Gaussian score."""
        return self.position is not None and self.position.hard

    @property
    def has_centers(self) -> bool:
        """True when the heads are Gaussian bumps with centres (``head_geometry`` works)."""
        return self.position is not None and self.position.has_centers

    @property
    def position_only(self) -> bool:
        """True when the probabilities depend on positions only (the same for every image)."""
        return not (self.content or self.content_positional)

    @property
    def separable(self) -> bool:
        r"""True when position-only probabilities factor as $R \otimes C$ (row and column terms)."""
        return self.position_only and self.position.separable

    def reset_positional_parameters(self) -> None:
        r"""Initialise the positional score again (``position.reset_parameters``):
        $\Delta \sim \mathcal N(0, 2^2)$, $s = 1 + \mathcal N(0, 0.01^2)$,
        $S = I + \mathcal N(0, 0.01^2)$; learned tables and keys as the layer's
        ``positional_init`` says."""
        if self.position is not None:
            self.position.reset_parameters()

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, heads={self.heads}, head_dim={self.head_dim}, "
            f"out_dim={self.out_dim}, positional={self.positional!r}, content={self.content}, "
            f"content_positional={self.content_positional}, dropout={self.dropout}"
            + ("" if self.position is None or self.position_term else ", position_term=False")
        )

    # ------------------------------------------------------------------ validation

    def _check_input(self, x: Tensor) -> tuple[int, int, int]:
        if not isinstance(x, Tensor):
            raise TypeError(
                f"expected a torch.Tensor of shape (B, H, W, {self.dim}), got {type(x).__name__}"
            )
        if x.dim() != 4:
            raise ValueError(
                f"expected input of shape (B, H, W, {self.dim}) (channels last), got shape {tuple(x.shape)}"
            )
        if x.shape[-1] != self.dim:
            raise ValueError(
                f"expected {self.dim} channels in the last dimension (B, H, W, {self.dim}), "
                f"got shape {tuple(x.shape)}"
            )
        if not x.is_floating_point():
            raise TypeError(f"expected a floating-point input, got dtype {x.dtype}")
        batch, height, width, _ = x.shape
        self._check_size(height, width)
        return batch, height, width

    def covers(self, height: int, width: int) -> bool:
        """Whether the layer is defined on an ``H×W`` image (its positional score covers it)."""
        return self.position is None or self.position.covers(height, width)

    def _check_size(self, height: int, width: int) -> None:
        if height < 1 or width < 1:
            raise ValueError(f"image must have at least one pixel, got H={height}, W={width}")
        if self.position is not None:
            self.position.check_size(height, width)

    # ------------------------------------------------------------------ positional terms

    def attention_probs(self, height: int, width: int) -> Tensor:
        """Probabilities ``(heads, H·W, H·W)`` of a position-only layer (no dropout).

        Row-major pixel order; ``out[h, q, k]`` is the weight of key pixel ``k`` for query ``q``.
        """
        if not self.position_only:
            raise ValueError(
                "attention_probs(H, W) needs a position-only layer; with content scores the "
                "probabilities depend on the image: use forward(x, return_attention=True)"
            )
        self._check_size(height, width)
        return self._position_probs(height, width)

    def _position_probs(self, height: int, width: int) -> Tensor:
        """Position-only probabilities ``(heads, H·W, H·W)``: the Kronecker product of the
        factors' (for a separable score, hard ones included), else the softmax of the logits."""
        if self.separable:
            return scores.kron_factors(*self.position.probability_factors(height, width))
        return scores.softmax_without_subnormals(self.position.logits(height, width))

    def _factored_dropout_masks(
        self, height: int, width: int, like: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Row ``(heads, H, H)`` and column ``(heads, W, W)`` dropout masks, already rescaled."""
        keep = math.sqrt(1.0 - self.dropout)
        opts = {"device": like.device, "dtype": like.dtype}
        row = (torch.rand(self.heads, height, height, device=like.device) < keep).to(**opts) / keep
        col = (torch.rand(self.heads, width, width, device=like.device) < keep).to(**opts) / keep
        return row, col

    @property
    def _dropout_active(self) -> bool:
        return self.training and self.dropout > 0.0

    # ------------------------------------------------------------------ forward

    def forward(
        self, x: Tensor, return_attention: bool = False, then: nn.Linear | None = None
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Attend over the pixels of ``x (B, H, W, dim)``; returns ``(B, H, W, out_dim)``, or
        ``(B, H, W, then.out_features)`` with ``then``.

        With ``return_attention=True`` also returns the probabilities ``(B, heads, H·W, H·W)``
        (before dropout; for position-only layers an expanded view of one shared matrix).

        ``then``, a linear map applied to the output (a BERT layer's dense layer), is folded into
        the output projection where that takes fewer multiply-adds (``fold_linear``).
        """
        batch, height, width = self._check_input(x)
        projection, after = self._output_projection(then, batch * height * width)
        if batch == 0:
            y, probs = self._forward_empty(x, projection)
        elif self.impl == "dense":
            y, probs = self._forward_dense(x, projection)
        elif self.position_only:
            y, probs = self._forward_position(x, return_attention, projection)
        else:
            y, probs = self._forward_content(x, return_attention, projection)
        if after is not None:
            y = after(y)
        if not return_attention:
            return y
        n = height * width
        # (heads, N, N) shared by the batch, or (B, heads, N, N) -> (B, heads, N, N)
        return y, probs.expand(batch, self.heads, n, n)

    def _forward_empty(self, x: Tensor, projection: Projection) -> tuple[Tensor, Tensor]:
        """An empty batch ``x (0, H, W, dim)``: the empty output ``(0, H, W, out_dim)`` of the
        value and output projections (so autograd reaches ``x``), and no probabilities
        ``(0, heads, H·W, H·W)``, as torch's layers answer an empty batch."""
        values = self._values(x)  # (0, heads|1, H, W, head_dim)
        _, _, height, width, head_dim = values.shape
        y = self._project_out(values.expand(0, self.heads, height, width, head_dim), projection)
        n = height * width
        return y, x.new_zeros(0, self.heads, n, n)

    def _values(self, x: Tensor) -> Tensor:
        """``(B, heads, H, W, head_dim)``, or ``(B, 1, H, W, dim)`` when heads share the raw input."""
        batch, height, width, _ = x.shape
        if self.value is None:
            return x.unsqueeze(1)
        v = self.value(x)  # (B, H, W, heads·d)
        v = v.view(batch, height, width, self.heads, self.head_dim)  # (B, H, W, heads, d)
        return v.permute(0, 3, 1, 2, 4)  # (B, heads, H, W, d)

    def _output_projection(
        self, then: nn.Linear | None, tokens: int
    ) -> tuple[Projection, nn.Linear | None]:
        """The output projection's ``(weight, bias)`` for ``tokens`` pixels in all, with ``then``
        folded in where that is cheaper (``fold_linear``), and the map still to apply after it
        (``then`` when it was not folded, else ``None``)."""
        own = (self.out.weight, self.out.bias)
        if then is None:
            return own, None
        if not isinstance(then, nn.Linear) or then.in_features != self.out_dim:
            raise TypeError(
                f"then must be an nn.Linear taking the layer's {self.out_dim} output channels, "
                f"got {then!r}"
            )
        if not fold_pays(self.out, then, tokens):
            return own, then
        return fold_linear(self.out, then), None

    def _project_out(self, y: Tensor, projection: Projection) -> Tensor:
        """``y (B, heads, H, W, head_dim)`` → output ``(B, H, W, out)`` through ``projection``,
        ``(weight (out, heads·head_dim), bias (out,) | None)``."""
        batch, heads, height, width, head_dim = y.shape
        y = y.permute(0, 2, 3, 1, 4)  # (B, H, W, heads, d)
        y = y.reshape(batch, height, width, heads * head_dim)  # (B, H, W, heads·d)
        return F.linear(y, *projection)

    def _values_pixels_first(self, x: Tensor, axis: int) -> Tensor:
        """Values with one spatial axis first: ``(heads|1, L, rest)`` for a big matrix product.

        ``axis=2`` gives ``(·, W, B·H·d)`` (columns first), ``axis=-1`` gives ``(·, H·W, B·d)``.
        """
        v = self._values(x)  # (B, heads|1, H, W, d)
        if axis == 2:
            v = v.permute(1, 3, 0, 2, 4)  # (heads|1, W, B, H, d)
            return v.reshape(v.shape[0], x.shape[2], -1)  # (heads|1, W, B·H·d)
        v = v.permute(1, 2, 3, 0, 4)  # (heads|1, H, W, B, d)
        return v.reshape(v.shape[0], x.shape[1] * x.shape[2], -1)  # (heads|1, N, B·d)

    @staticmethod
    def _apply_per_head(probs: Tensor, values: Tensor) -> Tensor:
        """``probs (heads, L, L) @ values (heads|1, L, M)`` → ``(heads, L, M)``.

        Values shared by all heads become one ``(heads·L, L) @ (L, M)`` matrix product.
        """
        heads, length, _ = probs.shape
        if values.shape[0] == 1:
            # (heads·L, L) @ (L, M) -> (heads·L, M) -> (heads, L, M)
            return (probs.reshape(heads * length, length) @ values[0]).view(heads, length, -1)
        return torch.bmm(probs, values)

    def _position_routes(self, x: Tensor) -> dict[str, PositionRoute]:
        """The exact routes of a position-only layer for ``x``, by name (``attention/routes.py``
        picks one): ``"shared"``, the ``(heads, N, N)`` matrix; for a separable score also
        ``"separable"``, its factors for all heads at once, and without a value projection
        ``"per head, chunks of C"`` and ``"per head, pixels first, chunks of C"``, one head at
        a time in chunks of ``C`` values (``separable.LAYOUTS``), for each
        chunk size of ``separable.chunk_candidates`` that cuts ``x``'s batch differently (the
        rule's ``CHUNK_ELEMENTS`` first)."""
        found: dict[str, PositionRoute] = {"shared": self._forward_shared}
        if self.separable:
            found["separable"] = partial(self._forward_separable, chunk=None)
            if self.value is None:
                batch, height, width, dim = x.shape
                chunks = {}  # images per chunk -> chunk size
                for chunk in (separable.CHUNK_ELEMENTS, *separable.chunk_candidates()):
                    chunks.setdefault(min(batch, max(1, chunk // (height * width * dim))), chunk)
                for layout in separable.LAYOUTS:
                    for chunk in sorted(chunks.values(), reverse=True):
                        found[per_head_route(chunk, layout)] = partial(
                            self._forward_separable, chunk=chunk, layout=layout
                        )
        return found

    def _position_rule(self, x: Tensor) -> str:
        """The rule-based route of a position-only layer for ``x`` (``use_shared_route``,
        ``use_fused_route``), taken where routes are not measured."""
        if not self.separable or use_shared_route(x.device, x.shape[1] * x.shape[2]):
            return "shared"
        if use_fused_route(x.device, x.numel(), self.value is not None):
            return per_head_route(separable.CHUNK_ELEMENTS)
        return "separable"

    def _forward_position(
        self, x: Tensor, return_attention: bool, projection: Projection
    ) -> tuple[Tensor, Tensor | None]:
        """Position-only attention on the route measured fastest for this key
        (``attention/routes.py``), or the rule-based one where routes are not measured."""
        found = self._position_routes(x)
        batch, height, width, _ = x.shape
        parameters = [p for p in self.parameters() if p.requires_grad]
        needs_grad = torch.is_grad_enabled() and (
            x.requires_grad or bool(parameters) or any(
                t is not None and t.requires_grad for t in projection
            )
        )
        shape = {
            "batch": batch,
            "height": height,
            "width": width,
            "dim": self.dim,
            "heads": self.heads,
            "head_dim": self.head_dim,
            "out": projection[0].shape[0],
            "score": self.positional + ("-hard" if self.hard else ""),
            "value": self.value is not None,
            "dropout": self._dropout_active,
            "probs": return_attention,
        }

        def run(name: str, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
            return found[name](x, return_attention, (weight, bias))[0]

        dtype = routes.autocast_dtype(x)
        name = routes.SELECTOR.choose(
            routes.route_key("position", shape, dtype, needs_grad, x.device),
            {name: routes.trial(partial(run, name), (x, *projection), parameters, needs_grad)
             for name in found},
            self._position_rule(x),
            x.device,
        )
        return found[name](x, return_attention, projection)

    def _forward_separable(
        self,
        x: Tensor,
        return_attention: bool,
        projection: Projection,
        chunk: int | None,
        layout: str = "images",
    ) -> tuple[Tensor, Tensor | None]:
        """``P^h = R^h ⊗ C^h``: attend along columns with ``C^h``, then along rows with ``R^h``;
        all heads at once (``chunk=None``) or one head at a time in chunks of ``chunk`` values,
        each chunk in ``layout`` (``separable_attention_project``)."""
        batch, height, width, _ = x.shape
        row, col = self.position.probability_factors(height, width)
        probs = scores.kron_factors(row, col) if return_attention else None
        if self._dropout_active:
            mask_row, mask_col = self._factored_dropout_masks(height, width, row)
            row, col = row * mask_row, col * mask_col
        if chunk is not None:
            y = separable_attention_project(
                x, row, col, *projection, chunk_elements=chunk, layout=layout
            )
            return y, probs
        # All heads at once: two batched products, then the output projection.
        v = self._values_pixels_first(x, axis=2)  # (heads|1, W, B·H·d)
        d = v.shape[-1] // (batch * height)
        # Columns: t[h, q2, (b, k1, c)] = Σ_k2 col[h, q2, k2] v[h, k2, (b, k1, c)].
        t = self._apply_per_head(col.to(v.dtype), v).view(self.heads, width, batch, height, d)
        # Rows: y[h, q1, (q2, b, c)] = Σ_k1 row[h, q1, k1] t[h, k1, (q2, b, c)].
        t = t.permute(0, 3, 1, 2, 4).reshape(self.heads, height, width * batch * d)
        y = torch.bmm(row.to(v.dtype), t).view(self.heads, height, width, batch, d)
        return self._project_out(y.permute(3, 0, 1, 2, 4), projection), probs  # (B, heads, H, W, d)

    def _forward_shared(
        self, x: Tensor, return_attention: bool, projection: Projection
    ) -> tuple[Tensor, Tensor]:
        """Position-only: one ``(heads, N, N)`` matrix applied to the whole batch (and returned,
        whatever ``return_attention``). Dropout draws the same factored mask as the separable
        route, so the two agree sample by sample."""
        batch, height, width, _ = x.shape
        probs = self._position_probs(height, width)
        applied = probs
        if self._dropout_active:
            mask = scores.kron_factors(*self._factored_dropout_masks(height, width, probs))
            applied = probs * mask
        v = self._values_pixels_first(x, axis=-1)  # (heads|1, N, B·d)
        d = v.shape[-1] // batch
        y = self._apply_per_head(applied.to(v.dtype), v)  # (heads, N, B·d)
        y = y.view(self.heads, height, width, batch, d)
        return self._project_out(y.permute(3, 0, 1, 2, 4), projection), probs  # (B, heads, H, W, d)

    def _content_logits(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """Query ``(B, heads, N, d)``, key ``(B, heads, N, d)`` or None, and the bias logits."""
        batch, height, width, _ = x.shape
        n = height * width

        def split_heads(t: Tensor) -> Tensor:
            return t.view(batch, n, self.heads, self.head_dim).transpose(1, 2)  # (B, heads, N, d)

        q = split_heads(self.query(x))  # (B, N, heads·d) -> (B, heads, N, d)
        k = split_heads(self.key(x)) if self.key is not None else None
        bias = None
        if self.position_term:
            bias = self.position.logits(height, width).to(q.dtype)  # (heads, N, N)
        if self.content_positional:
            cp = scores.content_positional_logits(
                q, self.position.row_embedding, self.position.col_embedding, height, width
            )  # (B, heads, N, N)
            bias = cp if bias is None else bias + cp
        return q, k, bias

    def _forward_content(
        self, x: Tensor, return_attention: bool, projection: Projection
    ) -> tuple[Tensor, Tensor | None]:
        """Content scores through ``attention/content.py``: per-image separable terms folded into
        the product, a positional term shared by the batch added as a bias."""
        batch, height, width, _ = x.shape
        n = height * width

        def split_heads(t: Tensor) -> Tensor:
            return t.view(batch, n, self.heads, self.head_dim).transpose(1, 2)  # (B, heads, N, d)

        # Queries divided by √d through the projection's weights: a (heads·d, dim) product, not a
        # pass over every query, forward and backward.
        scale = 1.0 / math.sqrt(self.head_dim)
        q = split_heads(F.linear(x, self.query.weight * scale, self.query.bias * scale))
        k = split_heads(self.key(x)) if self.key is not None else None
        row = col = bias = None
        if self.content_positional:
            # Per image: folded into the product, together with the positional term.
            row, col = scores.content_positional_factors(
                q, self.position.row_embedding, self.position.col_embedding, height, width
            )  # (B, heads, N, H), (B, heads, N, W): q · r_δ / √d by key row and column
            if self.position_term:
                by_row, by_col = content.per_query(*self.position.factors(height, width))
                row, col = row + by_row, col + by_col  # + w · r_δ (learned: separable)
        elif self.position_term:
            # The same for every image: added as one (heads, N, N) bias, cheaper here than a
            # product H + W wider.
            bias = self.position.logits(height, width)  # (heads, N, N)
        y, probs = content.content_attention(
            q if k is not None else None,
            k,
            self._values(x).flatten(2, 3),  # (B, heads|1, N, d)
            row,
            col,
            bias,
            self.dropout if self._dropout_active else 0.0,
            return_probs=return_attention,
        )
        y = y.view(batch, self.heads, height, width, -1)  # (B, heads, H, W, d)
        return self._project_out(y, projection), probs

    def _content_probs(self, q: Tensor, k: Tensor | None, bias: Tensor | None) -> Tensor:
        """Explicit ``(B, heads, N, N)`` probabilities from content and positional logits."""
        logits = 0.0
        if k is not None:
            logits = (q @ k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        if bias is not None:
            logits = logits + bias
        return scores.softmax_without_subnormals(logits)

    def _forward_dense(self, x: Tensor, projection: Projection) -> tuple[Tensor, Tensor]:
        """Reference path: explicit per-image ``(B, heads, N, N)`` scores, softmax, weighted sum."""
        batch, height, width, _ = x.shape
        n = height * width
        if self.position_only:
            if self.hard:
                probs = scores.kron_factors(*self.position.probability_factors(height, width))
            else:
                logits = self.position.logits(height, width).expand(batch, self.heads, n, n)
                probs = scores.softmax_without_subnormals(logits)
            if self._dropout_active:
                mask = scores.kron_factors(*self._factored_dropout_masks(height, width, probs))
                applied = probs * mask
            else:
                applied = probs
            probs = probs.expand(batch, self.heads, n, n)
            applied = applied.expand(batch, self.heads, n, n)
        else:
            q, k, bias = self._content_logits(x)
            probs = self._content_probs(q, k, bias)
            applied = (
                F.dropout(probs, self.dropout, self.training) if self._dropout_active else probs
            )
        v = self._values(x).flatten(2, 3)  # (B, heads|1, N, d)
        y = applied.to(v.dtype) @ v  # (B, heads, N, d)
        y = y.view(batch, self.heads, height, width, -1)  # (B, heads, H, W, d)
        return self._project_out(y, projection), probs

    # ------------------------------------------------------------------ analysis and surgery

    @torch.no_grad()
    def head_geometry(self) -> dict[str, Tensor]:
        r"""Geometry of Gaussian heads.

        Returns ``centers (heads, 2)`` in pixels, ``covariance (heads, 2, 2)``
        ($\Sigma = (S S^\top)^{-1}$, or $I / s^2$; ``inf`` entries for a singular precision) and
        ``condition_number (heads,)`` of the covariance (``inf`` when singular, 1 for isotropic
        heads).
        """
        if not self.has_centers:
            raise ValueError(
                f"head_geometry() needs a gaussian layer, got positional={self.positional!r}"
            )
        return self.position.geometry()

    @torch.no_grad()
    def prune_heads(self, keep: Sequence[int]) -> None:
        """Keep only the heads listed in ``keep`` (in that order is irrelevant: sorted), in place."""
        keep_sorted = sorted({int(h) for h in keep})
        if not keep_sorted:
            raise ValueError("prune_heads needs at least one head to keep")
        if keep_sorted[0] < 0 or keep_sorted[-1] >= self.heads:
            raise ValueError(f"head indices must be in [0, {self.heads}), got {list(keep)}")
        index = torch.tensor(keep_sorted, device=self.out.weight.device)
        channels = (
            index[:, None] * self.head_dim + torch.arange(self.head_dim, device=index.device)
        ).flatten()
        if self.position is not None:
            self.position.select_heads(index)
        for name in ("query", "key", "value"):
            linear = getattr(self, name)
            if linear is not None:
                setattr(self, name, _select_linear(linear, rows=channels))
        self.out = _select_linear(self.out, cols=channels)
        self.heads = len(keep_sorted)


def _select_linear(
    linear: nn.Linear, rows: Tensor | None = None, cols: Tensor | None = None
) -> nn.Linear:
    """A new ``Linear`` holding the chosen output rows / input columns of ``linear``'s weight."""
    weight = linear.weight
    if rows is not None:
        weight = weight[rows]
    if cols is not None:
        weight = weight[:, cols]
    bias = linear.bias
    if bias is not None and rows is not None:
        bias = bias[rows]
    new = nn.Linear(
        weight.shape[1],
        weight.shape[0],
        bias=bias is not None,
        device=weight.device,
        dtype=weight.dtype,
    )
    new.weight.copy_(weight)
    if bias is not None:
        new.bias.copy_(bias)
    return new
