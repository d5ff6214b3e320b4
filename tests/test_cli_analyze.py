"""`attnconv analyze`: timm models with random weights (torchvision's path is the same after the
model is built: test_analysis_third_party.py builds them, test_analysis_record.py records them),
attnconv's own models, the explorer page (also beside the shipped models, `attnconv explore
--add`), and the errors."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch

from attnconv.analysis import record_attention
from attnconv.analysis.images import load_images
from attnconv.analysis.measures import patch_attention
from attnconv.analysis.third_party import build_third_party
from attnconv.cli import main
from attnconv.viz.distance import attention_distance
from attnconv.viz.export import decode_content, dequantize, read_data
from attnconv.viz.maps import compute_attention
from explorer_helpers import shipped_folder

pytestmark = pytest.mark.usefixtures("one_thread")


def read_csv(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def analyze(args: list[str], capsys) -> tuple[int, str, str]:
    code = main(["analyze", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


MODEL = "timm:vit_tiny_patch16_224"  # 12 layers of 3 heads (the figures' cost grows with both)


@pytest.fixture(scope="module")
def vit_analysis(tmp_path_factory):
    """``attnconv analyze timm:vit_tiny_patch16_224 --random`` at 48x48 (3x3 patches), 3 images."""
    out = tmp_path_factory.mktemp("vit_tiny")
    torch.manual_seed(5)
    code = main(
        [
            "analyze",
            MODEL,
            "--random",
            "--image-size",
            "48",
            "--num-images",
            "3",
            "--explore-images",
            "2",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    return out


def test_heads_csv_holds_the_recorded_distances(vit_analysis):
    rows = read_csv(vit_analysis / "heads.csv")
    assert [(int(r["layer"]), int(r["head"])) for r in rows] == [
        (layer, head) for layer in range(12) for head in range(3)
    ]
    # the same model (same seed) and images, recorded here and measured by hand
    torch.manual_seed(5)
    loaded = build_third_party(MODEL, None, image_size=48)
    images, _, _ = load_images(None, 3, (48, 48), 3)
    patches, prefix_mass = patch_attention(record_attention(loaded.model, loaded.normalize(images)))
    for row in rows:
        layer, head = int(row["layer"]), int(row["head"])
        mean = patches[layer][:, head].double().mean(dim=0)  # (N, N) over the 3 images
        distance = float(attention_distance(mean[None], (3, 3))[0])
        assert float(row["attention_distance"]) == pytest.approx(distance, rel=1e-6)
        assert float(row["attention_distance_pixels"]) == pytest.approx(16 * distance, rel=1e-6)
        prefix = float(prefix_mass[layer][:, head].mean())
        assert float(row["prefix_attention"]) == pytest.approx(prefix, rel=1e-5)
    layers = read_csv(vit_analysis / "layers.csv")
    assert len(layers) == 12 and {r["grid_kernel"] for r in layers} == {"1"}  # 3 heads
    for name in ("distance", "maps", "maps_average"):
        assert (vit_analysis / f"{name}.png").stat().st_size > 10_000
    assert not (vit_analysis / "contours.png").exists()  # random weights: every head diffuse


def test_explorer_holds_the_recorded_attention(vit_analysis):
    site = vit_analysis / "explorer"
    manifest = read_data(site / "data.js")
    (info,) = manifest["models"]
    assert info["name"] == MODEL and info["grid"] == [3, 3]
    data = read_data(site / info["file"])
    assert data["heads"] == [3] * 12 and data["stem"] == 16 and data["image_size"] == [48, 48]
    assert [image.get("average") for image in data["images"]] == [None, None, 3]
    assert "class token excluded" in data["meta"]["patches only"]
    torch.manual_seed(5)
    loaded = build_third_party(MODEL, None, image_size=48)
    images, _, _ = load_images(None, 3, (48, 48), 3)
    patches, _ = patch_attention(record_attention(loaded.model, loaded.normalize(images)))
    first = read_data(site / data["images"][0]["file"])
    for layer, entry in enumerate(first["layers"]):
        assert entry["position"] is None
        logits = decode_content(entry["content"])  # what the page's softmax turns back
        shown = np.exp(logits - logits.max(axis=-1, keepdims=True))
        shown /= shown.sum(axis=-1, keepdims=True)
        np.testing.assert_allclose(shown, patches[layer][0].numpy(), atol=2e-4)
    average = read_data(site / data["images"][2]["file"])["average"]
    for layer, payload in enumerate(average):
        expected = patches[layer].double().mean(dim=0).numpy()
        np.testing.assert_allclose(dequantize(payload), expected, atol=1e-4)


def test_convit_summary_and_tables(tmp_path, capsys):
    code, out, _ = analyze(
        [
            "timm:convit_tiny",
            "--random",
            "--image-size",
            "48",
            "--num-images",
            "2",
            "--explore-images",
            "0",
            "--out",
            str(tmp_path),
        ],
        capsys,
    )
    assert code == 0
    # what it is doing, as it goes (no explorer page: --explore-images 0), then the summary
    progress = [
        "analyze: building timm:convit_tiny with random weights",
        "analyze: recording the attention on 2 images (the 2 fashion-mnist test images shipped "
        "with attnconv, scaled to 48x48)",
        f"analyze: drawing the figures and writing the tables into {tmp_path}",
    ]
    assert out.splitlines()[:3] == progress
    lines = out.splitlines()[3:]
    assert lines[0] == (
        "timm:convit_tiny, random weights: 12 layers, 4 heads, 3x3 patches of 16x16 pixels "
        "(48x48 input)"
    )
    assert (
        lines[1] == "images: the 2 fashion-mnist test images shipped with attnconv, scaled to 48x48"
    )
    assert "class token excluded (rows renormalised over the patches)" in lines[2]
    assert "to class/register tokens" in lines[4]
    assert len(lines) == 5 + 12 + 2 and lines[-2] == f"wrote 14 files to {tmp_path}"
    # random weights on 3x3 patches: no head puts half its attention on one patch
    assert lines[-1].startswith("not drawn: contours: no head's attention from query token (1, 1)")
    assert not (tmp_path / "contours.png").exists()
    for figure in ("rollout", "class_token", "class_token_average"):  # it has a class token
        assert (tmp_path / f"{figure}.png").is_file() and (tmp_path / f"{figure}.pdf").is_file()
    rows = read_csv(tmp_path / "heads.csv")
    assert len(rows) == 48
    # GPSA layers (0-9) have no class token; the two MHSA layers give it some attention
    assert {float(r["prefix_attention"]) for r in rows if int(r["layer"]) < 10} == {0.0}
    assert all(float(r["prefix_attention"]) > 0 for r in rows if int(r["layer"]) >= 10)
    assert not (tmp_path / "explorer").exists()


def test_an_attnconv_preset_has_its_head_table(tmp_path, capsys, monkeypatch):
    import attnconv.analysis.analyze as analysis

    before = []  # what was printed when the attention computation started

    def computing(*args, **kwargs):
        before.append(capsys.readouterr().out)
        return compute_attention(*args, **kwargs)

    monkeypatch.setattr(analysis, "compute_attention", computing)
    code, out, _ = analyze(["quick", "--out", str(tmp_path), "--explore-images", "1"], capsys)
    assert code == 0
    assert before == [
        "analyze: building preset quick (random initialisation)\n"
        "analyze: computing the attention (position-only: no images needed)\n"
    ]
    lines = out.splitlines()
    assert lines[:2] == [
        f"analyze: drawing the figures and writing the tables into {tmp_path}",
        f"analyze: writing the explorer page into {tmp_path / 'explorer'}",
    ]
    out = "\n".join(lines[2:])
    assert out.startswith("quick (random initialisation): 2 layers, 9 heads, 8x8 tokens of 1x1")
    assert "images: none needed (position-only attention" in out
    rows = read_csv(tmp_path / "heads.csv")
    assert len(rows) == 18 and {"center_row", "spread", "attention_distance"} <= set(rows[0])
    assert float(rows[0]["attention_distance"]) == float(rows[0]["attention_distance_pixels"])
    assert read_data(tmp_path / "explorer" / "data.js")["models"][0]["kind"] == "position"
    assert (tmp_path / "rollout.png").is_file()  # from the centre token: no class token
    assert not (tmp_path / "class_token.png").exists()


def test_a_content_checkpoint_gets_its_content_diagnostics_against_the_run_start(tmp_path, capsys):
    """A learned-content run's checkpoint (seed 3): content.csv and the summary's table on the
    analysed images, its query and key norms against the model the run started from."""
    from attnconv.analysis.content import content_diagnostics
    from attnconv.models.checkpoint import save_checkpoint
    from attnconv.models.presets import MODELS, preset_arguments
    from viz_helpers import small_model

    model, config = small_model("learned-content")
    architecture, arguments = preset_arguments("learned-content", **config)
    save_checkpoint({"preset": "learned-content", "dataset": "digits", "architecture": architecture,
                     "arguments": arguments, "model": model.state_dict(), "epoch": 2,
                     "config": {"seed": 3}}, tmp_path / "lc.pt")  # fmt: skip
    out = tmp_path / "out"
    code, printed, _ = analyze(
        [str(tmp_path / "lc.pt"), "--out", str(out), "--num-images", "5", "--explore-images", "0"],
        capsys,
    )
    assert code == 0
    assert "analyze: measuring the content attention on 5 images" in printed
    assert "now ÷ at the start (the run's start, rebuilt from its seed 3)" in printed
    torch.manual_seed(3)
    start = MODELS[architecture](**arguments)
    images, _, _ = load_images("digits", 5, (8, 8), 1)  # what analyze measured on
    expected = content_diagnostics(model, images, start=start)
    rows = read_csv(out / "content.csv")
    assert [row["name"] for row in rows] == ["blocks.0.attention", "blocks.1.attention"]
    for row, layer in zip(rows, expected.layers, strict=True):
        assert row["kind"] == "added" and int(row["changed"]) == layer.changed
        assert float(row["query_ratio"]) == pytest.approx(layer.query_ratio)
        assert float(row["key_ratio"]) == pytest.approx(layer.key_ratio)
        assert layer.query_ratio > 1.5  # small_model redrew them N(0, 1): not the start's
        assert float(row["entropy_mean"]) == pytest.approx(sum(layer.entropy) / 3)


def test_a_transformed_checkpoint_gets_the_measures_of_its_transformed_layers(tmp_path, capsys):
    """`attnconv analyze` of a T-CNN checkpoint: per head its start tap, distance moved, gate and
    attention distance on the test images, per layer the means and the tap score, the figures
    that apply, and an explorer page that `explore --add` puts beside a shipped model."""
    import math

    from attnconv.analysis.content import content_diagnostics
    from attnconv.data import load_splits
    from attnconv.models.checkpoint import build_model, save_checkpoint
    from attnconv.viz.transformed import attention_distance, transformed_attention
    from viz_helpers import transformed_checkpoint

    checkpoint = transformed_checkpoint(image_size=(8, 8), dataset="digits")
    save_checkpoint(checkpoint, tmp_path / "tcnn.pt")
    out = tmp_path / "out"
    argv = [str(tmp_path / "tcnn.pt"), "--out", str(out), "--num-images", "3", "--explore-images", "2"]
    code, printed, _ = analyze(argv, capsys)
    assert code == 0
    progress = [line for line in printed.splitlines() if line.startswith("analyze: ")]
    assert progress == [
        f"analyze: loading the checkpoint {tmp_path / 'tcnn.pt'}",
        "analyze: computing the attention on 3 images (the first 3 digits test images), drawing "
        f"the figures and writing the tables into {out}",
        "analyze: measuring the content attention on 3 images",
        f"analyze: writing the explorer page of 2 images into {out / 'explorer'}",
    ]
    printed = printed[printed.index(progress[-1]) + len(progress[-1]) + 1 :]
    assert printed.startswith("tcnn-fashion-small, epoch 3: 8 transformed layers of 9 heads (8x8")
    assert "images: the first 3 digits test images" in printed and "tap score" in printed
    for name in ("contours", "gates", "distance"):
        assert (out / f"{name}.png").is_file() and (out / f"{name}.pdf").is_file()
    test = load_splits("digits", val_size=0).test
    layers = transformed_attention(build_model(checkpoint), test.images[:3].float() / 255)
    heads = read_csv(out / "heads.csv")
    assert len(heads) == 72
    for row in heads:
        layer, head = int(row["layer"]), int(row["head"])
        assert (int(row["tap_row"]), int(row["tap_col"])) == (head // 3 - 1, head % 3 - 1)
        assert float(row["moved"]) == pytest.approx(math.hypot(0.1 * (layer + 1), 0.05 * head))
        assert float(row["gate"]) == pytest.approx(0.1 * head)
        expected = float(attention_distance(layers[layer])[head])
        assert float(row["attention_distance"]) == pytest.approx(expected, rel=1e-6)
    table = read_csv(out / "layers.csv")
    assert [row["name"] for row in table] == [layer.name for layer in layers]
    assert float(table[2]["mean_gate"]) == pytest.approx(0.4)
    assert [row["tap_score"] for row in table[-3:]] == ["nan"] * 3  # 1×1 inputs: no interior
    site = read_data(out / "explorer" / "models" / "0" / "model.js")
    assert site["kind"] == "probabilities" and len(site["layer_grids"]) == 8
    # the content diagnostics on the same 3 images: content.csv, the summary, the explorer
    diagnostics = content_diagnostics(build_model(checkpoint), test.images[:3].float() / 255)
    content = read_csv(out / "content.csv")
    assert [row["name"] for row in content] == [layer.name for layer in layers]
    assert [int(row["keys"]) for row in content] == [16, 4, 4, 4, 4, 1, 1, 1]  # 4x4 ... 1x1
    for row, layer in zip(content, diagnostics.layers, strict=True):
        assert row["kind"] == "gated" and float(row["gate_mean"]) == pytest.approx(0.4)
        assert int(row["changed"]) == layer.changed and row["query_ratio"] == ""  # no start
        finite = [e for e in layer.entropy if math.isfinite(e)]
        expected = f"{min(finite)}" if finite else "nan"  # one key (1x1 input): no entropy
        assert row["entropy_min"] == expected
    assert len(read_csv(out / "content_heads.csv")) == 72
    assert "Content attention on the first 3 digits test images." in printed
    assert [layer["changed"] for layer in site["content"]["layers"]] == [
        layer.changed for layer in diagnostics.layers
    ]
    assert site["content"]["layers"][-1]["entropy"] == [None] * 9
    beside = tmp_path / "site"
    folder = shipped_folder(tmp_path / "weights", ("quadratic-fashion",))
    args = ["--pretrained", "all", "--weights-dir", str(folder), "--add", str(out)]
    assert main(["explore", *args, "--out", str(beside)]) == 0
    manifest = read_data(beside / "data.js")
    assert [(m["name"], m["kind"]) for m in manifest["models"]] == [
        ("quadratic-fashion", "position"), ("tcnn-fashion-small, epoch 3", "probabilities")
    ]  # fmt: skip
    code, _, err = analyze([*argv, "--window", "2", "--overwrite"], capsys)
    assert code == 2 and "--window zooms the maps" in err and err.count("\n") == 1


def test_explore_puts_an_analysis_beside_the_shipped_models(vit_analysis, tmp_path):
    folder = shipped_folder(tmp_path / "weights", ("learned-fashion",))
    site = tmp_path / "site"
    args = ["--pretrained", "all", "--weights-dir", str(folder), "--add", str(vit_analysis)]
    assert main(["explore", *args, "--out", str(site)]) == 0
    manifest = read_data(site / "data.js")
    assert [m["name"] for m in manifest["models"]] == ["learned-fashion", MODEL]
    added = read_data(site / manifest["models"][1]["file"])
    assert [image["file"] for image in added["images"]] == [
        "models/1/image_000.js",
        "models/1/image_001.js",
        "models/1/average.js",
    ]
    for name in ("image_001.js", "average.js"):
        original = read_data(vit_analysis / "explorer" / "models" / "0" / name)
        assert read_data(site / "models" / "1" / name) == original
    # the analysis's own site alone, without shipped models
    alone = tmp_path / "alone"
    assert main(["explore", "--add", str(vit_analysis / "explorer"), "--out", str(alone)]) == 0
    assert [m["name"] for m in read_data(alone / "data.js")["models"]] == [MODEL]


def test_explore_refuses_options_the_added_models_do_not_use(vit_analysis, tmp_path, capsys):
    code = main(["explore", "--add", str(vit_analysis), "--images", "2", "--out", str(tmp_path)])
    assert code == 2
    assert "--images: for a checkpoint or --pretrained" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["timm:convit_tiny"],
            "timm:convit_tiny: give --pretrained, --weights FILE or --random (one of them)",
        ),
        (
            ["timm:convit_tiny", "--random", "--weights", __file__],  # an existing file
            "give --pretrained, --weights FILE or --random",
        ),
        (["timm:convit_tiny", "--random", "--pretrained"], "give --pretrained, --weights FILE"),
        (["quick", "--pretrained"], "--pretrained without a NAME is for timm:NAME and torchvision"),
        (["timm:convit_tiny", "--pretrained", "vit-fashion"], "give MODEL or --pretrained NAME"),
        (["quick", "--random"], "--random is for timm:NAME and torchvision:NAME models"),
        (["quick", "--image-size", "8"], "--image-size is for timm:NAME"),
        (["no-such-thing"], "MODEL 'no-such-thing' is not timm:NAME, torchvision:NAME, a preset"),
        (["quick", "--pretrained", "quadratic-fashion"], "give MODEL or --pretrained NAME"),
        (["resnet-fashion"], "resnet-fashion (random initialisation) is a ResNet"),
        (["quick", "--num-images", "0"], "--num-images: expected an integer in [1, 100000]"),
        (["quick", "--images", "digits"], "attention is position-only, the same for every image"),
        (["timm:convit_tiny", "--random", "--data-dir", "d"], "--data-dir is for --images DATASET"),
        (["timm:convit_tiny", "--weights", "missing.safetensors"], "does not exist"),
    ],
)
def test_errors_are_one_line(tmp_path, capsys, args, message):
    code, _, err = analyze([*args, "--out", str(tmp_path / "out")], capsys)
    assert code == 2
    assert err.count("\n") == 1 and message in err


@pytest.mark.needs_chromium
def test_the_page_shows_the_recorded_attention(vit_analysis):
    """The explorer page itself (headless Chromium, its JavaScript unchanged) turns the recorded
    log-probabilities back into the recorded attention, per image and averaged."""
    from playwright.sync_api import sync_playwright

    torch.manual_seed(5)
    loaded = build_third_party(MODEL, None, image_size=48)
    images, _, _ = load_images(None, 3, (48, 48), 3)
    patches, _ = patch_attention(record_attention(loaded.model, loaded.normalize(images)))
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"]
        )
        page = browser.new_page()
        errors = []
        page.on("pageerror", lambda err: errors.append(str(err)))
        page.goto((vit_analysis / "explorer" / "index.html").as_uri())
        page.wait_for_function("window.attnconv && window.attnconv.ready", timeout=60_000)
        for image, expected in ((1, patches), (2, None)):  # image 1, then the average
            page.evaluate(f"window.attnconv.setImage({image})")
            page.evaluate("window.attnconv.setQuery(0, 2)")
            page.wait_for_function(
                f"window.attnconv.ready && window.attnconv.state.image == {image}"
                " && window.attnconv.state.query.join() == '0,2'"
            )
            shown = page.evaluate("window.attnconv.maps.map(r => r.map(m => Array.from(m)))")
            for layer, probs in enumerate(patches):
                truth = probs[image] if expected is not None else probs.double().mean(dim=0)
                np.testing.assert_allclose(shown[layer], truth[:, 2].numpy(), atol=2e-4)
        browser.close()
    assert errors == []
