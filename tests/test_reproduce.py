"""`attnconv reproduce`: run selection, skipping and resuming, the results table from a real run."""

from __future__ import annotations

import csv
import dataclasses
import itertools
import json
import shutil

import pytest
import torch

from attnconv import reproduce
from attnconv.data import load_splits
from attnconv.models import PRESETS, create_model
from attnconv.models.presets import preset_arguments
from attnconv.models.pretrained import pretrained_models
from attnconv.train.config import (
    TrainConfig,
    extended_config,
    resolve_config,
    training_command,
)
from attnconv.train.loop import train
from attnconv.viz.figures import attention_figure
from attnconv.viz.grid import layer_grid_scores
from attnconv.viz.maps import compute_attention
from train_helpers import command_config, without_bookkeeping


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """A finished one-epoch run of the quick preset on the embedded digits."""
    run_dir = tmp_path_factory.mktemp("experiment") / "quick"
    config = resolve_config(
        "quick",
        "digits",
        {"epochs": 1, "checkpoint_every": 1, "tensorboard": False, "progress": False},
    )
    train(config, run_dir)
    return run_dir


def test_presets_of_an_experiment():
    assert reproduce.selected_presets("fashion-mnist", None) == (
        "quadratic-fashion",
        "learned-fashion",
        "learned-content-fashion",
        "resnet-fashion-small",
        "resnet-fashion",
        "vit-fashion",
    )
    assert reproduce.selected_presets("fashion-mnist", ["resnet-fashion"]) == ("resnet-fashion",)
    with pytest.raises(ValueError, match="quick not in experiment 'fashion-mnist'"):
        reproduce.selected_presets("fashion-mnist", ["quick"])


def test_finished_runs_are_skipped_and_interrupted_ones_resumed(tmp_path, monkeypatch, quick_run):
    calls = []
    monkeypatch.setattr("attnconv.train.loop.train", lambda *a, **k: calls.append((a, k)))
    settings = {"precision": "fp32", "seed": 3, "checkpoint_every": 1}
    config = resolve_config("quick", "digits", **settings)
    plans = [(config.epochs, config.epochs)]
    assert reproduce.run_state(quick_run) == "finished"
    reproduce.train_run(quick_run, config, plans)
    assert calls == []

    interrupted = tmp_path / "interrupted"
    (interrupted / "checkpoints").mkdir(parents=True)
    (interrupted / "checkpoints" / "last.pt").write_bytes(b"")
    assert reproduce.run_state(interrupted) == "interrupted"
    reproduce.train_run(interrupted, config, plans)
    ((args, kwargs),) = calls
    assert args == (None, interrupted)  # the config saved in last.pt, the one source of truth
    assert kwargs == {"resume": True, "epoch_figure": attention_figure}

    calls.clear()
    assert reproduce.run_state(tmp_path / "new") == "new"
    reproduce.train_run(tmp_path / "new", config, plans)
    ((args, kwargs),) = calls
    assert args == (config, tmp_path / "new")


def test_run_plans_follow_the_recipe_seed_and_precision():
    config, plans = reproduce.run_plan("fashion-mnist", "quadratic-fashion", "shipped", 1)
    assert (config.epochs, config.precision, config.seed, config.checkpoint_every) == (
        26,
        "fp32",
        1,
        1,
    )
    assert config.model == {"weight_init": "fan_in"} and plans == [(26, 26)]
    presets, plans = reproduce.run_plan("fashion-mnist", "quadratic-fashion", "presets", 0)
    assert presets.model == {} and presets.precision == "auto"
    assert presets.epochs == resolve_config("quadratic-fashion").epochs != 26
    assert plans == [(presets.epochs, presets.epochs)]
    bf16, _ = reproduce.run_plan("fashion-mnist", "learned-fashion", "shipped", 0, "bf16")
    assert bf16.precision == "bf16" and bf16.epochs == 22
    # learned-content-fashion shipped from an 18-epoch plan stopped after epoch 1, then 22 epochs
    content, plans = reproduce.run_plan("fashion-mnist", "learned-content-fashion", "shipped", 0)
    assert (content.epochs, content.precision, plans) == (18, "bf16", [(18, 1), (22, 22)])
    with pytest.raises(ValueError, match="unknown recipe 'paper'; valid recipes: presets, shipped"):
        reproduce.run_plan("fashion-mnist", "learned-fashion", "paper", 0)
    # on fashion-mnist-anywhere the models without shipped weights train as they stand
    anywhere, plans = reproduce.run_plan("fashion-mnist-anywhere", "learned-anywhere", "presets", 0)
    assert (anywhere.dataset, anywhere.precision, plans) == ("fashion-mnist-anywhere", "auto", [(50, 50)])
    shipped, plans = reproduce.run_plan("fashion-mnist-anywhere", "learned-anywhere", "shipped", 1)
    assert (shipped.epochs, shipped.precision, shipped.seed, plans) == (22, "fp32", 1, [(22, 22)])
    shipped, plans = reproduce.run_plan("fashion-mnist-anywhere", "quadratic-anywhere", "shipped", 0)
    assert (shipped.epochs, shipped.precision, plans) == (26, "fp32", [(26, 26)])
    with pytest.raises(ValueError, match=r"no shipped recipe.*; train it with --recipe presets"):
        reproduce.run_plan("fashion-mnist-anywhere", "vit-anywhere", "shipped", 0)


def test_the_shipped_recipes_are_the_runs_of_the_shipped_weights():
    """Each shipped Fashion-MNIST model is trained again as its weights were: the config and plans
    ``reproduce`` trains write back the command the weights record (settings, length, re-plans:
    a recipe that dropped ``learned-content-fashion``'s resume would write another command), and
    build the constructor arguments the weights were built from."""
    shipped = {  # but the fine-tuned ones (docs/transform.md), which start from a shipped model
        n: e for n, e in pretrained_models().items() if not PRESETS[n].requires_init
    }  # fmt: skip
    experiment_of = {p: e for e, presets in reproduce.EXPERIMENTS.items() for p in presets}
    assert set(shipped) >= set(reproduce.EXPERIMENTS["fashion-mnist"])
    assert {"learned-anywhere", "quadratic-anywhere", "learned-content-anywhere"} <= set(shipped)
    data_keys = ("num_classes", "in_channels", "image_size", "mean", "std")
    for preset, entry in shipped.items():
        assert entry.dataset == experiment_of[preset], preset
        first, plans = reproduce.run_plan(entry.dataset, preset, "shipped", 0)
        final = first
        for (_, stop), (length, _) in itertools.pairwise(plans):
            final = extended_config(final, length, trained=stop)
        replans = [[length, stop] for length, stop in plans[:-1]]
        assert training_command(final, replans) == entry.run["command"], preset
        assert final.epochs == entry.run["epochs"] and final.precision == entry.run["precision"]
        data = {key: entry.arguments[key] for key in data_keys}
        architecture, arguments = preset_arguments(preset, **{**final.model, **data})
        assert architecture == entry.architecture
        assert json.loads(json.dumps(arguments)) == entry.arguments, preset
    # the command a run without its resume would record differs from the shipped one
    content = shipped["learned-content-fashion"].run["command"]
    config, _ = reproduce.run_plan("fashion-mnist", "learned-content-fashion", "shipped", 0)
    assert training_command(extended_config(config, 22, trained=18), [[18, 18]]) != content
    assert training_command(dataclasses.replace(config, epochs=22)) != content


def test_results_row_figures_and_table_of_a_real_run(tmp_path, quick_run):
    summary = json.loads((quick_run / "summary.json").read_text())
    row = reproduce.analyse_run(quick_run, tmp_path / "figures", None)
    for key in ("test_acc", "parameters", "macs_per_image", "train_time_s", "images_per_s"):
        assert row[key] == summary[key]
    assert row["epochs"] == 1 and row["grid_kernel"] == 3 and row["seed"] == 0
    depth = create_model("quick").heads_per_layer()
    assert len(row["grid_score"]) == len(row["grid_coverage"]) == len(depth)
    assert len(row["attention_distance"]) == len(depth)
    # The initial grid score is the one of the model as the run's seed built it.
    torch.manual_seed(0)
    initial = create_model("quick")
    expected = [s.score for s in layer_grid_scores(compute_attention(initial, (8, 8)))]
    assert row["grid_score_init"] == pytest.approx(expected)
    assert row["grid_score"] != pytest.approx(expected)  # one epoch of training moved the heads
    names = {p.name for p in (tmp_path / "figures").iterdir()}
    assert {"contours.png", "maps.png", "distance.png", "trajectories.png", "heads.csv"} <= names
    with (tmp_path / "figures" / "heads.csv").open() as handle:
        heads = list(csv.DictReader(handle))
    assert row["grid"] == (8, 8)  # one token per pixel of the 8×8 digits (the quick stem is 1)
    assert [len(layer) for layer in row["head_distances"]] == depth
    for layer, distances in enumerate(row["head_distances"]):
        assert sum(distances) / len(distances) == pytest.approx(row["attention_distance"][layer])
        listed = [float(h["attention_distance"]) for h in heads if int(h["layer"]) == layer]
        assert distances == pytest.approx(listed, abs=1e-3)

    resnet_row = {
        **row,
        "preset": "resnet-fashion",
        "grid_kernel": None,
        "grid_score": None,
        "grid_score_init": None,
        "grid_coverage": None,
        "attention_distance": None,
        "head_distances": None,
        "grid": None,
    }
    # One panel per attention model: the ResNet has none.
    (png, pdf) = reproduce.write_distance_comparison([row, resnet_row], tmp_path / "figures")
    assert png.name == "distance-by-depth.png" and pdf.stat().st_size > 0
    assert reproduce.write_distance_comparison([resnet_row], tmp_path / "none") == []
    references = reproduce.REFERENCES["fashion-mnist"]
    files = reproduce.write_results([row, resnet_row], tmp_path, references)
    markdown = files[0].read_text().splitlines()
    assert markdown[0].startswith("| model | seeds | epochs | test acc. (%)")
    cells = [c.strip() for c in markdown[2].strip("|").split("|")]
    assert len(cells) == len(markdown[0].strip("|").split("|"))
    assert cells[:4] == ["`quick`", "0", "1", f"{100 * summary['test_acc']:.2f}"]
    assert cells[9] == " / ".join(f"{g:.2f}" for g in row["grid_score"])
    covered = [round(c * 9) for c in row["grid_coverage"]]
    assert cells[11] == " / ".join(f"{c}/9" for c in covered)
    assert [c.strip() for c in markdown[3].strip("|").split("|")][9:] == ["-"] * 4
    assert row["machine"] == summary["machine"] and "AVX2" in row["machine"]
    assert markdown[-1] == f"Trained on: {summary['machine']}"
    listed = [line for line in markdown if line.startswith("- ")]
    assert listed[0] == "- softmax (logistic) regression: 83–84% (the dataset's benchmark table)"
    assert len(listed) == len(references) and markdown.index(listed[0]) > 3
    with files[1].open() as handle:
        rows = list(csv.DictReader(handle))
    assert rows[0]["preset"] == "quick" and float(rows[0]["test_acc"]) == summary["test_acc"]
    assert rows[0]["seed"] == "0"
    scores = [float(v) for v in rows[0]["grid_score"].split()]
    assert scores == pytest.approx(row["grid_score"], abs=1e-4)
    assert rows[1]["grid_score"] == ""


def test_a_table_over_seeds_gives_mean_and_spread_and_a_csv_row_per_run(tmp_path):
    def run_row(seed, accuracy, scores, coverage, distances):
        return {
            "preset": "quadratic-fashion",
            "seed": seed,
            "epochs": 26,
            "test_acc": accuracy,
            "parameters": 232758,
            "macs_per_image": 57.7e6,
            "train_time_s": 7000.0 + 200 * seed,
            "images_per_s": 190.0 + 10 * seed,
            "precision": "fp32",
            "machine": ["machine A", "machine B"][seed],
            "grid_kernel": 3,
            "grid_score": scores,
            "grid_score_init": [0.1, 0.1],
            "grid_coverage": coverage,
            "attention_distance": distances,
            "head_distances": [[d] * 9 for d in distances],
            "grid": (14, 14),
        }

    rows = [
        run_row(0, 0.9207, [0.50, 0.20], [4 / 9, 0.0], [1.4, 1.8]),
        run_row(1, 0.9181, [0.46, 0.30], [3 / 9, 1 / 9], [1.6, 2.0]),
    ]
    (model,) = reproduce.model_summaries(rows)
    assert model["seeds"] == [0, 1] and model["epochs"] == [26] and model["precision"] == ["fp32"]
    assert model["test_acc"] == pytest.approx(0.9194)
    assert model["test_acc_sd"] == pytest.approx(0.0026 / 2**0.5)  # sample deviation of two
    assert model["grid_score"] == pytest.approx([0.48, 0.25])
    assert model["attention_distance"] == pytest.approx([1.5, 1.9])
    assert model["train_time_s"] == 7100.0 and model["images_per_s"] == 195.0
    markdown, table = reproduce.write_results(rows, tmp_path)
    lines = markdown.read_text().splitlines()
    assert len([line for line in lines if line.startswith("| `")]) == 1  # one row per model
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells[:4] == ["`quadratic-fashion`", "0, 1", "26", "91.94 ± 0.18"]
    assert cells[9] == "0.48 / 0.25" and cells[10] == "0.10 / 0.10"
    assert cells[11] == "3.5/9 / 0.5/9" and cells[12] == "1.50 / 1.90"
    with table.open() as handle:
        runs = list(csv.DictReader(handle))
    assert [(r["seed"], r["test_acc"]) for r in runs] == [("0", "0.9207"), ("1", "0.9181")]
    assert [r["machine"] for r in runs] == ["machine A", "machine B"]
    assert lines[-5:] == [
        "",
        "Trained on:",
        "",
        "- machine A: `quadratic-fashion` (seed 0)",
        "- machine B: `quadratic-fashion` (seed 1)",
    ]
    # one seed: no spread shown
    (single,) = reproduce.model_summaries(rows[:1])
    assert single["test_acc_sd"] is None
    markdown, _ = reproduce.write_results(rows[1:], tmp_path)
    text = markdown.read_text()
    assert "| `quadratic-fashion` | 1 | 26 | 91.81 |" in text
    assert text.endswith("\n\nTrained on: machine B\n")


def test_the_experiment_trains_each_model_once_per_seed_into_its_own_folder(tmp_path, monkeypatch):
    trained, analysed, compared = [], [], []
    monkeypatch.setattr(
        reproduce,
        "train_run",
        lambda folder, config, plans: trained.append(
            (config.preset, folder, config.seed, plans[-1][0])
        ),
    )

    def analyse(folder, figures, _):
        analysed.append((folder, figures))
        seed = int(folder.name.removeprefix("seed-"))
        return {"preset": folder.parent.name, "seed": seed, "head_distances": None}

    monkeypatch.setattr(reproduce, "analyse_run", analyse)
    monkeypatch.setattr(reproduce, "write_results", lambda rows, out, *_: [out / "results.md"])
    monkeypatch.setattr(
        reproduce, "write_distance_comparison", lambda rows, _: compared.extend(rows) or []
    )
    (tmp_path / "results.md").write_text("table")
    presets = ["quadratic-fashion", "learned-fashion"]
    reproduce.run_experiment("fashion-mnist", tmp_path, presets, seeds=[1, 0, 1])
    assert trained == [  # the presets as they stand: every model the same 50 epochs
        ("quadratic-fashion", tmp_path / "quadratic-fashion" / "seed-1", 1, 50),
        ("quadratic-fashion", tmp_path / "quadratic-fashion" / "seed-0", 0, 50),
        ("learned-fashion", tmp_path / "learned-fashion" / "seed-1", 1, 50),
        ("learned-fashion", tmp_path / "learned-fashion" / "seed-0", 0, 50),
    ]
    assert analysed[0] == (
        tmp_path / "quadratic-fashion" / "seed-1",
        tmp_path / "figures" / "quadratic-fashion" / "seed-1",
    )
    # the distance figure shows the first seed's runs
    assert [(r["preset"], r["seed"]) for r in compared] == [
        ("quadratic-fashion", 1),
        ("learned-fashion", 1),
    ]
    trained.clear()
    reproduce.run_experiment("fashion-mnist", tmp_path, presets, seeds=[0], epochs=26)
    assert [run[3] for run in trained] == [26, 26]  # the short column: one length for all
    trained.clear()
    reproduce.run_experiment("fashion-mnist", tmp_path, presets, seeds=[0], recipe="shipped")
    assert [run[3] for run in trained] == [26, 22]  # as the shipped weights were trained
    # a run left directly in out/PRESET (the layout before seed folders) is not ignored
    old = tmp_path / "quadratic-fashion"
    (old / "checkpoints").mkdir(parents=True)
    (old / "checkpoints" / "last.pt").write_bytes(b"")
    (old / "config.json").write_text(json.dumps({"seed": 7}))
    trained.clear()
    message = f"{old} holds a run, .* move it to {old / 'seed-7'} "
    with pytest.raises(ValueError, match=message):
        reproduce.run_experiment("fashion-mnist", tmp_path, presets)
    assert trained == []
    with pytest.raises(ValueError, match="at least one seed"):
        reproduce.run_experiment("fashion-mnist", tmp_path, presets, seeds=[])
    old.rename(old.parent / "moved")
    # a bad seed or setting fails before the first run trains, not hours later
    with pytest.raises(ValueError, match=r"seed must be an integer in \[0, 2\*\*63\), got -1"):
        reproduce.run_experiment("fashion-mnist", tmp_path, presets, seeds=[0, -1])
    with pytest.raises(ValueError, match="unknown precision"):
        reproduce.run_experiment("fashion-mnist", tmp_path, presets, precision="fp64")
    assert trained == []


def test_analyse_only_tables_the_finished_runs_each_model_has_and_trains_nothing(
    tmp_path, monkeypatch, capsys
):
    trained, analysed, compared = [], [], []
    monkeypatch.setattr(reproduce, "train_run", lambda *args: trained.append(args))
    monkeypatch.setattr(
        reproduce,
        "analyse_run",
        lambda folder, figures, _: analysed.append(folder)
        or {"preset": folder.parent.name, "seed": int(folder.name[5:]), "head_distances": None},
    )
    monkeypatch.setattr(reproduce, "write_results", lambda rows, out, *_: [out / "results.md"])
    monkeypatch.setattr(
        reproduce, "write_distance_comparison", lambda rows, _: compared.extend(rows) or []
    )
    (tmp_path / "results.md").write_text("table")
    quadratic, learned = tmp_path / "quadratic-fashion", tmp_path / "learned-fashion"
    for seed in (3, 0, 10):  # finished runs, found in increasing order (10 after 3)
        (quadratic / f"seed-{seed}").mkdir(parents=True)
        (quadratic / f"seed-{seed}" / "summary.json").write_text("{}")
    (quadratic / "seed-1" / "checkpoints").mkdir(parents=True)  # interrupted
    (quadratic / "seed-1" / "checkpoints" / "last.pt").write_bytes(b"")
    (quadratic / "seed-x").mkdir()  # not a seed folder
    (learned / "seed-1").mkdir(parents=True)
    (learned / "seed-1" / "summary.json").write_text("{}")
    presets = ["quadratic-fashion", "learned-fashion", "vit-fashion"]

    reproduce.run_experiment("fashion-mnist", tmp_path, presets, analyse_only=True)
    assert trained == []
    seeds = ("seed-0", "seed-3", "seed-10")
    assert analysed == [*(quadratic / seed for seed in seeds), learned / "seed-1"]
    # the distance figure shows each model's first run, whatever its seed
    assert [(r["preset"], r["seed"]) for r in compared] == [
        ("quadratic-fashion", 0),
        ("learned-fashion", 1),
    ]
    err = capsys.readouterr().err
    assert f"quadratic-fashion: an unfinished run in {quadratic / 'seed-1'}, left out" in err
    assert f"vit-fashion: no runs in {tmp_path / 'vit-fashion'}, left out" in err

    analysed.clear()
    reproduce.run_experiment("fashion-mnist", tmp_path, presets, seeds=[3, 1], analyse_only=True)
    assert analysed == [quadratic / "seed-3", learned / "seed-1"]
    err = capsys.readouterr().err
    assert f"learned-fashion: no run in {learned / 'seed-3'}, left out" in err
    assert f"vit-fashion: no run in {tmp_path / 'vit-fashion' / 'seed-1'}, left out" in err
    with pytest.raises(ValueError, match=f"no finished runs of vit-fashion in {tmp_path} "):
        reproduce.run_experiment("fashion-mnist", tmp_path, ["vit-fashion"], analyse_only=True)
    assert trained == []


BROKEN_RUNS = {
    # issue 55: each was a traceback from reproduce --analyse-only
    "summary not UTF-8": ("summary.json", b"\xff\xfe{}", "summary.json cannot be read (not UTF-8"),
    "summary a list": ("summary.json", b"[]", "summary.json must hold an object, not an array"),
    "test_acc a string": (
        "summary.json", {"test_acc": "x"}, "test_acc must be a number, got a string 'x'"
    ),
    "preset unknown": ("summary.json", {"preset": "nope"}, "names preset 'nope', which attnconv"),
    "config not UTF-8": ("config.json", b"\xff", "config.json cannot be read (not UTF-8"),
    "config a list": ("config.json", b"[1]", "config.json must hold an object, not an array"),
    "seed missing": ("config.json", {"seed": None}, "seed must be an integer, got null"),
    "best.pt a ResNet": (
        "checkpoints/best.pt",
        None,
        "holds a ResNet of preset 'resnet-fashion-small', but the run's summary.json says preset "
        "'quick'",
    ),
}


@pytest.mark.parametrize("case", BROKEN_RUNS)
def test_analyse_only_refuses_a_broken_run_folder_in_one_line(case, tmp_path, quick_run, capsys):
    from attnconv.cli import main
    from viz_helpers import save_checkpoint

    name, content, message = BROKEN_RUNS[case]
    run = tmp_path / "quadratic-fashion" / "seed-0"
    shutil.copytree(quick_run, run)
    path = run / name
    if isinstance(content, dict):
        path.write_text(json.dumps({**json.loads(path.read_text()), **content}))
    elif content is None:
        model = create_model("resnet-fashion-small")
        save_checkpoint(path, model, "resnet-fashion-small", {}, dataset="fashion-mnist")
    else:
        path.write_bytes(content)
    argv = ["reproduce", "fashion-mnist", "--out", str(tmp_path), "--presets",
            "quadratic-fashion", "--analyse-only"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert not (tmp_path / "results.md").exists()


def test_shipped_weights_record_the_command_that_trained_them(tmp_path, quick_run):
    data = load_splits("digits")
    summary = json.loads((quick_run / "summary.json").read_text())
    reproduce.export_run(quick_run, data, tmp_path / "weights")
    run = pretrained_models(tmp_path / "weights")["quick"].run
    saved = json.loads((quick_run / "config.json").read_text())
    assert run["command"] == summary["command"]  # attnconv train, not the exporting command
    assert without_bookkeeping(command_config(run["command"])) == without_bookkeeping(
        TrainConfig.from_dict(saved)
    )
    assert (run["epochs"], run["best_epoch"], run["machine"]) == (
        summary["epochs"],
        summary["best_epoch"],
        summary["machine"],
    )

    # a run finished before attnconv recorded them: its command rebuilt, no machine guessed
    older = tmp_path / "older"
    shutil.copytree(quick_run, older)
    for key in ("command", "machine", "replans"):
        del summary[key]
    (older / "summary.json").write_text(json.dumps(summary))
    reproduce.export_run(older, data, tmp_path / "weights")
    run = pretrained_models(tmp_path / "weights")["quick"].run
    assert run["command"] == json.loads((quick_run / "summary.json").read_text())["command"]
    assert "machine" not in run


def test_the_command_line_passes_seeds_recipe_and_precision(monkeypatch, tmp_path):
    from attnconv.cli import main

    calls = []
    monkeypatch.setattr(reproduce, "run_experiment", lambda *a, **k: calls.append((a, k)))
    out = str(tmp_path / "experiment")
    assert main(["reproduce", "fashion-mnist", "--out", out, "--seeds", "0", "1"]) == 0
    assert (
        main(
            [
                "reproduce",
                "fashion-mnist",
                "--out",
                out,
                "--recipe",
                "presets",
                "--precision",
                "bf16",
            ]
        )
        == 0
    )
    (args, first), (_, second) = calls
    assert args == ("fashion-mnist", out)
    assert (first["seeds"], first["recipe"], first["precision"]) == ([0, 1], "presets", None)
    assert (second["seeds"], second["recipe"], second["precision"]) == (None, "presets", "bf16")
    assert not first["analyse_only"]
    assert main(["reproduce", "fashion-mnist", "--out", out, "--analyse-only"]) == 0
    assert calls[-1][1]["analyse_only"] and calls[-1][1]["recipe"] == "presets"
    assert main(["reproduce", "fashion-mnist", "--out", out, "--epochs", "26"]) == 0
    assert calls[-1][1]["epochs"] == 26 and not calls[-1][1]["analyse_only"]
    calls.clear()
    refused = ["reproduce", "fashion-mnist", "--out", out, "--analyse-only", "--precision", "bf16"]
    assert main(refused) != 0
    assert calls == []


def test_every_run_is_set_against_the_cnn_of_its_seed(tmp_path, monkeypatch, quick_run):
    """results.md ends with each model's run against the baseline's run of the same seed on the
    test split: the counts and p-value of analysis.paired.compare_checkpoints."""
    import shutil

    from attnconv.analysis.paired import compare_checkpoints

    monkeypatch.setitem(reproduce.BASELINES, "digits", "cnn")
    other = tmp_path / "other" / "seed-0"
    config = resolve_config("quick", "digits", {"epochs": 1, "seed": 1, "tensorboard": False,
                                                "progress": False})  # fmt: skip
    train(config, other)
    shutil.copytree(quick_run, tmp_path / "cnn" / "seed-0")
    (tmp_path / "results.md").write_text("the table\n")
    rows = [{"preset": "other", "seed": 0, "epochs": 1}, {"preset": "cnn", "seed": 0, "epochs": 3}]
    reproduce.write_against_baseline("digits", tmp_path, rows, None)
    text = (tmp_path / "results.md").read_text()
    expected = compare_checkpoints(str(other), str(tmp_path / "cnn" / "seed-0"))
    assert text.startswith("the table\n") and "Against `cnn`" in text
    assert (
        f"| `other` | 0 | 1 (baseline: 3: not one budget) | {100 * expected.accuracy_a:.2f} | "
        f"`cnn` | {100 * expected.accuracy_b:.2f} | {100 * expected.difference:+.2f} | "
        f"{expected.only_a} | {expected.only_b} | {expected.p_value:.3g} |"
    ) in text
    reproduce.write_against_baseline("digits", tmp_path, rows[:1], None)  # no CNN run: nothing
    assert (tmp_path / "results.md").read_text() == text
