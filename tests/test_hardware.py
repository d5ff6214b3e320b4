"""The precision ``auto`` picks, with the hardware query replaced: Zen 3 (AVX2 only), Zen 4/5
(AVX512-BF16), Sapphire Rapids (AMX), and CUDA devices with and without native bfloat16."""

import pytest
import torch

from attnconv import hardware

ZEN3 = {"avx2": True, "avx512_f": False, "avx512_bf16": False, "amx_bf16": False}
ZEN5 = {"avx2": True, "avx512_f": True, "avx512_bf16": True, "amx_bf16": False}
SAPPHIRE_RAPIDS = {"avx2": True, "avx512_f": True, "avx512_bf16": False, "amx_bf16": True}
CPU = torch.device("cpu")


def fake_cpu(monkeypatch, features: dict[str, bool]) -> None:
    monkeypatch.setattr(hardware, "cpu_features", lambda: dict(features))


@pytest.mark.parametrize(
    ("features", "auto"),
    [
        (ZEN3, "fp32"),
        (ZEN5, "bf16"),
        (SAPPHIRE_RAPIDS, "bf16"),
        ({"avx2": False, "avx512_f": False, "avx512_bf16": False, "amx_bf16": False}, "fp32"),
    ],
)
def test_auto_takes_bf16_only_where_the_cpu_has_it(monkeypatch, features, auto) -> None:
    fake_cpu(monkeypatch, features)
    warnings: list[str] = []
    assert hardware.resolve_precision("auto", CPU, warnings.append) == auto
    assert hardware.resolve_precision("fp32", CPU, warnings.append) == "fp32"
    assert warnings == []


def test_explicit_bf16_without_native_support_runs_but_warns_once(monkeypatch) -> None:
    fake_cpu(monkeypatch, ZEN3)
    warnings: list[str] = []
    assert hardware.resolve_precision("bf16", CPU, warnings.append) == "bf16"
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert "will be slow" in warnings[0] and "neither AMX-BF16 nor AVX512-BF16" in warnings[0]
    fake_cpu(monkeypatch, ZEN5)
    assert hardware.resolve_precision("bf16", CPU, warnings.append) == "bf16"
    assert len(warnings) == 1


def test_explicit_bf16_warns_on_stderr_by_default(monkeypatch, capsys) -> None:
    fake_cpu(monkeypatch, ZEN3)
    hardware.resolve_precision("bf16", CPU)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and "slow" in captured.err


@pytest.mark.parametrize(("native", "auto"), [(True, "bf16"), (False, "fp32")])
def test_cuda_asks_torch_for_native_bf16_without_emulation(monkeypatch, native, auto) -> None:
    asked = []

    def is_bf16_supported(including_emulation: bool = True) -> bool:
        asked.append(including_emulation)
        return native

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake GPU")
    fake_cpu(monkeypatch, ZEN5)  # the CPU's features must not matter for a CUDA device
    assert hardware.resolve_precision("auto", torch.device("cuda")) == auto
    assert asked == [False]


def test_unknown_precision_names_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="unknown precision 'fp16'; valid: auto, fp32, bf16"):
        hardware.resolve_precision("fp16", CPU)


def test_the_real_query_reports_every_feature_as_a_bool() -> None:
    features = hardware.cpu_features()
    assert set(features) == {key for key, _ in hardware.FEATURE_NAMES}
    assert all(isinstance(value, bool) for value in features.values())
    # AVX512-BF16 is an AVX-512 extension: no CPU reports the first without the second.
    assert not features["avx512_bf16"] or features["avx512_f"]


def test_machine_description_names_features_threads_and_choice(monkeypatch) -> None:
    fake_cpu(monkeypatch, ZEN3)
    monkeypatch.setattr(hardware, "cpu_model", lambda: "AMD EPYC 7B13")
    line = hardware.machine_description("cpu")
    assert line.startswith("CPU AMD EPYC 7B13 (AVX2 yes, AVX-512 no, AVX512-BF16 no, AMX-BF16 no)")
    assert f"{torch.get_num_threads()} threads" in line and f"torch {torch.__version__}" in line
    assert line.endswith("device cpu, auto precision fp32")


@pytest.mark.parametrize(
    ("features", "dtype", "expected"),
    [
        (ZEN3, torch.bfloat16, torch.float32),  # emulated: float32 is faster
        (ZEN5, torch.bfloat16, torch.bfloat16),
        (SAPPHIRE_RAPIDS, torch.bfloat16, torch.bfloat16),
        (ZEN5, torch.float16, torch.float32),  # half on a CPU: float32
        (ZEN3, torch.float32, torch.float32),
        (ZEN3, torch.float64, torch.float64),
    ],
)
def test_compute_dtype_runs_reduced_precision_only_where_native(
    monkeypatch, features, dtype, expected
) -> None:
    fake_cpu(monkeypatch, features)
    assert hardware.compute_dtype(dtype, CPU) == expected


def test_cache_sizes_are_read_from_what_linux_reports(tmp_path, monkeypatch) -> None:
    caches = [(1, "Data", "48K"), (1, "Instruction", "64K"), (2, "Unified", "2048K"),
              (3, "Unified", "480M")]
    for index, (level, kind, size) in enumerate(caches):
        folder = tmp_path / f"index{index}"
        folder.mkdir()
        for name, text in (("level", level), ("type", kind), ("size", size)):
            (folder / name).write_text(f"{text}\n")
    monkeypatch.setattr(hardware, "CACHE_FOLDER", tmp_path)
    hardware.cache_bytes.cache_clear()
    try:
        assert hardware.cache_bytes(1) == 48 * 2**10  # the data cache, not the instruction one
        assert hardware.cache_bytes(2) == 2 * 2**20
        assert hardware.cache_bytes(3) == 480 * 2**20
        assert hardware.cache_bytes(4) is None
        monkeypatch.setattr(hardware, "CACHE_FOLDER", tmp_path / "missing")
        hardware.cache_bytes.cache_clear()
        assert hardware.cache_bytes(2) is None
    finally:
        hardware.cache_bytes.cache_clear()


def test_the_machine_key_names_the_cpu_its_features_l2_and_torch(monkeypatch) -> None:
    fake_cpu(monkeypatch, ZEN5)
    monkeypatch.setattr(hardware, "cpu_model", lambda: "AMD EPYC 9B45")
    monkeypatch.setattr(hardware, "cache_bytes", lambda level: 2**20 if level == 2 else None)
    assert hardware.machine_key() == (
        f"AMD EPYC 9B45 (AVX2, AVX-512, AVX512-BF16, L2 1024 KiB), torch {torch.__version__}")
    monkeypatch.setattr(hardware, "cache_bytes", lambda level: None)
    fake_cpu(monkeypatch, dict.fromkeys(ZEN3, False))
    assert hardware.machine_key() == f"AMD EPYC 9B45 (no AVX2), torch {torch.__version__}"
