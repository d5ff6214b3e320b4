"""Explorer export: decoded data equals the model's attention; site size; serving on 127.0.0.1."""

import base64
import json
import re
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch

from attnconv.models import create_model
from attnconv.viz.export import (
    dequantize,
    explorer_data,
    make_server,
    model_score_terms,
    quantize,
    site_size,
    write_site,
)
from viz_helpers import save_checkpoint, small_model

MB = 1_000_000


def f32(text):
    return np.frombuffer(base64.b64decode(text), "<f4").astype(np.float64)


def read_global(path: Path) -> dict:
    """The JSON object a data file assigns to its global."""
    text = path.read_text()
    return json.loads(text[text.index("= ") + 2 : text.rindex(";")])


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


def test_content_export_terms_sum_to_the_models_attention():
    model = content_model()
    images = torch.rand(2, 1, 8, 8, generator=torch.Generator().manual_seed(3))
    data, files = explorer_data(model, (8, 8), images, labels=["a", "b"])
    assert data["kind"] == "content" and len(files) == 2
    assert data["terms"] == {"content": True, "position": True}
    with torch.no_grad():
        _, probs = model(images, return_attention=True)
    for index, payload in enumerate(files):
        pixels = np.frombuffer(base64.b64decode(data["images"][index]["pixels"]), "|u1")
        np.testing.assert_array_equal(pixels, (images[index, 0] * 255).round().flatten().numpy())
        for layer, entry in enumerate(payload["layers"]):
            content = dequantize(entry["content"])  # (heads, N, N)
            parts = dequantize(entry["position"])  # (heads, N, h + w)
            assert entry["position"]["split"] == 8
            position = (parts[..., :8, None] + parts[..., None, 8:]).reshape(3, 64, 64)
            # logit error per query row: ≤ step/2 of the content codes + 2 × step/2 of the parts;
            # a softmax changes by a factor within exp(±2·error)
            error = (f32(entry["content"]["step"]) / 2 + f32(entry["position"]["step"])).reshape(
                3, 64, 1
            )
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
            layer.row_embedding.zero_()
            layer.col_embedding.zero_()
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


def test_full_size_quadratic_site_is_under_20_mb(tmp_path):
    model = create_model("quadratic")
    files = write_site(model, tmp_path / "site", (32, 32))
    size = site_size(tmp_path / "site")
    assert size == sum(path.stat().st_size for path in files)
    assert size < 20 * MB
    data = read_global(tmp_path / "site" / "data.js")
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
    write_site(model, tmp_path, (8, 8), torch.rand(2, 1, 8, 8), title="T", meta={"preset": "x"})
    names = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert names == [
        "app.js",
        "data.js",
        "images/image_000.js",
        "images/image_001.js",
        "index.html",
        "style.css",
    ]
    html = (tmp_path / "index.html").read_text()
    assert re.findall(r'(?:src|href)="([^"]+)"', html) == ["style.css", "data.js", "app.js"]
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert "http://" not in path.read_text() and "https://" not in path.read_text()
    image = (tmp_path / "images" / "image_001.js").read_text()
    assert image.startswith("(window.ATTNCONV_IMAGES = window.ATTNCONV_IMAGES || {})[1] = ")


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
        make_server(tmp_path / "images")


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
    data = read_global(site / "data.js")
    assert data["meta"] == {
        "preset": "quadratic",
        "dataset": "digits",
        "epoch": 7,
        "checkpoint": "m.pt",
    }
    assert "MB" in lines[0]
