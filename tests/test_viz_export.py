"""Explorer export: decoded data equals the model's attention; the multi-model site of the shipped
models (``attnconv explore --pretrained``); site size; serving on 127.0.0.1."""

import base64
import json
import re
import subprocess
import sys
import threading
import urllib.request

import numpy as np
import pytest
import torch

from attnconv.cli import main
from attnconv.models import PRESETS, create_model
from attnconv.models.pretrained import load_pretrained, sample_images
from attnconv.viz.export import (
    decode_content,
    dequantize,
    explorer_data,
    make_server,
    model_score_terms,
    quantize,
    read_data,
    read_site,
    site_size,
    write_explorer,
    write_site,
)
from attnconv.viz.maps import compute_attention
from attnconv.viz.site_check import SiteError
from explorer_helpers import (
    ACCURACY,
    RECORDED_IMAGES,
    RECORDED_SHOWN,
    SAMPLES,
    recorded_model,
    shipped_folder,
)
from viz_helpers import save_checkpoint, small_model

MB = 1_000_000


def f32(text):
    return np.frombuffer(base64.b64decode(text), "<f4").astype(np.float64)


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_quantize_is_exact_to_half_a_step():
    values = (
        torch.randn(3, 5, 40, dtype=torch.float64) * torch.tensor([1.0, 30.0, 1e-3])[:, None, None]
    )
    values[0, 0] = 7.0  # a constant row
    payload = quantize(values)
    decoded = dequantize(payload)
    step = (values.amax(-1) - values.amin(-1)).numpy()[..., None] / 65535
    assert np.all(
        np.abs(decoded - values.numpy()) <= step / 2 * 1.001 + 1e-6 * np.abs(values.numpy())
    )
    np.testing.assert_allclose(decoded[0, 0], 7.0, rtol=1e-7)


@pytest.mark.parametrize("preset", ["quadratic", "learned", "quadratic-generalized"])
def test_position_only_export_reproduces_the_probabilities(preset):
    model, _ = small_model(preset, image_size=(8, 12), stem=2)
    data, files = explorer_data(model, (8, 12))
    assert data["kind"] == "position" and files == [] and data["images"] == []
    assert data["grid"] == [4, 6] and data["heads"] == [3, 3]
    for layer, payload in zip(model.attention_layers(), data["layers"], strict=True):
        probs = layer.attention_probs(4, 6).detach().double().numpy()
        if payload["type"] == "product":  # separable: exact float32 factors
            row = f32(payload["row"]).reshape(3, 4, 4)
            col = f32(payload["col"]).reshape(3, 6, 6)
            rebuilt = np.einsum("hab,hcd->hacbd", row, col).reshape(3, 24, 24)
            np.testing.assert_allclose(rebuilt, probs, atol=1e-7)
        else:
            assert preset == "quadratic-generalized"
            np.testing.assert_allclose(dequantize(payload), probs, atol=probs.max() / 65535)


def content_model(**overrides):
    return small_model("learned-content", **overrides)[0]


@pytest.mark.parametrize("head_dim", [8, 32])
def test_content_export_terms_sum_to_the_models_attention(head_dim):
    """Narrow heads store the content logits as float32 q/√d and k, wide ones quantised."""
    model = content_model(head_dim=head_dim)
    images = torch.rand(2, 1, 8, 8, generator=torch.Generator().manual_seed(3))
    data, files = explorer_data(model, (8, 8), images, labels=["a", "b"])
    assert data["kind"] == "content" and len(files) == 2
    assert [image["file"] for image in data["images"]] == ["image_000.js", "image_001.js"]
    assert data["terms"] == {"content": True, "position": True}
    with torch.no_grad():
        _, probs = model(images, return_attention=True)
    for index, payload in enumerate(files):
        pixels = np.frombuffer(base64.b64decode(data["images"][index]["pixels"]), "|u1")
        np.testing.assert_array_equal(pixels, (images[index, 0] * 255).round().flatten().numpy())
        for layer, entry in enumerate(payload["layers"]):
            assert entry["content"]["type"] == ("factors" if head_dim == 8 else "quantized")
            content = decode_content(entry["content"])  # (heads, N, N)
            parts = dequantize(entry["position"])  # (heads, N, h + w)
            assert entry["position"]["split"] == 8
            position = (parts[..., :8, None] + parts[..., None, 8:]).reshape(3, 64, 64)
            # logit error per query row: ≤ step/2 of the content codes (float32 rounding for
            # factors) + 2 × step/2 of the parts; a softmax changes by a factor within exp(±2·error)
            content_error = (
                f32(entry["content"]["step"]) / 2 if head_dim == 32 else 1e-5 * np.ones(3 * 64)
            )
            error = (content_error + f32(entry["position"]["step"])).reshape(3, 64, 1)
            expected = probs[layer][index].double().numpy()
            difference = np.abs(softmax(content + position) - expected)
            assert np.all(difference <= expected * (np.exp(2 * error) - 1) * 1.01 + 1e-6)


def test_content_and_position_terms_are_each_the_right_part():
    """Silencing one kind of score in the model leaves exactly the other exported term."""
    images = torch.rand(1, 1, 8, 8, generator=torch.Generator().manual_seed(4))
    no_content = content_model()
    with torch.no_grad():
        for layer in no_content.attention_layers():
            layer.key.weight.zero_()
            layer.key.bias.zero_()
    no_position = content_model()
    with torch.no_grad():
        for layer in no_position.attention_layers():
            layer.position.row_embedding.zero_()
            layer.position.col_embedding.zero_()
    for model, kept, silenced in (
        (no_content, "position", "content"),
        (no_position, "content", "position"),
    ):
        with torch.no_grad():
            _, probs = model(images, return_attention=True)
        terms = model_score_terms(model, images)
        for term, p in zip(terms, probs, strict=True):
            if kept == "content":
                logits, other = term.content, term.position_row
            else:
                logits = (
                    term.position_row[..., :, None] + term.position_col[..., None, :]
                ).flatten(-2)
                other = term.content
            assert other.abs().max() == 0, silenced
            torch.testing.assert_close(logits.softmax(-1), p, atol=1e-5, rtol=1e-4)


def test_content_export_needs_images():
    with pytest.raises(ValueError, match="needs test images"):
        explorer_data(content_model(), (8, 8))
    with pytest.raises(ValueError, match="2 labels for 1 images"):
        explorer_data(content_model(), (8, 8), torch.rand(1, 1, 8, 8), labels=["a", "b"])


def test_average_entry_is_the_mean_of_the_probabilities():
    model = content_model()
    images = torch.rand(5, 1, 8, 8, generator=torch.Generator().manual_seed(8))
    data, files = explorer_data(model, (8, 8), images[:2], average_images=images)
    assert [image["label"] for image in data["images"]] == [
        "image 0",
        "image 1",
        "average over 5 test images",
    ]
    assert data["images"][2]["file"] == "average.js" and data["images"][2]["average"] == 5
    mean_pixels = np.frombuffer(base64.b64decode(data["images"][2]["pixels"]), "|u1")
    np.testing.assert_array_equal(mean_pixels, (images.mean(0)[0] * 255).round().flatten())
    with torch.no_grad():
        _, probs = model(images, return_attention=True)
    for layer, payload in enumerate(files[2]["average"]):
        expected = probs[layer].double().mean(0).numpy()
        np.testing.assert_allclose(dequantize(payload), expected, atol=expected.max() / 65535)
        assert np.abs(expected - probs[layer][0].double().numpy()).max() > 0.01


def test_position_only_model_shows_images_without_files():
    images = torch.rand(2, 1, 8, 8)
    data, files = explorer_data(small_model("quadratic")[0], (8, 8), images, labels=["a", "b"])
    assert files == [] and [image["label"] for image in data["images"]] == ["a", "b"]
    assert all("file" not in image for image in data["images"])


def test_full_size_quadratic_site_is_under_20_mb(tmp_path):
    model = create_model("quadratic")
    files = write_site(model, tmp_path / "site", (32, 32))
    size = site_size(tmp_path / "site")
    assert size == sum(path.stat().st_size for path in files)
    assert size < 20 * MB
    data = read_data(tmp_path / "site" / "models" / "0" / "model.js")
    assert data["grid"] == [16, 16] and data["heads"] == [9] * 6
    # every layer is exported as exact row and column factors: 6 × 9 × (16² + 16²) float32
    assert all(layer["type"] == "product" for layer in data["layers"])
    assert (
        sum(
            len(base64.b64decode(l["row"])) + len(base64.b64decode(l["col"]))
            for l in data["layers"]
        )
        == 6 * 9 * 2 * 256 * 4
    )


def test_full_size_generalized_site_is_under_20_mb(tmp_path):
    write_site(create_model("quadratic-generalized"), tmp_path, (32, 32))
    # dense: 6 layers × 9 heads × 256² uint16 codes, base64: about 9.4 MB
    assert 9 * MB < site_size(tmp_path) < 20 * MB


def test_site_files_are_self_contained(tmp_path):
    model = content_model()
    write_site(model, tmp_path, (8, 8), torch.rand(2, 1, 8, 8), name="x", meta={"epoch": 1})
    names = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert names == [
        "app.js",
        "data.js",
        "index.html",
        "models/0/image_000.js",
        "models/0/image_001.js",
        "models/0/model.js",
        "style.css",
    ]
    html = (tmp_path / "index.html").read_text()
    # everything the page loads is local; its only links (not loaded) point to the paper
    loaded = re.findall(r'<(?:script|link)\b[^>]*\b(?:src|href)="([^"]+)"', html)
    assert loaded == ["style.css", "data.js", "app.js"]
    links = re.findall(r'<a\b[^>]*\bhref="([^"]+)"', html)
    assert links and all(link.startswith("https://arxiv.org/") for link in links)
    assert len(re.findall(r"https?://", html)) == len(links)
    for path in tmp_path.rglob("*"):
        if path.is_file() and path.name != "index.html":
            assert "http://" not in path.read_text() and "https://" not in path.read_text()
    image = (tmp_path / "models" / "0" / "image_001.js").read_text()
    assert image.startswith('window.ATTNCONV_FILES["models/0/image_001.js"] = {"layers":')
    manifest = read_data(tmp_path / "data.js")
    assert manifest["title"] == "attnconv explorer: x" and manifest["skipped"] == []
    assert [(m["name"], m["kind"], m["file"]) for m in manifest["models"]] == [
        ("x", "content", "models/0/model.js")
    ]


def test_server_serves_the_site_on_localhost(tmp_path):
    write_site(small_model("quadratic")[0], tmp_path, (8, 8))
    server = make_server(tmp_path, port=0)
    host, port = server.server_address[:2]
    assert host == "127.0.0.1"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        for name in ("index.html", "data.js"):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/{name}", timeout=10) as reply:
                assert reply.read() == (tmp_path / name).read_bytes()
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(FileNotFoundError, match="not an explorer site"):
        make_server(tmp_path / "models")


def test_explore_cli_writes_and_serves(tmp_path):
    model, config = small_model("quadratic")
    path = save_checkpoint(tmp_path / "m.pt", model, "quadratic", config, epoch=7)
    site = tmp_path / "site"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "attnconv",
            "explore",
            str(path),
            "--out",
            str(site),
            "--serve",
            "--port",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = []
        while not lines or not lines[-1].startswith("serving on"):
            line = process.stdout.readline()
            assert line, process.stderr.read()
            lines.append(line)
        url = re.search(r"http://127\.0\.0\.1:\d+/", lines[-1]).group(0)
        with urllib.request.urlopen(url + "data.js", timeout=10) as reply:
            served = reply.read()
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert served == (site / "data.js").read_bytes()
    (model,) = read_data(site / "data.js")["models"]
    assert model["name"] == "quadratic" and model["dataset"] == "digits"
    assert model["description"] == PRESETS["quadratic"].description
    assert model["test_accuracy"] is None
    assert read_data(site / "models" / "0" / "model.js")["meta"] == {
        "epoch": 7,
        "checkpoint": "m.pt",
    }
    assert "MB" in lines[0]


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    return shipped_folder(tmp_path_factory.mktemp("weights"))


def test_explore_pretrained_all_is_one_site_of_every_model_with_attention(
    shipped, tmp_path, capsys
):
    site = tmp_path / "site"
    argv = ["explore", "--pretrained", "all", "--weights-dir", str(shipped), "--out", str(site)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "left out resnet-fashion: a ResNet: no attention layers" in out
    manifest = read_data(site / "data.js")
    assert manifest["skipped"] == [
        {"name": "resnet-fashion", "reason": "a ResNet: no attention layers"}
    ]
    models = manifest["models"]
    assert [(m["name"], m["kind"], m["test_accuracy"]) for m in models] == [
        ("quadratic-fashion", "position", ACCURACY["quadratic-fashion"]),
        ("learned-fashion", "position", ACCURACY["learned-fashion"]),
        ("learned-content-fashion", "content", ACCURACY["learned-content-fashion"]),
    ]
    assert all(m["grid"] == [14, 14] and m["heads"] == [9] * 4 for m in models)
    assert models[2]["description"] == PRESETS["learned-content-fashion"].description
    images, captions = sample_images("fashion-mnist", shipped)
    content = read_data(site / models[2]["file"])
    assert [image["label"] for image in content["images"]] == [
        *captions[:4],
        f"average over {SAMPLES} test images",
    ]
    model = load_pretrained("learned-content-fashion", shipped)
    average = read_data(site / content["images"][4]["file"])["average"]
    expected = compute_attention(model, (28, 28), images).probs
    for payload, probs in zip(average, expected, strict=True):
        np.testing.assert_allclose(dequantize(payload), probs.double(), atol=1e-5)
    position = read_data(site / models[0]["file"])
    assert len(position["images"]) == 4 and all("file" not in i for i in position["images"])
    # the three Fashion-MNIST models with 4 images each and the average: about 11 MB
    assert 8 * MB < site_size(site) < 14 * MB
    assert "MB" in out


def test_explore_pretrained_one_model_and_errors(shipped, tmp_path, capsys):
    site = tmp_path / "one"
    argv = ["explore", "--weights-dir", str(shipped), "--out", str(site)]
    assert main([*argv, "--pretrained", "quadratic-fashion"]) == 0
    manifest = read_data(site / "data.js")
    assert [m["name"] for m in manifest["models"]] == ["quadratic-fashion"]
    capsys.readouterr()
    assert main([*argv, "--pretrained", "resnet-fashion", "--overwrite"]) == 2
    assert "no attention layers; nothing to explore" in capsys.readouterr().err
    assert main([*argv, "--pretrained", "nonesuch", "--overwrite"]) == 2
    assert "no pretrained weights for 'nonesuch'" in capsys.readouterr().err
    assert main([*argv, "--overwrite"]) == 2
    assert "give a checkpoint or --pretrained" in capsys.readouterr().err


def test_a_transformed_network_exports_each_layers_probabilities_on_its_own_grids():
    """Kind "probabilities": per layer its module name, query (output) and key (input) grids and
    the input pixel each query sits on; per image the probabilities of every transformed layer
    (quantised: within a step of TransformedConv2d.attention), and their average."""
    from attnconv.models.checkpoint import build_model
    from attnconv.viz.transformed import transformed_attention
    from viz_helpers import transformed_checkpoint

    model = build_model(transformed_checkpoint()).eval()
    images = torch.rand(3, 1, 16, 16, generator=torch.Generator().manual_seed(2))
    data, files = explorer_data(model, (16, 16), images[:2], ["a", "b"], {"epoch": 3}, images)
    assert (data["kind"], data["grid"], data["stem"], data["heads"]) == (
        "probabilities", [16, 16], 1, [9] * 8
    )  # fmt: skip
    assert [g["name"] for g in data["layer_grids"]] == list(model.transformed_layers())
    assert [(g["key"], g["query"]) for g in data["layer_grids"]] == (
        [([8, 8], [4, 4])] + [([4, 4], [4, 4])] * 3 + [([4, 4], [2, 2])] + [([2, 2], [2, 2])] * 3
    )
    assert data["layer_grids"][0]["rows"] == [0, 2, 4, 6]  # stride 2: on even input pixels
    assert data["layer_grids"][1]["cols"] == [0, 1, 2, 3]
    assert data["meta"]["epoch"] == 3
    assert data["meta"]["mean content gate per layer"] == ", ".join(["0.40"] * 8)
    assert [image.get("file") for image in data["images"]] == [
        "image_000.js", "image_001.js", "average.js"
    ]  # fmt: skip
    assert data["images"][2]["average"] == 3
    for index in range(2):
        expected = transformed_attention(model, images[index : index + 1])
        for payload, layer in zip(files[index]["probs"], expected, strict=True):
            np.testing.assert_allclose(dequantize(payload), layer.probs.numpy(), atol=2e-5)
    average = transformed_attention(model, images)
    for payload, layer in zip(files[2]["average"], average, strict=True):
        np.testing.assert_allclose(dequantize(payload), layer.probs.numpy(), atol=2e-5)
    with pytest.raises(ValueError, match="a transformed network needs test images"):
        explorer_data(model, (16, 16))


def test_a_recorded_vits_rollout_and_class_token_views_equal_a_direct_computation(tmp_path):
    """The views of a tiny timm ViT's page, written and read back: each shown image's and the
    average's rollout is the direct product through the layers of the head-averaged attention
    with the residual added, rows normalised (averaged over all the images for the average),
    each row over the patches renormalised, the class token's first; the class token's view is its
    row of each head's attention at the patches."""
    from test_analysis_rollout import direct_attention, direct_rollout

    entry, model, images = recorded_model()
    probs = direct_attention(model, images)  # per layer (B, heads, 17, 17): the class token first
    rollouts = [direct_rollout(probs, image) for image in range(RECORDED_IMAGES)]
    expected = [*rollouts[:RECORDED_SHOWN], np.mean(rollouts, axis=0)]
    classes = [[p[image, :, 0, 1:] for p in probs] for image in range(RECORDED_SHOWN)]
    classes.append([p[:, :, 0, 1:].mean(axis=0) for p in probs])
    write_explorer([entry], tmp_path)
    (read,) = read_site(tmp_path)
    assert read.data["class_token"] is True and read.data["logit"] == "log-probability"
    assert len(read.files) == len(expected)
    for payload, rollout, class_rows in zip(read.files, expected, classes, strict=True):
        rows = rollout[:, 1:] / rollout[:, 1:].sum(axis=1, keepdims=True)  # (1 + 16, 16)
        np.testing.assert_allclose(dequantize(payload["views"]["rollout"]), rows, atol=2e-5)
        for layer, row in enumerate(class_rows):
            np.testing.assert_allclose(dequantize(payload["views"]["class"][layer]), row, atol=2e-5)
    # a file without its views is refused when read back, naming it
    path = tmp_path / "models" / "0" / "image_001.js"
    payload = read_data(path)
    del payload["views"]
    path.write_text(f"window.ATTNCONV_FILES[0] = {json.dumps(payload)};\n")
    with pytest.raises(SiteError, match=r"image_001\.js: the file lacks 'views'"):
        read_site(tmp_path)


def test_a_recorded_vit_without_a_class_token_has_no_views():
    entry, _, _ = recorded_model(class_token=False)
    assert "class_token" not in entry.data and entry.data["logit"] == "log-probability"
    assert all("views" not in payload for payload in entry.files)
