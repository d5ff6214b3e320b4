"""Training config resolution and type checking, and the learning-rate schedules."""

import json
import math
import re

import pytest

from attnconv import errors
from attnconv.errors import UserError
from attnconv.models import PRESETS, Preset
from attnconv.train.config import (
    CONFIG_KEYS,
    RECIPE_KEYS,
    TrainConfig,
    check_value,
    coerce,
    extended_config,
    load_config,
    read_training_command,
    recorded_config,
    resolve_config,
    save_config,
    shipped_recipe,
    training_command,
)
from attnconv.train.schedule import LRSchedule, build_schedule
from train_helpers import command_config, without_bookkeeping

# ---------------------------------------------------------------------------- config


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_recipe_resolves_to_its_values(preset: str) -> None:
    recipe = PRESETS[preset].recipe
    assert set(recipe) <= set(RECIPE_KEYS)
    init = {"init": "a.pt"} if PRESETS[preset].requires_init else {}
    config = resolve_config(preset, **init)
    defaults = TrainConfig(preset=preset, dataset=PRESETS[preset].dataset)
    for key in RECIPE_KEYS:
        expected = recipe.get(key, getattr(defaults, key))
        assert getattr(config, key) == (tuple(expected) if key == "milestones" else expected), key
    assert config.dataset == PRESETS[preset].dataset


def test_a_bad_recipe_is_named_when_a_config_is_resolved(monkeypatch) -> None:
    bad = Preset("bad", "", "image_transformer", {}, {"lr": "fast"})
    monkeypatch.setitem(PRESETS, "bad", bad)
    with pytest.raises(UserError, match="preset 'bad' recipe lr: expected float, got 'fast'"):
        resolve_config("bad")
    monkeypatch.setitem(PRESETS, "bad", Preset("bad", "", "image_transformer", {}, {"seed": 1}))
    with pytest.raises(UserError, match=re.escape("recipe key(s) seed are not training settings")):
        resolve_config("bad")


def test_recipe_is_a_deprecated_alias_of_the_mapping(monkeypatch) -> None:
    from attnconv.models import Recipe

    monkeypatch.setattr(errors, "_warned", set())  # warned once per process: maybe already

    with pytest.warns(DeprecationWarning, match="Recipe is deprecated"):
        recipe = Recipe(lr=0.01, epochs=3)
    assert recipe == {"lr": 0.01, "epochs": 3}
    with pytest.raises(TypeError, match="dataset: now arguments of Preset"):
        Recipe(dataset="digits")


def test_typed_settings_are_checked_not_parsed() -> None:
    config = resolve_config("quick", epochs=3, compile=True, precision="fp32", data_dir=None,
                            model={"dropout": 0.1})
    assert (config.epochs, config.compile, config.precision) == (3, True, "fp32")
    assert config.model == {"dropout": 0.1}
    with pytest.raises(UserError, match="epochs: expected int, got '3'"):
        resolve_config("quick", epochs="3")
    with pytest.raises(UserError, match="epochs is given twice"):
        resolve_config("quick", overrides=["epochs=4"], epochs=3)
    assert check_value([1, 2], tuple[int, ...], "milestones") == (1, 2)


def test_paper_recipe_values() -> None:
    config = resolve_config("quadratic")
    assert (config.lr, config.momentum, config.weight_decay, config.batch_size) == (
        0.1, 0.9, 1e-4, 100)
    assert (config.epochs, config.schedule, config.warmup_fraction) == (300, "cosine", 0.05)
    resnet = resolve_config("resnet18")
    assert resnet.schedule == "step" and resnet.milestones == (80, 150, 250)


def test_string_overrides_are_parsed_by_type() -> None:
    config = resolve_config("quick", overrides=[
        "epochs=7", "lr=0.05", "compile=true", "grad_clip=2.5", "val_size=0.2",
        "schedule=step", "milestones=3,5", "model.heads=3,2", "model.head_dim=none", "model.dropout=0",
        "precision=bf16", "tensorboard=no",
    ])
    assert config.epochs == 7 and isinstance(config.epochs, int)
    assert config.lr == 0.05 and config.compile is True and config.tensorboard is False
    assert config.grad_clip == 2.5 and config.val_size == 0.2 and config.milestones == (3, 5)
    assert config.model == {"heads": (3, 2), "head_dim": None, "dropout": 0.0}
    assert config.precision == "bf16"
    assert resolve_config("quick", overrides={"val_size": "100"}).val_size == 100


def test_python_values_are_type_checked() -> None:
    assert resolve_config("quick", overrides={"lr": 1}).lr == 1.0
    with pytest.raises(UserError, match=re.escape("epochs: expected int, got 2.5")):
        resolve_config("quick", overrides={"epochs": 2.5})
    with pytest.raises(UserError, match="compile: expected bool"):
        resolve_config("quick", overrides={"compile": 1})


@pytest.mark.parametrize(("override", "message"), [
    ("epochs=1.5", "epochs: expected int, got '1.5'"),
    ("lr=fast", "lr: expected float, got 'fast'"),
    ("lr=nan", "lr: expected float"),
    ("compile=maybe", "compile: expected bool"),
    ("model.heads=a,b", "model.heads: expected int | Sequence"),
    ("lr=-0.1", "lr must be > 0, got -0.1"),
    ("lr=0", "lr must be > 0"),
    ("epochs=-3", "epochs must be >= 1, got -3"),
    ("batch_size=0", r"batch_size must be in \[1, 1000000\], got 0"),
    ("momentum=1", r"momentum must be in \[0, 1\)"),
    ("weight_decay=-1e-4", "weight_decay must be >= 0"),
    ("warmup_fraction=1", "warmup_fraction"),
    ("milestones=5,3", "milestones apply to schedule=step only"),
    ("data_dir=/data", "data_dir does nothing for 'digits'"),
    ("schedule=linear", "unknown schedule 'linear'; valid schedules: cosine, step"),
    ("optimizer=adam", "unknown optimizer 'adam'; valid optimizers: sgd, adamw"),
    ("precision=fp16", "unknown precision 'fp16'; valid: auto, fp32, bf16"),
    ("dataset=mnist", "unknown dataset 'mnist'; valid datasets: cifar10"),
    ("grad_clip=0", "grad_clip must be > 0"),
    ("device=tpu", "device must be auto, cpu, cuda or cuda:N"),
    ("checkpoint_every=-1", "checkpoint_every must be >= 0"),
    ("seed=-1", r"seed must be an integer in \[0, 2\*\*63\), got -1"),
    ("seed=1180591620717411303424",
     r"seed must be an integer in \[0, 2\*\*63\), got 1180591620717411303424"),
    ("seed=9223372036854775808", r"seed must be an integer in \[0, 2\*\*63\)"),
    ("init=x.pt", "--init is only for presets that fine-tune"),
    ("bogus=1", "unknown config key 'bogus'; valid keys: preset, dataset"),
    ("model.bogus=1", "unknown model key 'model.bogus' for preset 'quick'; valid "
     "model keys: model.stem, model.hidden"),
    ("model.num_classes=3", "unknown model key 'model.num_classes'"),
    ("lr", "expected an override of the form key=value, got 'lr'"),
    ("preset=quadratic", "the preset is 'quick'"),
])
def test_bad_values_are_named(override: str, message: str) -> None:
    with pytest.raises(UserError, match=message):  # what the command line prints as one line
        resolve_config("quick", overrides=[override])


def test_the_largest_seed_draws_a_validation_split_and_batches() -> None:
    from attnconv.data import BatchLoader, load_splits

    seed = resolve_config("quick", overrides=[f"seed={2**63 - 1}"]).seed
    splits = load_splits("digits", seed=seed)
    other = load_splits("digits", seed=seed - 1)
    assert len(splits.val) == len(other.val) and not splits.val.labels.equal(other.val.labels)
    loader = BatchLoader(splits.train, 8, device="cpu", train=True, flip=True, pad=1, seed=seed)
    images, labels = next(loader.epoch(0))
    assert images.shape == (8, 1, 8, 8) and labels.shape == (8,)


def test_unknown_preset_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="unknown preset 'nope'; valid presets: quadratic, "):
        resolve_config("nope")


def test_pruned_preset_needs_init() -> None:
    with pytest.raises(ValueError, match="give --init CHECKPOINT"):
        resolve_config("quadratic-generalized-pruned")
    config = resolve_config("quadratic-generalized-pruned", overrides={"init": "a.pt"})
    assert (config.lr, config.epochs) == (0.01, 100)


def test_milestones_scale_with_a_shorter_run() -> None:
    assert resolve_config("resnet18", overrides=["epochs=30"]).milestones == (8, 15, 25)
    # 80·3/300 = 0.8 → 1, 1.5 → 2, 2.5 → 2 (round half to even): the rate drops 10× then 100×
    assert resolve_config("resnet18", overrides=["epochs=3"]).milestones == (1, 2, 2)
    # 80·2/300 = 0.53 → 1, 1.0 → 1, 1.67 → 2: the one at the last epoch would never act
    assert resolve_config("resnet18", epochs=2).milestones == (1, 1)
    explicit = resolve_config("resnet18", overrides=["epochs=30", "milestones=10,20"])
    assert explicit.milestones == (10, 20)
    with pytest.raises(UserError, match=r"milestones must be non-decreasing epochs in \[1, epochs=30\)"):
        resolve_config("resnet18", overrides=["epochs=30", "milestones=10,30"])


def test_milestones_belong_to_the_step_schedule() -> None:
    with pytest.raises(UserError, match="milestones apply to schedule=step only; the cosine"):
        resolve_config("quadratic", milestones=(100,))
    assert resolve_config("resnet18", schedule="cosine").milestones == ()  # the recipe's dropped
    assert resolve_config("quadratic", schedule="step").milestones == ()  # a constant rate
    step = resolve_config("quadratic", overrides=["schedule=step", "milestones=100,200"])
    assert step.milestones == (100, 200)


def test_saved_configs_of_earlier_versions_drop_milestones_that_did_nothing(tmp_path) -> None:
    values = resolve_config("quick").to_dict()
    values["milestones"] = [80, 150, 250]  # every config of a cosine run used to hold these
    assert TrainConfig.from_dict(values).milestones == ()
    resnet = resolve_config("resnet18", epochs=10).to_dict()
    resnet["milestones"] = [3, 5, 10]
    assert TrainConfig.from_dict(resnet).milestones == (3, 5)


def test_an_extended_config_has_the_new_length_and_keeps_step_milestones() -> None:
    cosine = resolve_config("quick", epochs=6, lr=0.03)
    longer = extended_config(cosine, 12, trained=6)
    assert longer == resolve_config("quick", epochs=12, lr=0.03)  # planned with 12 from the start
    step = resolve_config("resnet18", epochs=30)  # milestones scaled to (8, 15, 25)
    assert extended_config(step, 40, trained=30).milestones == (8, 15, 25)  # not rescaled to 40
    # an interrupted run (12 of 30 epochs) shortened to 20: the milestone at 25 never acts
    assert extended_config(step, 20, trained=12).milestones == (8, 15)
    assert extended_config(step, 13, trained=12).epochs == 13
    for epochs in (6, 5):
        with pytest.raises(UserError, match=r"the run has trained 6 epoch\(s\); --epochs sets its "
                           r"new length in all, so it must be more than 6 \(e.g. --epochs 12"):
            extended_config(cosine, epochs, trained=6)


@pytest.mark.parametrize(
    ("preset", "dataset", "overrides", "command"),
    [
        ("quick", None, [], "attnconv train --preset quick"),
        (
            "quadratic-fashion",
            None,
            ["precision=fp32", "model.weight_init=fan_in", "checkpoint_every=1", "progress=false"],
            "attnconv train --preset quadratic-fashion precision=fp32 model.weight_init=fan_in",
        ),
        # the scaled milestones follow from the length: not written out
        ("resnet18", "cifar100", ["epochs=30"], "attnconv train --preset resnet18 --dataset cifar100 epochs=30"),
        ("resnet18", None, ["epochs=30", "milestones=5,10"], "attnconv train --preset resnet18 epochs=30 milestones=5,10"),
        ("resnet18", None, ["milestones="], "attnconv train --preset resnet18 milestones="),
        ("resnet18", None, ["schedule=cosine"], "attnconv train --preset resnet18 schedule=cosine"),
        (
            "quadratic-generalized-pruned",
            None,
            ["init=pretrained:my run", "lr=0.02"],  # read back: --init must name a file or this
            "attnconv train --preset quadratic-generalized-pruned --init 'pretrained:my run' lr=0.02",
        ),
        (
            "quick",
            "digits",
            ["model.heads=3,2", "grad_clip=1", "val_size=0.25", "compile=true", "seed=7", "device=cpu"],
            "attnconv train --preset quick val_size=0.25 grad_clip=1.0 compile=true seed=7 model.heads=3,2",
        ),
    ],
)
def test_training_command_trains_the_same_config(preset, dataset, overrides, command) -> None:
    config = resolve_config(preset, dataset, overrides)
    assert training_command(config) == command
    # read back by the command line, it is the same run (where it writes and reports aside)
    assert without_bookkeeping(command_config(command)) == without_bookkeeping(config)


def test_training_command_of_an_extended_run_repeats_its_resumes() -> None:
    planned = resolve_config("quick", epochs=6, lr=0.03)
    extended = extended_config(extended_config(planned, 10, trained=6), 14, trained=10)
    assert training_command(extended, [[6, 6], [10, 10]]) == (
        "attnconv train --preset quick epochs=6 lr=0.03 --out RUN"
        " && attnconv train --resume RUN --epochs 10 && attnconv train --resume RUN --epochs 14"
    )
    assert command_config(training_command(extended, [[6, 6], [10, 10]]).split(" --out")[0]) == planned
    # given a new length after its epoch 4 of 6: no command line stops a run there
    assert training_command(extended_config(planned, 10, trained=4), [[6, 4]]) == (
        "attnconv train --preset quick epochs=6 lr=0.03 --out RUN (stopped after epoch 4)"
        " && attnconv train --resume RUN --epochs 10"
    )


def test_a_recorded_command_reads_back_into_its_plans() -> None:
    planned = resolve_config("quick", epochs=6, lr=0.03)
    extended = extended_config(extended_config(planned, 10, trained=4), 14, trained=10)
    command = training_command(extended, [[6, 4], [10, 10]])
    recorded = read_training_command(command)
    assert (recorded.preset, recorded.dataset, recorded.init) == ("quick", None, None)
    assert recorded.overrides == ("epochs=6", "lr=0.03")
    assert recorded.plans == [(6, 4), (10, 10), (14, 14)]
    assert training_command(extended, [[6, 4], [10, 10]]) == command  # what it was read from
    first, plans = recorded_config(recorded)
    assert first == planned and plans == recorded.plans
    # given settings replace the recorded ones; epochs is the final length
    first, plans = recorded_config(recorded, overrides=["lr=0.5"], epochs=20, seed=3)
    assert (first.lr, first.epochs, first.seed, plans[-1]) == (0.5, 6, 3, (20, 20))
    with pytest.raises(UserError, match=r"trained 10 epoch.* must exceed that, got epochs=9"):
        recorded_config(recorded, epochs=9)
    pruned = read_training_command(
        "attnconv transform --pretrained x --out t && attnconv train --preset "
        "quadratic-generalized-pruned --dataset cifar100 --init 't/my run.pt' lr=0.02"
    )
    assert (pruned.dataset, pruned.init, pruned.overrides) == ("cifar100", "t/my run.pt", ("lr=0.02",))
    assert pruned.plans == [(100, 100)]
    with pytest.raises(UserError, match=r"cannot read the training command .*unexpected '--bogus'"):
        read_training_command("attnconv train --preset quick --bogus")
    with pytest.raises(UserError, match=r"preset 'quick' has no shipped recipe.*learned-fashion"):
        shipped_recipe("quick")


def test_config_json_round_trip(tmp_path) -> None:
    config = resolve_config("quick", "digits", ["model.heads=3,2", "grad_clip=1", "val_size=50"])
    save_config(config, tmp_path / "config.json")
    again = load_config(tmp_path / "config.json")
    assert again == config
    assert set(config.to_dict()) == {*CONFIG_KEYS, "model"}


@pytest.mark.parametrize("precision", ["fp32", "bf16", "auto"])
def test_precision_defaults_to_auto_and_saved_precisions_load(tmp_path, precision) -> None:
    assert resolve_config("quick").precision == "auto"
    values = resolve_config("quick").to_dict()
    values["precision"] = precision  # config.json of older runs says fp32 or bf16
    (tmp_path / "config.json").write_text(json.dumps(values))
    assert load_config(tmp_path / "config.json").precision == precision


def test_load_config_errors(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="no training config"):
        load_config(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match=re.escape("bad.json cannot be read (not valid JSON")):
        load_config(tmp_path / "bad.json")
    for data, message in ((b"\xff", "not UTF-8 text"), (b"[" * 100_000, "nested too deeply"),
                          (b"[]", "must hold an object, not an array")):  # fmt: skip
        (tmp_path / "bad.json").write_bytes(data)
        with pytest.raises(ValueError, match=re.escape(message)):
            load_config(tmp_path / "bad.json")


def test_coerce_tuple_of_fixed_length() -> None:
    assert coerce("8, 8", tuple[int, int], "image_size") == (8, 8)
    with pytest.raises(UserError, match="2 values"):
        coerce("8,8,8", tuple[int, int], "image_size")
    assert TrainConfig("quick", "digits").model == {}


# ---------------------------------------------------------------------------- schedules


def closed_form_cosine(step: int, total: int, warmup: int, base: float) -> float:
    """The paper recipe written out independently: linear ramp to base, then half a cosine."""
    if step < warmup:
        return base * (step + 1) / warmup
    t = (step - warmup) / (total - warmup)
    return base * (1 + math.cos(math.pi * t)) / 2


def test_cosine_schedule_matches_closed_form() -> None:
    steps_per_epoch, epochs, base = 450, 300, 0.1  # CIFAR-10: 45000 images / batch 100
    schedule = build_schedule("cosine", base, epochs, steps_per_epoch, 0.05)
    total = epochs * steps_per_epoch
    assert schedule.total_steps == total and schedule.warmup_steps == 6750
    for step in [0, 1, 2, 100, 6748, 6749, 6750, 6751, 50000, 100000, total - 2, total - 1]:
        assert schedule(step) == pytest.approx(closed_form_cosine(step, total, 6750, base),
                                               rel=1e-12, abs=1e-15)
    assert schedule(0) == pytest.approx(base / 6750)  # first update already has a positive rate
    assert schedule(6749) == pytest.approx(base)  # end of warm-up: the full rate
    assert 0 < schedule(total - 1) < 1e-8
    # never a zero-rate epoch; rate changes within every epoch (stepped per iteration)
    for epoch in range(epochs):
        rates = [schedule(epoch * steps_per_epoch + i) for i in (0, steps_per_epoch - 1)]
        assert min(rates) > 0 and rates[0] != rates[1]


def test_cosine_schedule_is_monotone_after_warmup() -> None:
    schedule = build_schedule("cosine", 0.1, 10, 20, 0.05)
    rates = [schedule(s) for s in range(schedule.total_steps)]
    assert rates[: schedule.warmup_steps] == sorted(rates[: schedule.warmup_steps])
    tail = rates[schedule.warmup_steps - 1 :]
    assert tail == sorted(tail, reverse=True)


def test_tiny_warmup_fraction_still_ramps() -> None:
    schedule = build_schedule("cosine", 1.0, 1, 10, 0.01)  # 0.1 steps → one warm-up step
    assert schedule.warmup_steps == 1
    assert schedule(0) == 1.0


def test_step_schedule_divides_by_ten_at_milestones() -> None:
    schedule = build_schedule("step", 0.1, 300, 450, 0.0, (80, 150, 250))
    for epoch, expected in [(0, 0.1), (79, 0.1), (80, 0.01), (149, 0.01), (150, 0.001),
                            (249, 0.001), (250, 0.0001), (299, 0.0001)]:
        for step in (epoch * 450, epoch * 450 + 449):
            assert schedule(step) == pytest.approx(expected, rel=1e-12)


def test_repeated_milestone_divides_twice() -> None:
    schedule = build_schedule("step", 1.0, 3, 4, 0.0, (1, 2, 2))
    assert [schedule(s) for s in (0, 3, 4, 7, 8, 11)] == pytest.approx(
        [1.0, 1.0, 0.1, 0.1, 0.001, 0.001], rel=1e-12)


def original_epoch_rule(step: int, epochs: int, steps_per_epoch: int, ratio: float, base: float):
    """The paper code's rate (epfml/attention-cnn train.py, utils/learning_rate.py), written out:
    ``scheduler.step(global_step)`` at each epoch's start, ``T_warmup = int(T_max · ratio)``, a
    ramp ``step / T_warmup``, then half a cosine; the rate holds until the next epoch."""
    t_max = epochs * steps_per_epoch
    t_warmup = int(t_max * ratio)
    start = (step // steps_per_epoch) * steps_per_epoch
    if start < t_warmup:
        return base * start / t_warmup
    return base * 0.5 * (1 + math.cos(math.pi * (start - t_warmup) / (t_max - t_warmup)))


def test_epoch_stepping_follows_the_original_rule_with_epoch_0_at_rate_0() -> None:
    epochs, steps_per_epoch, ratio, base = 10, 7, 0.25, 0.1  # warm-up: int(17.5) = 17 steps
    schedule = build_schedule("cosine", base, epochs, steps_per_epoch, ratio, stepping="epoch")
    assert schedule.warmup_steps == 17
    rates = [schedule(step) for step in range(epochs * steps_per_epoch)]
    assert rates == pytest.approx(
        [original_epoch_rule(s, epochs, steps_per_epoch, ratio, base) for s in range(70)],
        rel=1e-12, abs=0.0,
    )
    by_epoch = [rates[e * steps_per_epoch : (e + 1) * steps_per_epoch] for e in range(epochs)]
    assert all(len(set(epoch)) == 1 for epoch in by_epoch)  # one rate an epoch
    assert by_epoch[0][0] == 0.0  # the whole first epoch at rate 0
    assert [epoch[0] for epoch in by_epoch[1:3]] == pytest.approx([base * 7 / 17, base * 14 / 17])
    # the per-step default ramps within the epoch and never runs at rate 0
    per_step = build_schedule("cosine", base, epochs, steps_per_epoch, ratio)
    assert per_step.warmup_steps == 18 and per_step(0) == pytest.approx(base / 18)
    # at the paper's size the warm-up is 15 stairs of one epoch
    paper = build_schedule("cosine", 0.1, 300, 450, 0.05, stepping="epoch")
    warm = [paper(e * 450) for e in range(16)]
    assert warm[0] == 0.0 and warm[14] == pytest.approx(0.1 * 14 / 15) and warm[15] == 0.1


def test_epoch_stepping_is_a_named_setting_the_command_repeats() -> None:
    config = resolve_config("quadratic", overrides=["schedule_stepping=epoch"])
    assert config.schedule_stepping == "epoch" and resolve_config("quadratic").schedule_stepping == "step"
    assert training_command(config) == "attnconv train --preset quadratic schedule_stepping=epoch"
    with pytest.raises(ValueError, match="unknown schedule_stepping 'batch'; valid: step, epoch"):
        resolve_config("quadratic", overrides=["schedule_stepping=batch"])
    with pytest.raises(ValueError, match="stepping must be one of"):
        LRSchedule("cosine", 0.1, 10, 5, 0, stepping="iteration")


def test_schedule_rejects_out_of_range_steps() -> None:
    schedule = build_schedule("cosine", 0.1, 2, 5, 0.05)
    with pytest.raises(ValueError, match=r"step must be in \[0, 10\), got 10"):
        schedule(10)
    with pytest.raises(ValueError, match="schedule kind"):
        LRSchedule("linear", 0.1, 10, 5, 0)


def test_weight_decay_exempts_what_the_papers_code_exempted() -> None:
    assert resolve_config("quadratic").decay_exempt == "original"
    assert resolve_config("quadratic", overrides=["decay_exempt=norms-biases-positional"]) \
        .decay_exempt == "norms-biases-positional"
    with pytest.raises(UserError, match="unknown decay_exempt 'all'; valid: original, norms-"):
        resolve_config("quadratic", overrides=["decay_exempt=all"])
    # Configs saved before the setting existed ran with the earlier rule, and resume with it
    # (so their optimizer's parameter groups still line up); new configs keep what they say.
    saved = resolve_config("quick").to_dict()
    assert TrainConfig.from_dict(saved).decay_exempt == "original"
    del saved["decay_exempt"]
    assert TrainConfig.from_dict(saved).decay_exempt == "norms-biases-positional"
