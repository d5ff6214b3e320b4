r"""Positional scores as modules: each owns its parameters, initialisation and logits.

A positional score gives every head $h$ a logit $A^h_{q,k}$ that depends on the offset
$\delta = k - q$ only ([the mathematics, §1][1-pixels-offsets-and-the-attention-layer], "Scores").
[`MultiHeadSelfAttention2d`][attnconv.attention.layer.MultiHeadSelfAttention2d] holds one of
these modules as ``layer.position``, picked by name from [`POSITIONAL_SCORES`][], and asks it for
everything that depends on the kind of score:

* ``logits(H, W)``: dense logits over pixel pairs ``(heads, H·W, H·W)``;
* ``factors(H, W)``: for a ``separable`` score (a row term plus a column term), row
  ``(heads, H, H)`` and column ``(heads, W, W)`` logits whose Kronecker sum is ``logits``;
* ``probability_factors(H, W)`` and ``offset_probs(H, W)``: the softmax of those, per factor, and
  each head's attention over all offsets, as for an interior query
  ([the mathematics, §2, "The other direction"][2-theorem-1-attention-can-be-any-convolution]);
* ``covers(H, W)`` / ``check_size(H, W)``: whether the score is defined on an ``H×W`` image;
* ``reset_parameters()``: the initialisation (``init``, see [`POSITIONAL_INITS`][]);
  ``select_heads(index)``: keep some heads;
* Gaussian scores (``has_centers``): ``centers`` and ``geometry()`` for head analysis.
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

import torch
from torch import Tensor, nn

from attnconv.attention import scores
from attnconv.attention.scores import softmax_without_subnormals


def _axis_offsets(n: int, like: Tensor) -> Tensor:
    """``(2n−1,)`` offsets ``−(n−1)..(n−1)`` along one axis, on ``like``'s device and dtype."""
    return torch.arange(-(n - 1), n, device=like.device, dtype=like.dtype)


POSITIONAL_INITS: tuple[str, ...] = ("original", "bert", "grid")
r"""Initialisations of the positional scores
([the mathematics, §4, "Initialisation"][initialisation]). Learned score: ``"original"`` as the
paper's code ran it (tables $\mathcal N(0, 1)$, each axis's head keys
$\mathcal U(\pm 1/\sqrt{d_\text{axis}})$), ``"bert"`` BERT's small tables ($\mathcal N(0, 0.02^2)$,
head vectors $\mathcal N(0, 1/d)$, $d$ = ``head_dim``). Gaussian scores: the paper's random start under ``"original"`` and
``"bert"`` alike, or ``"grid"``, Theorem 1's construction as a start ([`grid_centers`][]: the
$K^2$ heads on the taps of a $K \times K$ kernel, spread [`GRID_SPREAD`][])."""

GRID_SPREAD = 2.0
r"""Inverse standard deviation (1/pixels) of every head under ``init="grid"``: a head puts
$e^{-2} \approx 13.5\%$ of its centre tap's weight on each neighbouring tap, so it starts local but
not saturated (at $s = 4$ the softmax's gradients are $e^{-8}$ smaller and the geometry hardly
moves; ConViT's local start, $-\lVert \delta - \Delta \rVert^2$, is $s = \sqrt 2$)."""


def grid_centers(heads: int) -> Tensor:
    r"""``(heads, 2)`` offsets (row, col) in pixels of the $K \times K$ kernel taps,
    $K^2$ = ``heads``: head $h = iK + j$ sits on
    $(i - \lfloor K/2 \rfloor, j - \lfloor K/2 \rfloor)$, as in Theorem 1's construction for a
    convolution with "same" padding
    ([the mathematics, §2][2-theorem-1-attention-can-be-any-convolution]). ValueError unless
    ``heads`` is a square."""
    size = math.isqrt(heads)
    if size * size != heads:
        raise ValueError(
            f'positional init "grid" puts the heads on the taps of a K×K kernel and needs a '
            f"square number of heads (9, 16, 25, ...), got {heads}"
        )
    taps = torch.arange(size) - size // 2
    return torch.cartesian_prod(taps, taps).to(torch.get_default_dtype())


def _check_init(init: str, allowed: tuple[str, ...] = POSITIONAL_INITS) -> None:
    if init not in allowed:
        raise ValueError(f"positional init must be one of {allowed}, got {init!r}")


_RANDOM_INITS: tuple[str, ...] = ("original", "bert")
"""The initialisations of scores without centres (``"grid"`` places centres)."""


def _refuse_without_term(score: type[PositionalScore], position_term: bool) -> None:
    if not position_term:
        raise ValueError(
            f"position_term=False (tables without a position-only term) needs positional="
            f"'learned', got positional={score.name!r}"
        )


def _refuse_hard(score: type[PositionalScore], hard: bool) -> None:
    if hard:
        raise ValueError(
            f"hard=True is the s → ∞ limit of positional='gaussian' without content, got "
            f"positional={score.name!r}"
        )


class PositionalScore(nn.Module):
    """Base class: a positional score for ``heads`` heads (see the module docstring).

    Subclasses set ``name`` (the key in [`POSITIONAL_SCORES`][]) and ``separable``, create their
    parameters and implement ``reset_parameters``, ``select_heads`` and either ``factors`` and
    ``offset_factors`` (separable scores) or ``logits`` and ``offset_logits``.
    """

    name: ClassVar[str]
    separable: ClassVar[bool] = True
    has_centers: ClassVar[bool] = False
    has_embeddings: ClassVar[bool] = False
    r"""Offers ``row_embedding`` / ``col_embedding``, the $r_\delta$ of the content × position
    score."""
    hard: bool = False
    position_term: bool = True
    """Whether the score adds a position-only term to the logits (only a learned score built with
    ``position_term=False`` does not)."""
    max_size: int | None = None
    """Largest image side the score covers; ``None``: any size."""

    def __init__(self, heads: int) -> None:
        super().__init__()
        self.heads = heads

    @classmethod
    def for_layer(
        cls,
        heads: int,
        head_dim: int,
        max_size: int,
        hard: bool = False,
        init: str = "original",
        position_term: bool = True,
    ) -> PositionalScore:
        """The score for a layer built with these arguments (each score takes what it needs;
        ``init`` is one of [`POSITIONAL_INITS`][])."""
        _check_init(init, POSITIONAL_INITS if cls.has_centers else _RANDOM_INITS)
        _refuse_hard(cls, hard)
        _refuse_without_term(cls, position_term)
        return cls(heads)

    def reset_parameters(self) -> None:
        raise NotImplementedError

    @torch.no_grad()
    def select_heads(self, index: Tensor) -> None:
        """Keep the heads ``index`` (long, sorted) of every per-head parameter, in place."""
        raise NotImplementedError

    def extra_repr(self) -> str:
        return f"heads={self.heads}"

    # ------------------------------------------------------------------ sizes

    def covers(self, height: int, width: int) -> bool:
        """Whether the score is defined on an ``H×W`` image."""
        return self.max_size is None or max(height, width) <= self.max_size

    def check_size(self, height: int, width: int) -> None:
        """ValueError unless [`covers`][] an ``H×W`` image."""
        if not self.covers(height, width):
            raise ValueError(
                f"image {height}x{width} is larger than the {self.name} score covers "
                f"(max_size={self.max_size}, offsets up to ±{self.max_size - 1}); build the layer "
                f"with max_size >= {max(height, width)}"
            )

    # ------------------------------------------------------------------ logits over pixels

    def _not_separable(self) -> ValueError:
        return ValueError(f"positional={self.name!r} is not separable into row and column terms")

    def factors(self, height: int, width: int) -> tuple[Tensor, Tensor]:
        """Row ``(heads, H, H)`` and column ``(heads, W, W)`` logits of a separable score."""
        raise self._not_separable()

    def logits(self, height: int, width: int) -> Tensor:
        """Logits over pixel pairs ``(heads, H·W, H·W)``, row-major, rows are queries."""
        return scores.kron_sum_factors(*self.factors(height, width))

    def probability_factors(self, height: int, width: int) -> tuple[Tensor, Tensor]:
        """Row ``(heads, H, H)`` and column ``(heads, W, W)`` probabilities (rows sum to one);
        the attention over pixels is their Kronecker product."""
        row, col = self.factors(height, width)
        return softmax_without_subnormals(row), softmax_without_subnormals(col)

    # ------------------------------------------------------------------ logits over offsets

    def offset_factors(self, height: int, width: int) -> tuple[Tensor, Tensor]:
        """Row ``(heads, 2H−1)`` and column ``(heads, 2W−1)`` logits of a separable score over
        the offsets ``−(H−1)..H−1`` and ``−(W−1)..W−1``."""
        raise self._not_separable()

    def offset_probs(self, height: int, width: int) -> Tensor:
        """Each head's attention over offsets ``(heads, 2H−1, 2W−1)``, as for an interior query:
        the softmax over every offset of an ``H×W`` image (row and column terms normalised
        separately when separable). Index ``(H−1, W−1)`` is offset ``(0, 0)``."""
        row, col = self.offset_factors(height, width)
        row, col = softmax_without_subnormals(row), softmax_without_subnormals(col)
        return row[:, :, None] * col[:, None, :]


class _CenteredScore(PositionalScore):
    r"""A Gaussian bump of attention per head: centre $\Delta_h$ (``centers (heads, 2)``, pixels,
    (row, col)) and a precision $\Sigma^{-1}$ built from ``spread``."""

    has_centers = True

    def __init__(self, heads: int, spread_shape: tuple[int, ...], init: str = "original") -> None:
        super().__init__(heads)
        _check_init(init)
        if init == "grid":
            grid_centers(heads)  # ValueError for a head count that is not a square
        self.init = init
        self.centers = nn.Parameter(torch.empty(heads, 2))
        self.spread = nn.Parameter(torch.empty(heads, *spread_shape))
        self.reset_parameters()

    @classmethod
    def for_layer(
        cls,
        heads: int,
        head_dim: int,
        max_size: int,
        hard: bool = False,
        init: str = "original",
        position_term: bool = True,
    ) -> _CenteredScore:
        _refuse_without_term(cls, position_term)
        return cls(heads, hard=hard, init=init)

    def extra_repr(self) -> str:
        return super().extra_repr() + (', init="grid"' if self.init == "grid" else "")

    def _spread_identity(self) -> Tensor:
        """The noise-free initial ``spread`` of one head."""
        raise NotImplementedError

    def precision(self) -> Tensor:
        r"""$\Sigma^{-1}$ ``(heads, 2, 2)`` in 1/pixels²."""
        raise NotImplementedError

    @torch.no_grad()
    def reset_parameters(self) -> None:
        r"""Paper initialisation ([the mathematics, §1][1-pixels-offsets-and-the-attention-layer]):
        $\Delta \sim \mathcal N(0, 2^2)$, spread = identity plus $\mathcal N(0, 0.01^2)$ noise; with
        ``init="grid"`` the heads on the taps of a $K \times K$ kernel ([`grid_centers`][]) with
        spread ``GRID_SPREAD`` times the identity, no noise. The grid start draws (and discards) the
        paper's random numbers too, so that under one seed every other weight of a model starts the
        same under both: the two starts differ only here."""
        self.centers.normal_(0.0, 2.0)
        self.spread.normal_(0.0, 0.01)
        self.spread.add_(self._spread_identity())
        if self.init == "grid":
            self.centers.copy_(grid_centers(self.heads))
            self.spread.copy_(GRID_SPREAD * self._spread_identity())

    @torch.no_grad()
    def select_heads(self, index: Tensor) -> None:
        self.centers = nn.Parameter(self.centers[index].clone())
        self.spread = nn.Parameter(self.spread[index].clone())
        self.heads = len(index)

    @torch.no_grad()
    def geometry(self) -> dict[str, Tensor]:
        r"""Geometry of the heads: ``centers (heads, 2)`` in pixels, ``covariance (heads, 2, 2)``
        ($\Sigma$; ``inf`` entries for a singular precision) and ``condition_number (heads,)`` of
        the covariance (``inf`` when singular, 1 for isotropic heads)."""
        precision = self.precision().double()
        eye = torch.eye(2, dtype=precision.dtype, device=precision.device)
        eigenvalues = torch.linalg.eigvalsh(precision).clamp_min(0.0)  # ascending
        condition = eigenvalues[:, 1] / eigenvalues[:, 0]
        condition = torch.where(eigenvalues[:, 1] == 0, torch.ones_like(condition), condition)
        singular = eigenvalues[:, 0] == 0
        safe = torch.where(singular[:, None, None], eye.expand_as(precision), precision)
        covariance = torch.where(
            singular[:, None, None], torch.full_like(safe, math.inf), torch.linalg.inv(safe)
        )
        return {
            "centers": self.centers.detach().clone(),
            "covariance": covariance.to(self.spread.dtype),
            "condition_number": condition.to(self.spread.dtype),
        }


class GaussianScore(_CenteredScore):
    r"""Isotropic quadratic score $-\frac12 s_h^2 \lVert \delta - \Delta_h \rVert^2$: separable.

    Parameters: ``centers (heads, 2)`` and ``spread (heads,)`` the inverse standard deviations
    $s_h$. With ``hard=True`` the probabilities are the exact $s \to \infty$ limit (all mass on the
    key pixels nearest $q + \Delta_h$), as in the constructive proof of Theorem 1
    ([the mathematics, §2][2-theorem-1-attention-can-be-any-convolution]).
    """

    name = "gaussian"

    def __init__(self, heads: int, hard: bool = False, init: str = "original") -> None:
        super().__init__(heads, (), init)
        self.hard = hard

    def extra_repr(self) -> str:
        return super().extra_repr() + (", hard=True" if self.hard else "")

    def _spread_identity(self) -> Tensor:
        return torch.ones((), dtype=self.spread.dtype, device=self.spread.device)

    def precision(self) -> Tensor:
        eye = torch.eye(2, dtype=self.spread.dtype, device=self.spread.device)
        return self.spread.square()[:, None, None] * eye

    def factors(self, height: int, width: int) -> tuple[Tensor, Tensor]:
        return scores.gaussian_factors(self.centers, self.spread, height, width)

    def probability_factors(self, height: int, width: int) -> tuple[Tensor, Tensor]:
        if self.hard:
            return scores.hard_gaussian_factors(self.centers, height, width)
        return super().probability_factors(height, width)

    def offset_factors(self, height: int, width: int) -> tuple[Tensor, Tensor]:
        d1, d2 = _axis_offsets(height, self.centers), _axis_offsets(width, self.centers)
        return (
            scores.gaussian_axis_logits(self.centers[:, 0], self.spread, d1),
            scores.gaussian_axis_logits(self.centers[:, 1], self.spread, d2),
        )

    def offset_probs(self, height: int, width: int) -> Tensor:
        if not self.hard:
            return super().offset_probs(height, width)
        d1, d2 = _axis_offsets(height, self.centers), _axis_offsets(width, self.centers)
        row = scores.nearest_offset_probs(self.centers[:, 0], d1)  # (heads, 2H−1)
        col = scores.nearest_offset_probs(self.centers[:, 1], d2)  # (heads, 2W−1)
        return row[:, :, None] * col[:, None, :]


class GaussianFullScore(_CenteredScore):
    r"""Generalized quadratic score
    $-\frac12 (\delta - \Delta_h)^\top S_h S_h^\top (\delta - \Delta_h)$: not separable.

    Parameters: ``centers (heads, 2)`` and ``spread (heads, 2, 2)`` the matrices $S_h$ with
    $\Sigma_h^{-1} = S_h S_h^\top$.
    """

    name = "gaussian_full"
    separable = False

    def __init__(self, heads: int, hard: bool = False, init: str = "original") -> None:
        _refuse_hard(type(self), hard)
        super().__init__(heads, (2, 2), init)

    def _spread_identity(self) -> Tensor:
        return torch.eye(2, dtype=self.spread.dtype, device=self.spread.device)

    def precision(self) -> Tensor:
        return self.spread @ self.spread.transpose(-1, -2)

    def logits(self, height: int, width: int) -> Tensor:
        return scores.gaussian_full_logits(self.centers, self.spread, height, width)

    def offset_logits(self, height: int, width: int) -> Tensor:
        """Logits over offsets ``(heads, 2H−1, 2W−1)``; index ``(H−1, W−1)`` is offset 0."""
        d1, d2 = _axis_offsets(height, self.centers), _axis_offsets(width, self.centers)
        return scores.quadratic_form_logits(self.centers, self.spread, d1[:, None], d2[None, :])

    def offset_probs(self, height: int, width: int) -> Tensor:
        logits = self.offset_logits(height, width)  # (heads, 2H−1, 2W−1)
        return softmax_without_subnormals(logits.flatten(1)).view_as(logits)


class LearnedScore(PositionalScore):
    r"""Learned relative score $w_h^\top [r^\text{row}_{\delta_1}; r^\text{col}_{\delta_2}]$:
    separable.

    Parameters: ``row_embedding (2·max_size−1, head_dim // 2)`` and
    ``col_embedding (2·max_size−1, head_dim − head_dim // 2)``, one vector per offset
    ``−(max_size−1)..max_size−1`` shared by the heads (index ``max_size−1`` is offset 0), and
    ``weight (heads, head_dim)`` the per-head vectors $w_h$: its first ``head_dim // 2`` columns are
    the heads' row keys, the rest their column keys. Covers images up to ``max_size`` pixels a side.
    The tables are also the $r_\delta$ of the content × position score
    (``scores.content_positional_logits``).

    ``init`` ([`POSITIONAL_INITS`][]): ``"original"``, the paper's code (tables as
    ``nn.Embedding``'s default $\mathcal N(0, 1)$, row and column keys as two bias-free
    ``nn.Linear`` of fan-in $d_\text{row}$ and $d_\text{col}$:
    $\mathcal U(\pm 1/\sqrt{d_\text{row}})$, $\mathcal U(\pm 1/\sqrt{d_\text{col}})$), or ``"bert"``
    (tables $\mathcal N(0, 0.02^2)$, head vectors $\mathcal N(0, 1/d)$, $d$ = ``head_dim``). With
    ``"bert"`` the logits start within about ±0.05 and, the score being bilinear, their gradients
    are as small: the heads stay near uniform attention ([the mathematics, §4][initialisation]).
    """

    name = "learned"
    has_embeddings = True

    def __init__(
        self,
        heads: int,
        head_dim: int,
        max_size: int,
        init: str = "original",
        position_term: bool = True,
    ) -> None:
        if head_dim < 2:
            raise ValueError(f"positional='learned' needs head_dim >= 2, got {head_dim}")
        _check_init(init, _RANDOM_INITS)
        super().__init__(heads)
        self.head_dim, self.max_size, self.init = head_dim, max_size, init
        d_row = head_dim // 2
        self.row_embedding = nn.Parameter(torch.empty(2 * max_size - 1, d_row))
        self.col_embedding = nn.Parameter(torch.empty(2 * max_size - 1, head_dim - d_row))
        self.weight: nn.Parameter | None
        if position_term:
            self.weight = nn.Parameter(torch.empty(heads, head_dim))
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    @classmethod
    def for_layer(
        cls,
        heads: int,
        head_dim: int,
        max_size: int,
        hard: bool = False,
        init: str = "original",
        position_term: bool = True,
    ) -> LearnedScore:
        _refuse_hard(cls, hard)
        return cls(heads, head_dim, max_size, init=init, position_term=position_term)

    @property
    def position_term(self) -> bool:
        r"""Whether the score has its position-only term $w_h^\top r_\delta$ (head vectors
        ``weight``); without it the tables serve only as the $r_\delta$ of the content × position
        score."""
        return self.weight is not None

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, head_dim={self.head_dim}, max_size={self.max_size}, "
            f"init={self.init!r}" + ("" if self.position_term else ", position_term=False")
        )

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Draw the tables and head vectors as ``init`` says (class docstring)."""
        std = 0.02 if self.init == "bert" else 1.0
        nn.init.normal_(self.row_embedding, std=std)
        nn.init.normal_(self.col_embedding, std=std)
        if self.weight is None:
            return
        if self.init == "bert":
            nn.init.normal_(self.weight, std=1.0 / math.sqrt(self.head_dim))
            return
        d_row = self.row_embedding.shape[1]
        for keys in (self.weight[:, :d_row], self.weight[:, d_row:]):
            bound = 1.0 / math.sqrt(keys.shape[1])
            nn.init.uniform_(keys, -bound, bound)

    def _keys(self) -> Tensor:
        if self.weight is None:
            raise ValueError(
                "this learned score has no position-only term (position_term=False): its tables "
                "enter the logits only through the content × position score"
            )
        return self.weight

    @torch.no_grad()
    def select_heads(self, index: Tensor) -> None:
        if self.weight is not None:
            self.weight = nn.Parameter(self.weight[index].clone())
        self.heads = len(index)

    def factors(self, height: int, width: int) -> tuple[Tensor, Tensor]:
        return scores.learned_factors(
            self.row_embedding, self.col_embedding, self._keys(), height, width
        )

    def offset_factors(self, height: int, width: int) -> tuple[Tensor, Tensor]:
        row, col = scores.learned_offset_tables(self.row_embedding, self.col_embedding, self._keys())
        middle = self.max_size - 1  # index of offset 0
        return (
            row[:, middle - (height - 1) : middle + height],
            col[:, middle - (width - 1) : middle + width],
        )


POSITIONAL_SCORES: dict[str, type[PositionalScore]] = {
    score.name: score for score in (GaussianScore, GaussianFullScore, LearnedScore)
}
"""Name (the layer's ``positional=`` argument) → score class."""

Positional = Literal["gaussian", "gaussian_full", "learned"]
"""The names of [`POSITIONAL_SCORES`][], as a type."""


def positional_score_class(name: str) -> type[PositionalScore]:
    """The score class called ``name``; ValueError naming the choices for an unknown name."""
    if not isinstance(name, str) or name not in POSITIONAL_SCORES:
        raise ValueError(
            f"unknown positional score {name!r}; expected one of {tuple(POSITIONAL_SCORES)} or None"
        )
    return POSITIONAL_SCORES[name]
