"""attnconv.analysis.paired: McNemar's exact test against a hand computation, and two checkpoints
compared on the same test images."""

from __future__ import annotations

import math

import pytest
import torch

from attnconv.analysis import compare_checkpoints, exact_binomial_p, mcnemar
from attnconv.errors import UserError


def test_exact_binomial_p_by_hand():
    # 2 of 10 fair flips: P(X <= 2) = (1 + 10 + 45) / 1024 = 56/1024; two-sided: 112/1024
    assert exact_binomial_p(2, 10) == pytest.approx(112 / 1024, abs=1e-15)
    assert exact_binomial_p(8, 10) == exact_binomial_p(2, 10)  # symmetric
    # 5 of 10 is the middle: 2 · P(X <= 5) > 1, capped at 1
    assert exact_binomial_p(5, 10) == 1.0
    assert exact_binomial_p(0, 0) == 1.0
    # 0 of 20: 2 / 2**20
    assert exact_binomial_p(0, 20) == pytest.approx(2 / 2**20, rel=1e-15)
    # a large case against the sum of binomial terms in log space
    n, k = 3000, 1420
    logs = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) for i in range(k + 1)]
    top = max(logs)
    expected = 2 * math.exp(top + math.log(sum(math.exp(v - top) for v in logs)) - n * math.log(2))
    assert exact_binomial_p(k, n) == pytest.approx(expected, rel=1e-9)
    with pytest.raises(ValueError, match="0 <= successes <= trials"):
        exact_binomial_p(11, 10)


def test_mcnemar_counts_the_discordant_images_by_hand():
    # 10 images: both right on 5, only A on 3, only B on 1, both wrong on 1
    a = torch.tensor([1, 1, 1, 1, 1, 1, 1, 1, 0, 0], dtype=torch.bool)
    b = torch.tensor([1, 1, 1, 1, 1, 0, 0, 0, 1, 0], dtype=torch.bool)
    result = mcnemar(a, b)
    assert (result.both_right, result.only_a, result.only_b, result.both_wrong) == (5, 3, 1, 1)
    assert result.images == 10 and result.accuracy_a == 0.8 and result.accuracy_b == 0.6
    assert result.difference == pytest.approx(0.2)
    # discordant: 3 against 1 of 4 -> 2 · (1 + 4) / 16 = 0.625
    assert result.p_value == pytest.approx(0.625, abs=1e-15)
    swapped = mcnemar(b, a)
    assert swapped.p_value == result.p_value and swapped.difference == -result.difference
    predicted_a = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 1, 1])
    predicted_b = torch.tensor([0, 1, 2, 3, 4, 0, 0, 0, 8, 1])
    assert mcnemar(a, b, predicted_a, predicted_b).same_predictions == 6
    assert "McNemar exact p = 0.625" in result.summary()
    with pytest.raises(ValueError, match="same images"):
        mcnemar(a, b[:5])
    with pytest.raises(ValueError, match=r"shape \(N,\)"):
        mcnemar(a.view(2, 5), b.view(2, 5))


def _checkpoint(tmp_path, name, bias, dataset="digits"):
    from attnconv.models import create_model
    from attnconv.models.checkpoint import save_checkpoint
    from attnconv.models.presets import preset_arguments

    torch.manual_seed(0)
    model = create_model("quick")
    with torch.no_grad():  # two different models: the classifier's bias tips the predictions
        model.classifier.bias.copy_(bias)
    architecture, arguments = preset_arguments("quick")
    path = tmp_path / f"{name}.pt"
    save_checkpoint({"preset": "quick", "dataset": dataset, "architecture": architecture,
                     "arguments": arguments, "model": model.state_dict()}, path)  # fmt: skip
    return path, model


def test_compare_checkpoints_scores_both_on_the_test_split(tmp_path):
    from attnconv.analysis.paired import predicted_classes
    from attnconv.data import load_splits

    first, model_a = _checkpoint(tmp_path, "a", torch.zeros(10))
    second, model_b = _checkpoint(tmp_path, "b", torch.linspace(-3, 3, 10))
    result = compare_checkpoints(str(first), str(second))
    data = load_splits("digits", None, 0)
    labels = data.test.labels
    right_a = predicted_classes(model_a, data.test) == labels
    right_b = predicted_classes(model_b, data.test) == labels
    assert result.images == len(labels)
    assert result.only_a + result.only_b > 0  # the two disagree somewhere: the counts matter
    assert result.only_a == int((right_a & ~right_b).sum())
    assert result.only_b == int((~right_a & right_b).sum())
    assert result.accuracy_a == pytest.approx(float(right_a.float().mean()))


def test_compare_checkpoints_refuses_two_datasets(tmp_path):
    first, _ = _checkpoint(tmp_path, "a", torch.zeros(10))
    second, _ = _checkpoint(tmp_path, "b", torch.zeros(10), dataset="fashion-mnist")
    with pytest.raises(UserError, match="same test images"):
        compare_checkpoints(str(first), str(second))


def test_against_baseline_pairs_each_run_with_the_baseline_of_its_seed(tmp_path):
    from attnconv.analysis.paired import PairedRun, against_baseline, format_against_baseline

    a0, _ = _checkpoint(tmp_path, "a0", torch.zeros(10))
    b0, _ = _checkpoint(tmp_path, "b0", torch.linspace(-3, 3, 10))
    a1, _ = _checkpoint(tmp_path, "a1", torch.linspace(3, -3, 10))
    runs = [
        PairedRun("model", 0, 26, str(a0)),
        PairedRun("cnn", 0, 50, str(b0)),
        PairedRun("model", 1, 26, str(a1)),  # no baseline run of seed 1: left out
    ]
    pairs = against_baseline(runs, "cnn")
    assert [(run.seed, cnn.seed) for run, cnn, _ in pairs] == [(0, 0)]
    assert pairs[0][2] == compare_checkpoints(str(a0), str(b0))
    table = format_against_baseline(pairs)
    assert "| `model` | 0 | 26 (baseline: 50: not one budget) |" in table
    assert f"{pairs[0][2].p_value:.3g} |" in table
