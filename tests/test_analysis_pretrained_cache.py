"""``attnconv analyze timm:NAME --pretrained`` and ``torchvision:NAME --pretrained``: the libraries'
own loading, offline, from caches this module fills with random weights in the libraries' own
layout (the Hugging Face hub cache under ``HF_HOME``, torch's hub checkpoints under ``TORCH_HOME``),
and one line when neither the cache nor the network has the weights."""

from __future__ import annotations

import csv
import hashlib
import os
import subprocess
import sys
import urllib.error
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from attnconv.analysis.images import load_images
from attnconv.analysis.measures import measure_patch_attention
from attnconv.analysis.third_party import build_third_party, import_timm, import_torchvision
from attnconv.errors import UserError
from attnconv.viz.distance import layer_distances

pytestmark = pytest.mark.usefixtures("one_thread")

TIMM = "vit_tiny_patch16_224"
HUB_ID = "timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k"  # the hub copy timm loads for TIMM
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def fill_hub_cache(hf_home: Path, repo: str, filename: str, source: Path) -> Path:
    """``source`` as ``huggingface_hub`` keeps a downloaded file: a blob named by its SHA-256, a
    snapshot of commit ``COMMIT`` linking to it, and ``refs/main`` naming that commit."""
    folder = hf_home / "hub" / f"models--{repo.replace('/', '--')}"
    data = source.read_bytes()
    blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
    blob.parent.mkdir(parents=True)
    blob.write_bytes(data)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(COMMIT)
    snapshot = folder / "snapshots" / COMMIT / filename
    snapshot.parent.mkdir(parents=True)
    snapshot.symlink_to(os.path.relpath(blob, snapshot.parent))
    return snapshot


def offline_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TORCH_HOME"))}
    env.update(
        HF_HUB_OFFLINE="1",
        HF_HOME=str(tmp_path / "hf"),
        TORCH_HOME=str(tmp_path / "torch"),
        OMP_NUM_THREADS="1",
    )
    return env


def run_analyze(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """``attnconv analyze ARGS`` in a new interpreter (the hub reads ``HF_*`` when imported)."""
    return subprocess.run(
        [sys.executable, "-m", "attnconv", "analyze", *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=300,
    )


def test_timm_pretrained_reads_the_hub_cache_offline(tmp_path):
    torch.manual_seed(11)
    source = import_timm().create_model(TIMM, pretrained=False)  # 224x224: the hub copy's size
    weights = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, weights)
    fill_hub_cache(tmp_path / "hf", HUB_ID, "model.safetensors", weights)
    out = tmp_path / "out"
    args = [f"timm:{TIMM}", "--pretrained", "--image-size", "32", "--num-images", "2"]
    result = run_analyze([*args, "--explore-images", "0", "--out", str(out)], offline_env(tmp_path))
    assert result.returncode == 0, result.stderr
    assert f"timm:{TIMM}, pretrained {HUB_ID}: 12 layers, 3 heads" in result.stdout
    # the cached weights, resampled to 2x2 patches by timm as for a local file: same attention
    expected = build_third_party(f"timm:{TIMM}", weights, image_size=32)
    pixels, labels, _ = load_images(None, 2, (32, 32), 3)
    average = measure_patch_attention(expected.model, expected.normalize(pixels), labels).average
    with open(out / "layers.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    distances = [float(d.mean()) for d in layer_distances(average)]
    assert [float(r["attention_distance"]) for r in rows] == pytest.approx(distances, abs=1e-6)
    random = build_third_party(f"timm:{TIMM}", None, image_size=32)  # not what was read
    other = measure_patch_attention(random.model, random.normalize(pixels), labels).average
    assert [float(d.mean()) for d in layer_distances(other)] != pytest.approx(distances, abs=1e-6)


def test_timm_pretrained_neither_cached_nor_downloadable_is_one_line(tmp_path):
    result = run_analyze(
        [f"timm:{TIMM}", "--pretrained", "--out", str(tmp_path / "out")], offline_env(tmp_path)
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr == (
        f"attnconv analyze: error: timm:{TIMM}: its pretrained weights (Hugging Face hub {HUB_ID}) "
        f"are not in the cache {tmp_path / 'hf' / 'hub'} and could not be downloaded "
        "(HF_HUB_OFFLINE is set); fetch them on a machine that can, or give --weights FILE\n"
    )


def test_timm_pretrained_with_the_hub_unreachable_is_one_line_at_once(tmp_path):
    """Not offline, not cached, and the hub's address refuses connections (a closed local port):
    one request finds it, and one line names the address and HF_HUB_OFFLINE=1, without the hub
    client's retries (each would print a line to stderr)."""
    env = {k: v for k, v in offline_env(tmp_path).items() if k != "HF_HUB_OFFLINE"}
    env["HF_ENDPOINT"] = endpoint = "http://127.0.0.1:9"  # the discard port: nothing listens
    result = run_analyze([f"timm:{TIMM}", "--pretrained", "--out", str(tmp_path / "out")], env)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(
        f"attnconv analyze: error: timm:{TIMM}: its pretrained weights (Hugging Face hub {HUB_ID}) "
        f"are not in the cache {tmp_path / 'hf' / 'hub'} and could not be downloaded ({endpoint} "
        "cannot be reached: "
    )
    assert result.stderr.endswith(
        "; fetch them on a machine that can, or give --weights FILE (offline, HF_HUB_OFFLINE=1 "
        "reads the cache without trying the hub)\n"
    )
    assert not (tmp_path / "out").exists()


@pytest.fixture
def no_network(monkeypatch):
    """torch.hub's download fails as it does without a network (and is counted)."""
    calls = []

    def fail(url, *args, **kwargs):
        calls.append(url)
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(torch.hub, "download_url_to_file", fail)
    return calls


def test_torchvision_pretrained_reads_torch_home(tmp_path, monkeypatch, no_network):
    torchvision = import_torchvision()
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    torch.manual_seed(12)
    source = torchvision.models.vit_b_32().eval()
    checkpoints = tmp_path / "torch" / "hub" / "checkpoints"
    checkpoints.mkdir(parents=True)
    torch.save(source.state_dict(), checkpoints / "vit_b_32-d86f8d99.pth")  # the DEFAULT's file
    loaded = build_third_party("torchvision:vit_b_32", None, pretrained=True)
    assert no_network == []
    assert loaded.weights == "pretrained ViT_B_32_Weights.IMAGENET1K_V1"
    assert loaded.image_size == (224, 224)
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(x), source(x), rtol=0, atol=0)
    # another input size: torchvision's own interpolate_embeddings resamples the 7x7 table to 2x2
    small = build_third_party("torchvision:vit_b_32", None, image_size=64, pretrained=True)
    table = source.encoder.pos_embedding.detach()  # (1, 1 + 49, 768)
    assert small.model.encoder.pos_embedding.shape == (1, 5, 768)
    torch.testing.assert_close(small.model.encoder.pos_embedding[:, 0], table[:, 0])
    grid = table[0, 1:].reshape(7, 7, 768).permute(2, 0, 1)[None]
    resized = torch.nn.functional.interpolate(grid, size=(2, 2), mode="bicubic", align_corners=True)
    torch.testing.assert_close(
        small.model.encoder.pos_embedding[0, 1:], resized[0].permute(1, 2, 0).reshape(4, 768)
    )


def test_torchvision_pretrained_neither_cached_nor_downloadable_is_one_line(
    tmp_path, monkeypatch, no_network
):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    with pytest.raises(UserError) as info:
        build_third_party("torchvision:vit_b_32", None, pretrained=True)
    assert no_network == ["https://download.pytorch.org/models/vit_b_32-d86f8d99.pth"]
    assert str(info.value) == (
        "torchvision:vit_b_32: its pretrained weights (ViT_B_32_Weights.IMAGENET1K_V1) are not in "
        f"the cache {tmp_path / 'torch' / 'hub' / 'checkpoints'} and could not be downloaded "
        "(<urlopen error [Errno -3] Temporary failure in name resolution>); fetch them on a "
        "machine that can, or give --weights FILE"
    )


def test_a_damaged_torch_home_checkpoint_is_one_line(tmp_path, monkeypatch, no_network):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    checkpoints = tmp_path / "torch" / "hub" / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / "vit_b_32-d86f8d99.pth").write_bytes(b"half a download")
    with pytest.raises(UserError) as info:
        build_third_party("torchvision:vit_b_32", None, pretrained=True)
    message = str(info.value)
    assert message.startswith(
        f"torchvision:vit_b_32: the cached weights {checkpoints / 'vit_b_32-d86f8d99.pth'} are "
        "not a state dict torch can load ("
    )
    assert message.endswith("delete the file to download it again") and "\n" not in message


def test_an_unknown_timm_tag_is_one_line():
    with pytest.raises(UserError) as info:
        build_third_party(f"timm:{TIMM}.nope", None, pretrained=True)
    assert str(info.value) == (
        f"timm:{TIMM}.nope: Invalid pretrained tag (nope) for {TIMM}. "
        f"(timm.list_pretrained('{TIMM}*') names the tags)"
    )
