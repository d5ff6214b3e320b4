"""The one rule for seeds, wherever attnconv takes one (``train``'s ``seed``, ``convert --seed``,
``transform --seed``): an integer in ``[0, 2**63)``, a non-negative signed 64-bit integer, which a
checkpoint stores as it is and ``torch.manual_seed`` accepts."""

from __future__ import annotations

from attnconv.errors import UserError

SEED_RULE = "an integer in [0, 2**63)"


def is_valid_seed(seed: int) -> bool:
    """Whether ``seed`` follows the rule (``SEED_RULE``)."""
    return 0 <= seed < 2**63


def check_seed(seed: int, name: str) -> None:
    """UserError naming ``name`` (the option or key that gave ``seed``) unless ``seed`` follows
    the rule."""
    if not is_valid_seed(seed):
        raise UserError(f"{name} must be {SEED_RULE}, got {seed}")
