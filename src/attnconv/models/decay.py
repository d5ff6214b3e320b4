"""Which parameters train without weight decay: the rules a run can choose (``TrainConfig.decay_exempt``).

* ``"original"``, the paper's code: weight decay on every parameter except the Gaussian scores'
  centres and spreads (learned tables and head keys, norms and biases are decayed; the ResNet's
  plain SGD decays everything);
* ``"norms-biases-positional"``, attnconv's earlier rule: no decay on any positional parameter
  (Gaussian geometry, learned tables and head keys), on norms or on biases.

Models implement ``no_weight_decay_parameters(rule)``, returning parameter names.
"""

from __future__ import annotations

from torch import nn

DECAY_EXEMPTIONS: tuple[str, ...] = ("original", "norms-biases-positional")


def check_rule(rule: str) -> None:
    """ValueError naming the rules unless ``rule`` is one of ``DECAY_EXEMPTIONS``."""
    if rule not in DECAY_EXEMPTIONS:
        raise ValueError(f"decay_exempt must be one of {DECAY_EXEMPTIONS}, got {rule!r}")


def exempt_names(model: nn.Module, rule: str, positional: set[int], geometry: set[int]) -> set[str]:
    """Names of ``model``'s parameters exempt from decay under ``rule``, given the ids of its
    positional parameters (``positional``) and among them the Gaussian centres and spreads
    (``geometry``)."""
    check_rule(rule)
    if rule == "original":
        return {name for name, param in model.named_parameters() if id(param) in geometry}
    return {
        name
        for name, param in model.named_parameters()
        if param.ndim <= 1 or id(param) in positional
    }
