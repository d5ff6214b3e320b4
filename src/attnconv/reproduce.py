"""``attnconv reproduce fashion-mnist --out DIR``: the paper's experiment on real photographs, end to end.

    DIR/PRESET/seed-S/       one ``attnconv train`` run folder per model and seed (a finished
                             run, one with ``summary.json``, is skipped; an interrupted one is
                             resumed)
    DIR/results.md           the paper's Table 1 for this data, one row per model (test accuracy
                             as mean ± standard deviation over the seeds, parameters,
                             multiply-adds, training time, images/s) with each layer's grid score
                             and mean attention distance (means over the seeds); then every
                             model's run against the size-matched CNN's run of the same seed on
                             the same test images (McNemar's exact test, ``attnconv.analysis.
                             paired``), each row saying where the two budgets differ
    DIR/results.csv          the same, one row per run (model and seed)
    DIR/figures/PRESET/seed-S/
                             the paper's figures of each run: mass contours per layer, layer ×
                             head maps (for content models also averaged over test images),
                             attention distance, Gaussian centres over the epochs, heads.csv
    DIR/figures/distance-by-depth.png, .pdf
                             every attention model's distance per head and layer side by side
                             (the ViT paper's Figure 7 view, on one scale; the first seed's runs)

New runs train each model with its preset as it stands (``recipe="presets"``, the default:
every model for the same number of epochs, [the equal-budget
table][attention-against-convolution-at-equal-budgets]), or with the recipe its shipped weights came from (``recipe="shipped"``: the command their index entry
records, read back by ``attnconv.train.config.shipped_recipe``, settings and re-plans alike:
``learned-content-fashion`` first shipped from an 18-epoch plan stopped after epoch 1 and resumed
to 22 epochs, and is trained so again); ``epochs`` sets every new run's length instead (the
table's other column: ``--epochs 26``). ``--export-weights`` then writes the best checkpoint of
each model's first-seed run into the package's shipped weights (``attnconv.models.pretrained``),
with its test accuracy measured again in float32. ``--analyse-only`` trains nothing and makes the
table of the finished runs in DIR, whatever seeds each model has (runs finished elsewhere, e.g.
resumed by hand on another machine, linked or copied in).
"""

from __future__ import annotations

import csv
import io
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnconv.errors import UserError
from attnconv.runs import RunDir, read_json, write_text_atomic

if TYPE_CHECKING:
    from attnconv.data import DataSplits
    from attnconv.train.config import TrainConfig
    from attnconv.viz.maps import AttentionMaps

EXPERIMENTS: dict[str, tuple[str, ...]] = {
    "fashion-mnist": (
        "quadratic-fashion",
        "learned-fashion",
        "learned-content-fashion",
        "resnet-fashion-small",
        "resnet-fashion",
        "vit-fashion",
    ),
    # the same models where the garments move (attnconv.data.anywhere); vit-anywhere and
    # resnet-anywhere-small ship no weights, so they take --recipe presets
    "fashion-mnist-anywhere": (
        "quadratic-anywhere",
        "learned-anywhere",
        "learned-content-anywhere",
        "resnet-anywhere-small",
        "vit-anywhere",
    ),
}
# Simple baselines a reviewer asks for beside the experiment's table: (model, test accuracy,
# source). Not trained by attnconv; the figures are the sources' own.
REFERENCES: dict[str, tuple[tuple[str, str, str], ...]] = {
    "fashion-mnist": (
        ("softmax (logistic) regression", "83–84%", "the dataset's benchmark table"),
        ("human, the dataset's own estimate", "83.5%", "Xiao et al., 2017 (Fashion-MNIST)"),
        ("multi-layer perceptron", "89–90%", "the dataset's benchmark table"),
        ("CNN with 2 convolutional layers", "91–92.5%", "the dataset's benchmark table"),
        ("ResNet-18 (full width, 11M parameters)", "94.9%", "the dataset's benchmark table"),
    ),
}
RECIPES = ("presets", "shipped")
# The size-matched CNN every model of an experiment is compared with, run by run.
BASELINES: dict[str, str] = {
    "fashion-mnist": "resnet-fashion-small",
    "fashion-mnist-anywhere": "resnet-anywhere-small",
}
# Test images over which the attention of models with content scores is averaged.
AVERAGE_IMAGES = 64
# The fields of a finished run's summary.json and config.json the table reads, and their types
# (``attnconv.runs.read_json`` checks them; a run folder copied in from elsewhere may hold anything)
SUMMARY_FIELDS: dict[str, type | tuple[type, ...]] = {
    "preset": str,
    "epochs": int,
    "test_acc": float,
    "parameters": int,
    "macs_per_image": float,
    "train_time_s": float,
    "images_per_s": float,
}
OPTIONAL_SUMMARY_FIELDS: dict[str, type | tuple[type, ...]] = {
    "precision": (str, type(None)),
    "machine": (str, type(None)),
    "best_epoch": int,
    "replans": list,
}
CONFIG_FIELDS: dict[str, type | tuple[type, ...]] = {"seed": int}
RESULT_COLUMNS: tuple[str, ...] = (
    "preset",
    "seed",
    "epochs",
    "test_acc",
    "parameters",
    "macs_per_image",
    "train_time_s",
    "images_per_s",
    "precision",
    "machine",
    "grid_kernel",
    "grid_score",
    "grid_score_init",
    "grid_coverage",
    "attention_distance",
)


def selected_presets(experiment: str, presets: list[str] | None) -> tuple[str, ...]:
    """The experiment's presets, or the given subset of them (UserError for others)."""
    known = EXPERIMENTS[experiment]
    if not presets:
        return known
    unknown = [p for p in presets if p not in known]
    if unknown:
        raise UserError(
            f"{', '.join(unknown)} not in experiment {experiment!r}; its presets: {', '.join(known)}"
        )
    return tuple(presets)


def run_folder(out: Path, preset: str, seed: int) -> Path:
    """``out/PRESET/seed-S``: the run folder of ``preset`` with ``seed``."""
    return out / preset / f"seed-{seed}"


def figures_folder(out: Path, preset: str, seed: int) -> Path:
    """``out/figures/PRESET/seed-S``: the figures of that run."""
    return out / "figures" / preset / f"seed-{seed}"


def _refuse_unseeded_run(folder: Path) -> None:
    """UserError if ``folder`` (``out/PRESET``) is itself a run folder, as ``attnconv reproduce``
    laid them out before seeds had folders: it would be neither resumed nor analysed."""
    if run_state(folder) == "new":
        return
    config = RunDir(folder).config
    seed = "S"
    if config.is_file():
        seed = read_json(config, "the run's config", fields=CONFIG_FIELDS)["seed"]
    raise UserError(
        f"{folder} holds a run, where attnconv reproduce expects one folder per seed; move it "
        f"to {folder / f'seed-{seed}'} (its seed) and run again"
    )


def run_state(run_dir: Path) -> str:
    """``"finished"`` (summary.json written), ``"interrupted"`` (a checkpoint to resume from) or
    ``"new"``."""
    if RunDir(run_dir).summary.is_file():
        return "finished"
    if RunDir(run_dir).last.is_file():
        return "interrupted"
    return "new"


def run_plan(
    experiment: str,
    preset: str,
    recipe: str,
    seed: int,
    precision: str | None = None,
    data_dir: str | None = None,
    epochs: int | None = None,
) -> tuple[TrainConfig, list[tuple[int, int]]]:
    """The config of a new run of ``preset`` (of its first plan) and its plans ``(length,
    stop)`` (``attnconv.train.loop.train_in_plans``): the ``recipe``'s (see the module docstring;
    the presets' in ``auto`` precision), with ``seed``, a checkpoint every epoch, and
    ``precision`` and the run's length in ``epochs`` where given."""
    from attnconv.train.config import recorded_config, resolve_config, shipped_recipe

    if recipe not in RECIPES:
        raise UserError(f"unknown recipe {recipe!r}; valid recipes: {', '.join(RECIPES)}")
    settings: dict[str, Any] = {"seed": seed, "checkpoint_every": 1, "data_dir": data_dir}
    if precision is not None:
        settings["precision"] = precision
    if epochs is not None:
        settings["epochs"] = epochs
    if recipe == "shipped":
        try:
            recorded = shipped_recipe(preset)
        except UserError as err:
            raise UserError(f"{err}; train it with --recipe presets") from err
        return recorded_config(recorded, experiment, **settings)
    config = resolve_config(preset, experiment, **{"precision": "auto", **settings})
    return config, [(config.epochs, config.epochs)]


def train_run(run_dir: Path, config: TrainConfig, plans: list[tuple[int, int]]) -> None:
    """Train a new run of ``config`` along ``plans`` into ``run_dir``, continue it from its
    checkpoint (whose saved config, not ``config``, it follows), or leave it if finished."""
    from attnconv.train.loop import train_in_plans
    from attnconv.viz.figures import attention_figure

    state = run_state(run_dir)
    if state == "finished":
        print(f"{config.preset}: finished run in {run_dir}, skipped")
        return
    if state == "interrupted":
        print(f"{config.preset}: resuming {run_dir}")
    train_in_plans(config, run_dir, plans, epoch_figure=attention_figure)


def layer_summaries(maps: AttentionMaps) -> dict[str, Any]:
    """``grid_kernel`` (the K of the grid score, the same for every layer of these models),
    ``grid`` (the token grid ``(h, w)``) and, per layer, ``grid_score``, ``grid_coverage``,
    ``attention_distance`` (the mean over heads, in tokens) and ``head_distances`` (each head's,
    in tokens)."""
    from attnconv.viz.distance import layer_distances
    from attnconv.viz.grid import layer_grid_scores

    scores = layer_grid_scores(maps)
    distances = layer_distances(maps)
    return {
        "grid_kernel": scores[0].kernel_size,
        "grid": tuple(maps.grid),
        "grid_score": [s.score for s in scores],
        "grid_coverage": [s.coverage for s in scores],
        "attention_distance": [float(d.mean()) for d in distances],
        "head_distances": [d.tolist() for d in distances],
    }


def analyse_run(run_dir: Path, figures: Path, data_dir: str | None) -> dict[str, Any]:
    """Figures of the run's best checkpoint (attention models), and its row of the results table.

    For attention models the row also holds ``grid_score_init``: the grid score of the same
    model as training initialised it (the run's seed), so the table shows what training changed;
    ``head_distances``, each layer's per-head attention distances in tokens; and ``grid``, the
    token grid ``(h, w)``. Models with content attention (transformed networks among them) also
    get ``content.csv``, ``content_heads.csv`` and ``content.txt`` in ``figures`` and the row's
    ``content_*`` entries (``attnconv.analysis.content.analyse_checkpoint``).
    """
    import torch

    from attnconv.analysis.content import analyse_checkpoint
    from attnconv.models.checkpoint import construct, load_model
    from attnconv.models.presets import MODELS, PRESETS
    from attnconv.viz.figures import plot_model, test_images
    from attnconv.viz.grid import layer_grid_scores
    from attnconv.viz.maps import compute_attention, is_position_only

    run = RunDir(run_dir)
    summary, config = read_run(run)
    row: dict[str, Any] = {
        "preset": summary["preset"],
        "seed": config["seed"],
        "epochs": summary["epochs"],
        "test_acc": summary["test_acc"],
        "parameters": summary["parameters"],
        "macs_per_image": summary["macs_per_image"],
        "train_time_s": summary["train_time_s"],
        "images_per_s": summary["images_per_s"],
        "precision": summary.get("precision", config.get("precision")),
        "machine": summary.get("machine"),  # runs finished before attnconv recorded it: None
        "grid_kernel": None,
        "grid_score": None,
        "grid_score_init": None,
        "grid_coverage": None,
        "attention_distance": None,
        "head_distances": None,
        "grid": None,
    }
    if row["preset"] not in PRESETS:
        raise UserError(f"{run.summary} names preset {row['preset']!r}, which attnconv has not")
    if PRESETS[row["preset"]].model == "transformed" or hasattr(
        MODELS[PRESETS[row["preset"]].model], "attention_layers"
    ):  # is its content attention alive? (on the whole test split: attnconv.analysis.content)
        row.update(analyse_checkpoint(run.best, figures, data_dir))
    if not hasattr(MODELS[PRESETS[row["preset"]].model], "attention_layers"):
        return row
    model, checkpoint = load_model(run.best)
    if checkpoint["preset"] != row["preset"] or not hasattr(model, "attention_layers"):
        raise UserError(
            f"{run.best} holds a {type(model).__name__} of preset {checkpoint['preset']!r}, but "
            f"the run's summary.json says preset {row['preset']!r}: not this run's checkpoint"
        )
    images = labels = None
    if not is_position_only(model):
        images, labels = test_images(checkpoint["dataset"], AVERAGE_IMAGES, data_dir)
    name = f"{checkpoint['preset']}, epoch {checkpoint['epoch']}"
    plot = plot_model(model, figures, name, images, labels, num_images=AVERAGE_IMAGES, run=run)
    row.update(layer_summaries(plot.maps))
    torch.manual_seed(config["seed"])  # the initial weights of the run (train seeds the same way)
    initial = construct(checkpoint["architecture"], checkpoint["arguments"], run.best).eval()
    initial_maps = compute_attention(initial, tuple(initial.image_size), images)
    row["grid_score_init"] = [score.score for score in layer_grid_scores(initial_maps)]
    return row


def read_run(run: RunDir) -> tuple[dict[str, Any], dict[str, Any]]:
    """A finished run's ``summary.json`` and ``config.json``, read by the bounded reader with the
    fields the table uses checked (``SUMMARY_FIELDS``, ``CONFIG_FIELDS``): FileFormatError (one
    line naming the file) for one that is not UTF-8 JSON, not an object, or has a field of
    another type."""
    from attnconv.runs import check_fields

    summary = read_json(run.summary, "the run's summary", fields=SUMMARY_FIELDS)
    check_fields(summary, OPTIONAL_SUMMARY_FIELDS, f"the run's summary {run.summary}", True)
    config = read_json(run.config, "the run's config", fields=CONFIG_FIELDS)
    return summary, config


def write_distance_comparison(rows: list[dict[str, Any]], figures: Path) -> list[Path]:
    """``figures/distance-by-depth.png`` and ``.pdf``: the per-head attention distances of every
    attention model among ``rows`` (``analyse_run``'s), one panel each, with the uniform-attention
    line of each model's token grid; nothing when none has attention."""
    import torch

    from attnconv.viz.distance import distance_comparison_figure
    from attnconv.viz.style import save_figure

    attention = [row for row in rows if row["head_distances"] is not None]
    if not attention:
        return []
    panels = {  # panel title: the row drawn in it
        f"{row['preset']}\n{100 * row['test_acc']:.1f}%, {row['epochs']} epochs": row
        for row in attention
    }
    fig = distance_comparison_figure(
        {
            name: [torch.tensor(layer) for layer in row["head_distances"]]
            for name, row in panels.items()
        },
        grid={name: row["grid"] for name, row in panels.items()},
    )
    return save_figure(fig, figures, "distance-by-depth")


PER_LAYER_KEYS = ("grid_score", "grid_score_init", "grid_coverage", "attention_distance")


def model_summaries(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per model from the per-run rows (``analyse_run``'s), in the order the models first
    appear: ``seeds`` (the runs' seeds, in order), ``test_acc`` the mean test accuracy and
    ``test_acc_sd`` its sample standard deviation over the seeds (``None`` for one seed);
    parameters, multiply-adds, training time, images/s and the per-layer values as means over the
    seeds; ``epochs`` and ``precision`` as lists of the distinct values."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(row["preset"], []).append(row)
    models = []
    for preset, runs in groups.items():
        accuracies = [run["test_acc"] for run in runs]
        model: dict[str, Any] = {
            "preset": preset,
            "seeds": [run["seed"] for run in runs],
            "epochs": list(dict.fromkeys(run["epochs"] for run in runs)),
            "precision": list(dict.fromkeys(str(run["precision"]) for run in runs)),
            "grid_kernel": runs[0]["grid_kernel"],
            "test_acc": statistics.fmean(accuracies),
            "test_acc_sd": statistics.stdev(accuracies) if len(runs) > 1 else None,
        }
        for key in ("parameters", "macs_per_image", "train_time_s", "images_per_s"):
            model[key] = statistics.fmean(run[key] for run in runs)
        for key in PER_LAYER_KEYS:
            per_run = [run[key] for run in runs]
            model[key] = (
                None
                if per_run[0] is None
                else [statistics.fmean(layer) for layer in zip(*per_run, strict=True)]
            )
        models.append(model)
    return models


def _per_layer(values: list[float] | None, digits: int) -> str:
    return "-" if values is None else " / ".join(f"{v:.{digits}f}" for v in values)


def _covered_taps(row: dict[str, Any]) -> str:
    """Taps covered per layer, ``n/K²``; a mean over seeds that is not whole has one decimal."""
    if row["grid_coverage"] is None:
        return "-"
    taps = row["grid_kernel"] ** 2
    counts = [c * taps for c in row["grid_coverage"]]
    return " / ".join(
        f"{round(n)}/{taps}" if abs(n - round(n)) < 1e-6 else f"{n:.1f}/{taps}" for n in counts
    )


def _accuracy(model: dict[str, Any]) -> str:
    mean = f"{100 * model['test_acc']:.2f}"
    return mean if model["test_acc_sd"] is None else f"{mean} ± {100 * model['test_acc_sd']:.2f}"


def format_results(
    rows: list[dict[str, Any]], references: tuple[tuple[str, str, str], ...] = ()
) -> str:
    """The results of the runs ``rows`` (``analyse_run``'s) as a Markdown table, one row per model
    (``model_summaries``: accuracy as mean ± standard deviation over the seeds, other numbers as
    means), then the ``references`` (model, accuracy, source) as a list of baselines trained
    elsewhere, then the machines that trained the runs (``machine``, as each run's summary
    records it)."""
    from attnconv.viz.report import format_duration

    headers = [
        "model",
        "seeds",
        "epochs",
        "test acc. (%)",
        "params",
        "MACs/image",
        "train time",
        "images/s",
        "precision",
        "grid score per layer",
        "grid score at initialisation",
        "taps covered per layer",
        "attention distance per layer (tokens)",
    ]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for row in model_summaries(rows):
        cells = [
            f"`{row['preset']}`",
            ", ".join(map(str, row["seeds"])),
            " / ".join(map(str, row["epochs"])),
            _accuracy(row),
            f"{row['parameters'] / 1e3:.0f}k",
            f"{row['macs_per_image'] / 1e6:.1f}M",
            format_duration(row["train_time_s"]),
            f"{row['images_per_s']:.0f}",
            " / ".join(row["precision"]),
            _per_layer(row["grid_score"], 2),
            _per_layer(row["grid_score_init"], 2),
            _covered_taps(row),
            _per_layer(row["attention_distance"], 2),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if references:
        lines += ["", "Reference points (test accuracy, not trained here):", ""]
        lines += [f"- {model}: {accuracy} ({source})" for model, accuracy, source in references]
    return "\n".join([*lines, "", *_machines(rows)]) + "\n"


def _machines(rows: list[dict[str, Any]]) -> list[str]:
    """``Trained on: MACHINE`` when every run names the same one, else one line per machine with
    its runs (``preset (seed S)``); a run finished before attnconv recorded it: ``not recorded``."""
    runs: dict[str, list[str]] = {}
    for row in rows:
        machine = row["machine"] or "not recorded"
        runs.setdefault(machine, []).append(f"`{row['preset']}` (seed {row['seed']})")
    if len(runs) == 1:
        return [f"Trained on: {next(iter(runs))}"]
    return ["Trained on:", ""] + [
        f"- {machine}: {', '.join(names)}" for machine, names in runs.items()
    ]


def write_results(
    rows: list[dict[str, Any]],
    out: Path,
    references: tuple[tuple[str, str, str], ...] = (),
) -> list[Path]:
    """``results.md`` (one row per model, the ``references`` below the table) and ``results.csv``
    (one row per run, per-layer values joined by spaces) in ``out``."""
    markdown = out / "results.md"
    write_text_atomic(markdown, format_results(rows, references))
    table = out / "results.csv"
    handle = io.StringIO(newline="")
    writer = csv.DictWriter(handle, fieldnames=list(RESULT_COLUMNS))
    writer.writeheader()
    for row in rows:
        writer.writerow(
            {
                key: " ".join(f"{v:.4f}" for v in row[key])
                if isinstance(row[key], list)
                else row[key]
                for key in RESULT_COLUMNS
            }
        )
    write_text_atomic(table, handle.getvalue())
    return [markdown, table]


def write_against_baseline(
    experiment: str, out: Path, rows: list[dict[str, Any]], data_dir: str | None
) -> None:
    """Append to ``out/results.md`` every model's run against the experiment's size-matched CNN
    (``BASELINES``) run of the same seed, on the test split (McNemar's exact test; nothing when
    the CNN has no run of a seed among ``rows``)."""
    from attnconv.analysis.paired import PairedRun, against_baseline, format_against_baseline

    if not any(row["preset"] == BASELINES[experiment] for row in rows):
        return
    runs = [
        PairedRun(row["preset"], row["seed"], row["epochs"],
                  str(RunDir(run_folder(out, row["preset"], row["seed"])).best))
        for row in rows
    ]  # fmt: skip
    pairs = against_baseline(runs, BASELINES[experiment], data_dir)
    if not pairs:
        return
    text = (
        f"\nAgainst `{BASELINES[experiment]}` (the size-matched CNN) on the same 10,000 test "
        f"images, run by run (the checkpoints chosen on validation; McNemar's exact test on the "
        f"images only one of the two gets right):\n\n{format_against_baseline(pairs)}"
    )
    markdown = out / "results.md"
    write_text_atomic(markdown, markdown.read_text(encoding="utf-8") + text)


def export_run(run_dir: Path, data: DataSplits, folder: Path) -> float:
    """Ship the run's best checkpoint into ``folder`` as pretrained weights; returns its float32
    accuracy on ``data``'s test split (the run's dataset).

    The entry's ``run`` says how the weights were trained: the ``attnconv train`` command that
    repeats the run (``attnconv.train.config.training_command``), its length, best epoch,
    precision, training time in seconds and, where ``summary.json`` records it, the machine."""
    from attnconv.data import BatchLoader
    from attnconv.models.checkpoint import load_model
    from attnconv.models.presets import PRESETS
    from attnconv.models.pretrained import export_pretrained
    from attnconv.train.config import load_config, training_command
    from attnconv.train.loop import evaluation_sums

    run = RunDir(run_dir)
    model, checkpoint = load_model(run.best)
    preset = PRESETS[checkpoint["preset"]]
    loader = BatchLoader(data.test, 500, device="cpu", train=False, flip=False)
    _, correct, seen = evaluation_sums(model, loader, "fp32")
    summary, _ = read_run(run)
    config = load_config(run.config)
    # runs finished before attnconv recorded them lack replans and machine
    machine = {"machine": summary["machine"]} if "machine" in summary else {}
    export_pretrained(
        model,
        preset.name,
        description=preset.description,
        dataset=checkpoint["dataset"],
        architecture=checkpoint["architecture"],
        arguments=checkpoint["arguments"],
        test_accuracy=correct / seen,
        run={
            "command": training_command(config, summary.get("replans", ())),
            "epochs": summary["epochs"],
            "best_epoch": summary["best_epoch"],
            "precision": summary.get("precision"),
            "train_time_s": summary["train_time_s"],
            **machine,
        },
        folder=folder,
    )
    return correct / seen


def export_test_samples(data: DataSplits, folder: Path) -> Path:
    """Ship the first ``SAMPLE_COUNT`` test images of ``data`` into ``folder`` beside the weights."""
    from attnconv.models.pretrained import SAMPLE_COUNT, export_samples

    return export_samples(
        data.test.images[:SAMPLE_COUNT],
        data.test.labels[:SAMPLE_COUNT],
        data.classes,
        data.name,
        folder,
    )


def finished_seeds(out: Path, preset: str, seeds: Sequence[int] | None) -> list[int]:
    """The seeds of ``preset``'s finished runs in ``out`` (``out/PRESET/seed-S`` with a
    ``summary.json``): of ``seeds`` in their order, or of every seed folder there, in increasing
    order, when ``seeds`` is None. Each requested or found run that is not finished is named on
    standard error."""
    folder = out / preset
    if seeds is None:
        found = [] if not folder.is_dir() else folder.glob("seed-*")
        seeds = sorted(
            int(path.name.removeprefix("seed-"))
            for path in found
            if path.name.removeprefix("seed-").isdecimal()
        )
        if not seeds:
            print(f"{preset}: no runs in {folder}, left out", file=sys.stderr)
    finished = []
    for seed in seeds:
        run = run_folder(out, preset, seed)
        state = run_state(run)
        if state == "finished":
            finished.append(seed)
        else:
            what = "no run" if state == "new" else "an unfinished run"
            print(f"{preset}: {what} in {run}, left out", file=sys.stderr)
    return finished


def run_experiment(
    experiment: str,
    out: str | Path,
    presets: list[str] | None = None,
    precision: str | None = None,
    data_dir: str | None = None,
    export_weights: str | Path | None = None,
    seeds: Sequence[int] | None = None,
    recipe: str = "presets",
    analyse_only: bool = False,
    epochs: int | None = None,
) -> list[Path]:
    """Train (or resume, or skip) every selected model of ``experiment`` once per seed into
    ``out``, analyse the runs and write the results table; returns the files of the table and of
    the distance comparison figure.

    ``seeds``: the runs of each model (``None``: seed 0). ``recipe``: ``"presets"`` trains new
    runs as the presets stand (every model the same epochs), ``"shipped"`` as the shipped weights
    were trained (module docstring); ``precision`` (``None``: the recipe's) and ``epochs``
    (``None``: the recipe's) apply to new runs. ``analyse_only``
    trains nothing: the table is made of the finished runs in ``out``, of ``seeds`` or (``None``)
    of every seed folder of each model, so models may have different seeds; the runs left out
    are named. ``export_weights``: a folder to ship the best checkpoint of each model's first
    run into (``""``: the package's own weights folder); ``None`` ships nothing.
    """
    presets = selected_presets(experiment, presets)
    if seeds is not None:
        seeds = list(dict.fromkeys(seeds))  # each seed once, in the order given
        if not seeds:
            raise UserError("reproduce needs at least one seed")
    out = Path(out)
    for preset in presets:
        _refuse_unseeded_run(out / preset)
    if analyse_only:
        runs = [(preset, seed) for preset in presets for seed in finished_seeds(out, preset, seeds)]
        if not runs:
            raise UserError(f"no finished runs of {', '.join(presets)} in {out} to analyse")
    else:
        runs = [(preset, seed) for preset in presets for seed in seeds or [0]]
        # every run's config is resolved, so checked, before the first one trains for hours
        configs = [
            run_plan(experiment, p, recipe, s, precision, data_dir, epochs) for p, s in runs
        ]
        out.mkdir(parents=True, exist_ok=True)
        for (preset, seed), (config, plans) in zip(runs, configs, strict=True):
            train_run(run_folder(out, preset, seed), config, plans)
    rows = [
        analyse_run(run_folder(out, preset, seed), figures_folder(out, preset, seed), data_dir)
        for preset, seed in runs
    ]
    files = write_results(rows, out, REFERENCES.get(experiment, ()))
    write_against_baseline(experiment, out, rows, data_dir)
    first_runs: dict[str, int] = {}  # each model's first run's seed
    for preset, seed in runs:
        first_runs.setdefault(preset, seed)
    files += write_distance_comparison(
        [row for row in rows if first_runs[row["preset"]] == row["seed"]], out / "figures"
    )
    print((out / "results.md").read_text())
    if export_weights is not None:
        from attnconv.data import load_splits
        from attnconv.data.corruptions import nonstandard_test_set
        from attnconv.models.pretrained import WEIGHTS_DIR

        folder = Path(export_weights) if export_weights else WEIGHTS_DIR
        data = load_splits(experiment, data_dir)  # once for every model
        unlike = nonstandard_test_set(experiment, data.test)
        if unlike:  # the index states a test accuracy: it must be the standard test set's
            raise UserError(f"--export-weights: the {experiment} data in use is {unlike}")
        for preset, seed in first_runs.items():
            accuracy = export_run(run_folder(out, preset, seed), data, folder)
            print(f"{preset}: shipped (seed {seed}), float32 test accuracy {accuracy:.4f}")
        export_test_samples(data, folder)
    print(f"wrote {', '.join(str(f) for f in files)} and {out / 'figures'}", file=sys.stderr)
    return files
