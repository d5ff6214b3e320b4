"""Vision transformers of timm and torchvision: importing them next to a CPU torch, building one by
name, with local weights, the libraries' own pretrained weights or random ones, and what it
expects as input.

Weights come from a local file (safetensors, or a ``torch.save``d state dict, optionally under a
``"model"`` or ``"state_dict"`` key), from the library's own pretrained weights
(``pretrained=True``), or the model keeps its random initialisation.

**Pretrained weights as the libraries keep them.** timm's come through
``timm.create_model(name, pretrained=True)``: the Hugging Face hub cache (``HF_HOME``/``hub``, or
``HF_HUB_CACHE``), downloaded into it where the machine can reach the hub, read from it alone
under ``HF_HUB_OFFLINE=1``; ``NAME.TAG`` picks one of a model's pretrained tags. A model the cache
does not hold is downloaded only after one request finds that the hub answers (within
``HUB_PROBE_TIMEOUT``): the hub's client retries an unreachable hub with back-off, about a minute
of waiting before its error. torchvision's are its ``DEFAULT`` weights enum
(``torchvision.models.get_model_weights(name).DEFAULT``), read by its own ``get_state_dict`` from
``TORCH_HOME``/``hub/checkpoints``, downloaded there when missing. When neither the cache nor the
network has them, one line says where they were looked for (and, for the hub, names
``HF_HUB_OFFLINE=1``).

**torchvision next to a CPU torch.** PyPI's torchvision wheel for Linux is built against PyPI's
CUDA torch. Beside the CPU torch that attnconv installs, its compiled extension (``_C``: detection
operators such as ``nms``) does not load; torchvision carries on without it, then fails at import
when it registers a shape function for ``torchvision::nms``, an operator that does not exist
(``RuntimeError: operator torchvision::nms does not exist``); timm imports torchvision and fails
with it. ``import_torchvision`` first loads the extension as torchvision itself does; only where
that fails does it define the two operator schemas that import needs (``torchvision::nms`` and
``torchvision::qnms``, no kernels), after which torchvision's pure-Python models (every vision
transformer attnconv analyses) work. The alternative, PyPI's CUDA torch, works too but makes a
~5 GB environment for a CPU-only project; the matching CPU torchvision from PyTorch's own index
needs no schemas and is used as it is.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from attnconv.errors import UserError

# The schemas torchvision's import registers shape functions for (torchvision/_meta_registrations.py).
TORCHVISION_SCHEMAS: dict[str, str] = {
    "torchvision::nms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "torchvision::qnms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
# torchvision's vision transformers were trained on ImageNet normalised with these.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
INSTALL_HINT = "install the dev extra (pip install -e '.[dev]') or timm and torchvision"
# Seconds the one request that checks whether the Hugging Face hub answers may take.
HUB_PROBE_TIMEOUT = 5.0
OFFLINE_HINT = "offline, HF_HUB_OFFLINE=1 reads the cache without trying the hub"


def _extension_loads(package_dir: Path) -> bool:
    """Whether torchvision's compiled extension ``_C`` loads into this torch (as torchvision's own
    ``extension._load_library`` loads it)."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = package_dir / f"_C{suffix}"
        if path.is_file():
            try:
                torch.ops.load_library(str(path))
            except OSError:
                return False
            return True
    return False


def import_torchvision() -> ModuleType:
    """``import torchvision``, also where its compiled extension does not fit the installed torch
    (module docstring). UserError if torchvision is not installed."""
    if "torchvision" not in sys.modules:
        spec = importlib.util.find_spec("torchvision")
        if spec is None or spec.origin is None:
            raise UserError(f"torchvision is not installed: {INSTALL_HINT}")
        if not _extension_loads(Path(spec.origin).parent):
            for name, schema in TORCHVISION_SCHEMAS.items():
                namespace, op = name.split("::")
                if not hasattr(getattr(torch.ops, namespace), op):
                    torch.library.define(name, schema)
    import torchvision

    return torchvision


def import_timm() -> ModuleType:
    """``import timm`` (which imports torchvision: ``import_torchvision`` first). UserError if timm
    is not installed."""
    if importlib.util.find_spec("timm") is None:
        raise UserError(f"timm is not installed: {INSTALL_HINT}")
    import_torchvision()
    import timm

    return timm


@dataclass
class ThirdPartyModel:
    """A timm or torchvision model and what it takes as input.

    Attributes:
        model: the module, in eval mode.
        name: ``"timm:NAME"`` or ``"torchvision:NAME"``.
        weights: the weights file's name, or ``"random"``.
        image_size: the input ``(H, W)`` it is built for.
        mean, std: per-channel normalisation of its input, on the ``[0, 1]`` scale.
    """

    model: nn.Module
    name: str
    weights: str
    image_size: tuple[int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]

    @property
    def in_channels(self) -> int:
        return len(self.mean)

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        """Images ``(B, C, H, W)`` in ``[0, 1]`` as the model takes them: ``(x − mean) / std``."""
        mean = torch.tensor(self.mean, dtype=images.dtype).view(-1, 1, 1)
        std = torch.tensor(self.std, dtype=images.dtype).view(-1, 1, 1)
        return (images - mean) / std


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a weights file: ``.safetensors``, or a ``torch.save``d state dict (or a dict
    holding one under ``"model"`` or ``"state_dict"``), read without running code."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"weights file {str(path)!r} does not exist")
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except SafetensorError as err:
            raise UserError(f"{path} is not a readable safetensors file ({err})") from err
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # pickle errors of every kind: a file we cannot use
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(
            f"{path} is not a state dict torch can load without running code ({first})"
        ) from err
    for key in ("model", "state_dict"):
        if isinstance(loaded, dict) and isinstance(loaded.get(key), dict):
            loaded = loaded[key]
    if not isinstance(loaded, dict) or not all(
        isinstance(v, torch.Tensor) for v in loaded.values()
    ):
        raise UserError(f"{path} holds no state dict (a mapping of names to tensors)")
    return loaded


def check_weights(
    state: dict[str, torch.Tensor], reference: nn.Module, label: str
) -> dict[str, torch.Tensor]:
    """``state``, checked before anything is built from it: at least one tensor, every
    floating-point one finite, and each that ``reference`` (the model, typically on the meta
    device) holds in floating point stored in floating point (int8 and other quantised encodings
    would be cast to nonsense values). UserError starting with ``label`` (the file's name) and
    naming the weight."""
    if not state:
        raise UserError(f"{label} holds no tensors")
    floating = {k for k, v in reference.state_dict().items() if v.is_floating_point()}
    for name, tensor in state.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise UserError(
                f"{label}: weight {name} holds NaN or infinite values; the file is damaged or "
                f"was saved from a diverged run"
            )
        if name in floating and not tensor.is_floating_point():
            raise UserError(
                f"{label}: weight {name} is stored as {tensor.dtype}, where the model holds "
                f"floating point; save the weights dequantised"
            )
    return state


def read_weights(path: str | Path, reference: nn.Module) -> dict[str, torch.Tensor]:
    """The tensors of the weights file ``path`` (``read_state_dict``), checked against
    ``reference`` by ``check_weights``. UserError naming the file and the weight."""
    path = Path(path)
    return check_weights(read_state_dict(path), reference, path.name)


def load_into(model: nn.Module, state: dict[str, torch.Tensor], name: str, label: str) -> None:
    """``model.load_state_dict(state)`` with a one-line UserError, starting with ``label`` (the
    weights' file name), when they do not fit the model ``name``."""
    try:
        model.load_state_dict(state)
    except RuntimeError as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        detail = "; ".join(lines[1:4]) if len(lines) > 1 else lines[0]
        raise UserError(f"{label} does not fit {name}: {detail}") from err


def _size_pair(size: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(size, int):
        return size, size
    return int(size[0]), int(size[1])


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _not_cached(
    spec: str, source: str, cache: Path | str, reason: str, hint: str | None = None
) -> UserError:
    """The one line for pretrained weights that neither the cache nor the network has."""
    return UserError(
        f"{spec}: its pretrained weights ({source}) are not in the cache {cache} and could not be "
        f"downloaded ({reason}); fetch them on a machine that can, or give --weights FILE"
        + (f" ({hint})" if hint else "")
    )


def _hub_cached(cache: Path | str, repo_id: str) -> bool:
    """Whether the hub cache ``cache`` holds a snapshot of ``repo_id`` (``REPO@REVISION`` allowed)."""
    folder = Path(cache) / f"models--{repo_id.partition('@')[0].replace('/', '--')}" / "snapshots"
    return folder.is_dir() and any(path.is_file() for path in folder.rglob("*"))


def _unreachable(endpoint: str) -> str | None:
    """Why ``endpoint`` cannot be reached (one HEAD request, no retries), or None when it answers,
    whatever the HTTP status."""
    try:
        request = urllib.request.Request(endpoint, method="HEAD")
        urllib.request.urlopen(request, timeout=HUB_PROBE_TIMEOUT).close()
    except urllib.error.HTTPError:
        return None
    except urllib.error.URLError as err:
        return _first_line(err.reason) if isinstance(err.reason, BaseException) else str(err.reason)
    except (OSError, ValueError) as err:  # a timeout, a malformed address
        return _first_line(err)
    return None


def _timm_pretrained(timm: ModuleType, name: str, kwargs: dict[str, Any]) -> tuple[nn.Module, str]:
    """``timm.create_model(name, pretrained=True)``: timm's own loading, from the Hugging Face hub
    cache (or the hub) or, for models without a hub copy, torch's hub cache (or the URL). Returns
    the model and where its weights came from."""
    from safetensors import SafetensorError

    config = timm.models.get_pretrained_cfg(name)
    if config is None or not (config.hf_hub_id or config.url or config.file):
        raise UserError(f"timm:{name} has no pretrained weights: give --weights FILE or --random")
    offline = False
    if config.hf_hub_id:
        from huggingface_hub import constants

        source, cache = f"Hugging Face hub {config.hf_hub_id}", constants.HF_HUB_CACHE
        offline = constants.HF_HUB_OFFLINE
        if not offline and not _hub_cached(cache, config.hf_hub_id):
            unreachable = _unreachable(constants.ENDPOINT)
            if unreachable is not None:
                reason = f"{constants.ENDPOINT} cannot be reached: {unreachable}"
                raise _not_cached(f"timm:{name}", source, cache, reason, OFFLINE_HINT)
    else:
        source, cache = config.url or config.file, Path(torch.hub.get_dir()) / "checkpoints"
    try:
        model = timm.create_model(name, pretrained=True, **kwargs)
    except OSError as err:  # the hub's LocalEntryNotFoundError, offline mode, HTTP and URL errors
        reason = "HF_HUB_OFFLINE is set" if offline else _first_line(err)
        hint = OFFLINE_HINT if config.hf_hub_id and not offline else None
        raise _not_cached(f"timm:{name}", source, cache, reason, hint) from err
    except SafetensorError as err:
        raise UserError(
            f"timm:{name}: the cached weights of {source} in {cache} are damaged "
            f"({_first_line(err)}); delete them to fetch them again"
        ) from err
    return model, f"pretrained {config.hf_hub_id or source}"


def build_timm(
    name: str,
    weights: str | Path | None,
    image_size: int | None = None,
    pretrained: bool = False,
) -> ThirdPartyModel:
    """timm's model ``name`` (``timm.create_model``; ``NAME.TAG`` one of its pretrained tags) with
    timm's own pretrained weights (``pretrained``: module docstring), the weights of a local file
    (read and checked by ``read_weights``, then handed to timm's own loader, which adapts
    checkpoints of the original repositories), or random ones; position embeddings are resampled
    to ``image_size`` by timm."""
    timm = import_timm()
    if not timm.is_model(name):
        raise UserError(f"timm has no model {name!r} (timm.list_models() names them)")
    try:
        timm.models.get_pretrained_cfg(name)
    except RuntimeError as err:  # an unknown tag of a known architecture
        architecture = name.partition(".")[0]
        raise UserError(
            f"timm:{name}: {_first_line(err)} (timm.list_pretrained({architecture + '*'!r}) "
            f"names the tags)"
        ) from err
    kwargs: dict[str, Any] = {} if image_size is None else {"img_size": image_size}
    if pretrained:
        model, source = _timm_pretrained(timm, name, kwargs)
    elif weights is None:
        model, source = timm.create_model(name, pretrained=False, **kwargs), "random"
    else:
        path = Path(weights)
        with torch.device("meta"):  # the shapes and types only, to check the file against
            reference = timm.create_model(name, pretrained=False, **kwargs)
        state = timm.models.clean_state_dict(read_weights(path, reference))
        try:
            model = timm.create_model(
                name, pretrained=True, pretrained_cfg_overlay={"state_dict": state}, **kwargs
            )
        except RuntimeError as err:
            lines = [line.strip() for line in str(err).splitlines() if line.strip()]
            raise UserError(
                f"{path.name} does not fit timm:{name}: {'; '.join(lines[:3])}"
            ) from err
        source = path.name
    config = timm.data.resolve_data_config({}, model=model)
    patch_embed = getattr(model, "patch_embed", None)
    size = getattr(patch_embed, "img_size", None) or config["input_size"][1:]
    return ThirdPartyModel(
        model.eval(),
        f"timm:{name}",
        source,
        _size_pair(size),
        tuple(float(v) for v in config["mean"]),
        tuple(float(v) for v in config["std"]),
    )


def _torchvision_pretrained(
    torchvision: ModuleType, name: str, reference: nn.Module
) -> tuple[dict[str, torch.Tensor], Any]:
    """The state dict of torchvision's ``DEFAULT`` weights of ``name``, read by the weights enum's
    own ``get_state_dict`` (torch's hub cache, downloaded into it when missing; the hash is
    checked on download), checked by ``check_weights``. Returns it and the weights enum."""
    import pickle

    weights = torchvision.models.get_model_weights(name).DEFAULT
    file = Path(urllib.parse.urlparse(weights.url).path).name
    cache = Path(torch.hub.get_dir()) / "checkpoints"
    try:
        state = weights.get_state_dict(progress=True, check_hash=True)
    except OSError as err:  # URLError, HTTPError, a failed hash check
        raise _not_cached(f"torchvision:{name}", str(weights), cache, _first_line(err)) from err
    except (RuntimeError, EOFError, pickle.UnpicklingError) as err:
        raise UserError(
            f"torchvision:{name}: the cached weights {cache / file} are not a state dict torch "
            f"can load ({_first_line(err)}); delete the file to download it again"
        ) from err
    return check_weights(state, reference, file), weights


def build_torchvision(
    name: str,
    weights: str | Path | None,
    image_size: int | None = None,
    pretrained: bool = False,
) -> ThirdPartyModel:
    """torchvision's model ``name`` (``torchvision.models.get_model``, built for ``image_size``
    when given, a multiple of its patch size) with torchvision's own ``DEFAULT`` pretrained
    weights (``pretrained``: module docstring), the weights of a local file (``read_weights``),
    or random ones. The classifier is sized from the weights' ``heads.head.weight`` when it has
    one of the model's width, which its bytes then back; their position embedding is resampled to
    ``image_size`` by torchvision's own ``interpolate_embeddings`` when it differs."""
    torchvision = import_torchvision()
    if name not in torchvision.models.list_models():
        raise UserError(
            f"torchvision has no model {name!r} (torchvision.models.list_models() names them)"
        )
    with torch.device("meta"):  # the architecture, to check the options and the file against
        reference = torchvision.models.get_model(name, weights=None)
    if getattr(reference, "image_size", None) is None:
        raise UserError(f"torchvision:{name} is not a vision transformer (no image_size)")
    kwargs: dict[str, Any] = {}
    if image_size is not None:
        if image_size % reference.patch_size:
            raise UserError(
                f"torchvision:{name} takes image sizes that are multiples of its patch size "
                f"{reference.patch_size}, got {image_size}"
            )
        kwargs["image_size"] = image_size
    state, mean, std = None, IMAGENET_MEAN, IMAGENET_STD
    if pretrained:
        state, enum = _torchvision_pretrained(torchvision, name, reference)
        label, source = str(enum), f"pretrained {enum}"
        transform = enum.transforms()
        mean, std = tuple(transform.mean), tuple(transform.std)
    elif weights is not None:
        state = read_weights(weights, reference)
        label = source = Path(weights).name
    else:
        source = "random"
    if state is not None:
        head = state.get("heads.head.weight")
        if head is not None:
            width = reference.heads.head.in_features
            if head.dim() != 2 or head.shape[0] < 1 or head.shape[1] != width:
                raise UserError(
                    f"{label}: heads.head.weight has shape {tuple(head.shape)}, but "
                    f"torchvision:{name} takes (classes, {width})"
                )
            kwargs["num_classes"] = head.shape[0]
        position = state.get("encoder.pos_embedding")
        size = kwargs.get("image_size", reference.image_size)
        tokens = (size // reference.patch_size) ** 2 + 1
        if position is not None and position.dim() == 3 and position.shape[1] != tokens:
            interpolate = torchvision.models.vision_transformer.interpolate_embeddings
            state = interpolate(size, reference.patch_size, state)
    model = torchvision.models.get_model(name, weights=None, **kwargs)
    if state is not None:
        load_into(model, state, f"torchvision:{name}", label)
    return ThirdPartyModel(
        model.eval(),
        f"torchvision:{name}",
        source,
        _size_pair(model.image_size),
        tuple(float(v) for v in mean),
        tuple(float(v) for v in std),
    )


LIBRARIES = {"timm": build_timm, "torchvision": build_torchvision}


def build_third_party(
    spec: str,
    weights: str | Path | None,
    image_size: int | None = None,
    pretrained: bool = False,
) -> ThirdPartyModel:
    """The model named ``spec`` = ``"timm:NAME"`` or ``"torchvision:NAME"`` (see ``build_timm``,
    ``build_torchvision``) with the library's own pretrained weights (``pretrained``), the weights
    of the local file ``weights``, or (neither) its random initialisation."""
    if pretrained and weights is not None:
        raise ValueError("give weights or pretrained=True, not both")
    library, _, name = spec.partition(":")
    if library not in LIBRARIES or not name:
        raise UserError(f"expected timm:NAME or torchvision:NAME, got {spec!r}")
    return LIBRARIES[library](name, weights, image_size, pretrained)
