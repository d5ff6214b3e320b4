"""Is a model's content attention alive? Diagnostics of every layer with content attention.

Three kinds of layer have content attention, a map ``softmax(q·k/√d)`` over the key pixels:

* ``"gated"``: a transformed layer (``TransformedConv2d``, T-CNN), whose heads mix the content
  map ``content_map()[h]`` into their Gaussian attention by the gate ``content_gates()[h]``;
* ``"added"``: a ``MultiHeadSelfAttention2d`` whose content logits ``q·k/√d`` are added to its
  positional logits (``learned-content-*``); its content map is the softmax of the content logits
  alone;
* ``"only"``: a ``MultiHeadSelfAttention2d`` without a positional score (the ViT), whose
  attention is its content map.

For each such layer, on a set of test images (``content_diagnostics``):

* **entropy ÷ log N** of its content maps per head, the mean over queries and images (``N`` the
  key pixels of the layer's input): 1 for uniform maps (the content path adds a global average of
  the input), 0 for one-hot maps;
* **the uniform-content ablation**: the test predictions that change, and the accuracy, when the
  layer's content maps are replaced by exact uniform attention (``uniform_content``), and when
  every layer's are at once. For an ``"added"`` layer this removes its content term, for an
  ``"only"`` layer its attention becomes uniform. A content path that carries nothing changes no
  prediction;
* **query and key weight norms** (Frobenius, of the projections' weights) now and at the model's
  start (``run_start``, ``pretrained_start``): weights that only decayed shrink by the factor weight
  decay alone predicts;
* **gates** (``"gated"`` layers): each head's share of content attention.
"""

from __future__ import annotations

import inspect
import math
import shlex
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from attnconv.attention import MultiHeadSelfAttention2d
from attnconv.attention.transformed import TransformedConv2d
from attnconv.errors import UserError
from attnconv.models.modes import evaluating
from attnconv.models.transformed import TransformedNetwork

ContentLayer = TransformedConv2d | MultiHeadSelfAttention2d
BATCH = 250  # test images per forward


def content_layers(model: nn.Module) -> dict[str, ContentLayer]:
    """Module name → layer for every layer of ``model`` with content attention (a
    ``TransformedConv2d`` with content, a ``MultiHeadSelfAttention2d`` with a content score), in
    network order; a ``TransformedNetwork``'s layers by their names in its base network, as
    ``transformed_layers()`` names them."""
    root = model.network if isinstance(model, TransformedNetwork) else model
    return {
        name: module
        for name, module in root.named_modules()
        if (isinstance(module, TransformedConv2d) and module.content)
        or (isinstance(module, MultiHeadSelfAttention2d) and module.key is not None)
    }


def layer_kind(layer: ContentLayer) -> str:
    """``"gated"``, ``"added"`` or ``"only"`` (module docstring)."""
    if isinstance(layer, TransformedConv2d):
        return "gated"
    return "only" if layer.position is None and not layer.content_positional else "added"


@contextmanager
def uniform_content(model: nn.Module, names: Sequence[str] | None = None) -> Iterator[None]:
    """Within the ``with`` block the content maps of the layers ``names`` (module names of
    ``content_layers``; ``None``: all of them) are exactly uniform over their keys.

    The key projections of those layers are set to zero (weight and bias), so every content logit
    ``q·k/√d`` is exactly 0: a content map becomes exactly ``1/N``, an ``"added"`` layer's logits
    are its positional ones alone. On leaving, also after an exception, each key projection gets
    back its own values bit for bit; no parameter is replaced, so an optimizer holding them is
    unaffected. KeyError for a name that is not a content layer of ``model``.
    """
    layers = content_layers(model)
    chosen = list(layers) if names is None else list(names)
    unknown = [name for name in chosen if name not in layers]
    if unknown:
        raise KeyError(f"not layers of the model with content attention: {', '.join(unknown)}")
    saved = [
        (tensor, tensor.detach().clone())
        for name in chosen
        for tensor in (layers[name].key.weight, layers[name].key.bias)
        if tensor is not None
    ]
    try:
        with torch.no_grad():
            for tensor, _ in saved:
                tensor.zero_()
        yield
    finally:
        with torch.no_grad():
            for tensor, value in saved:
                tensor.copy_(value)


def normalised_entropy(probs: Tensor) -> Tensor:
    """``probs (..., N)`` rows of probabilities → ``(...)`` their entropy ``−Σ p log p`` divided
    by ``log N`` (``0 log 0 = 0``), summed in float64: 1 for a uniform row, 0 for a one-hot one; NaN
    where ``N = 1``, whose only row is both."""
    n = probs.shape[-1]
    entropy = torch.special.entr(probs).sum(dim=-1, dtype=torch.float64)
    return entropy / math.log(n) if n > 1 else torch.full_like(entropy, math.nan)


def content_maps(layer: ContentLayer, x: Tensor) -> Tensor:
    """The content maps of ``layer`` for its input ``x``: ``(B, maps, N_q, N)``.

    A ``TransformedConv2d`` takes ``x (B, in, H, W)`` and gives its ``content_probs``
    (``content_heads`` maps; head ``h`` mixes in map ``content_map()[h]``); a
    ``MultiHeadSelfAttention2d`` takes ``x (B, H, W, dim)`` and gives
    ``softmax(q·k/√d)`` per head (one map per head), its positional terms left out.
    """
    if isinstance(layer, TransformedConv2d):
        return layer.content_probs(x)
    batch, height, width, _ = x.shape
    n, d = height * width, layer.head_dim
    q = layer.query(x).view(batch, n, layer.heads, d).transpose(1, 2)  # (B, heads, N, d)
    k = layer.key(x).view(batch, n, layer.heads, d).transpose(1, 2)
    return ((q @ k.transpose(-1, -2)) / math.sqrt(d)).softmax(dim=-1)  # (B, heads, N, N)


def head_maps(layer: ContentLayer) -> Tensor:
    """``(heads,)`` long: the content map (an index into ``content_maps``' maps) each head uses."""
    if isinstance(layer, TransformedConv2d):
        return layer.content_map().cpu()
    return torch.arange(layer.heads)


def head_gates(layer: ContentLayer) -> list[float] | None:
    """Each head's share of content attention, ``content_gates()`` (``"gated"`` layers), else
    None."""
    if isinstance(layer, TransformedConv2d):
        return [float(g) for g in layer.content_gates().detach()]
    return None


def qk_norms(layer: ContentLayer) -> tuple[float, float]:
    """``(‖W_q‖, ‖W_k‖)``: the Frobenius norms of the query and key projections' weights."""
    return float(layer.query.weight.detach().norm()), float(layer.key.weight.detach().norm())


@dataclass
class LayerContent:
    """The diagnostics of one layer with content attention (module docstring).

    Attributes:
        name: its module name in the model.
        kind: ``"gated"``, ``"added"`` or ``"only"``.
        keys: ``N``, the key pixels of its input.
        entropy: per head, its content map's entropy ÷ log N, the mean over queries and images
            (NaN where ``N = 1``).
        gates: per head, its share of content attention (``"gated"``), else None.
        query_norm, key_norm: ``‖W_q‖``, ``‖W_k‖`` now (Frobenius).
        query_start, key_start: the same at the model's start, None where it is not known.
        changed: test predictions that change when this layer's content maps are uniform.
        accuracy: the test accuracy then (a fraction), None without labels.
    """

    name: str
    kind: str
    keys: int
    entropy: list[float]
    gates: list[float] | None
    query_norm: float
    key_norm: float
    query_start: float | None
    key_start: float | None
    changed: int
    accuracy: float | None

    @property
    def query_ratio(self) -> float | None:
        """``‖W_q‖`` now ÷ at the start (None: start unknown)."""
        return None if self.query_start is None else self.query_norm / self.query_start

    @property
    def key_ratio(self) -> float | None:
        """``‖W_k‖`` now ÷ at the start (None: start unknown)."""
        return None if self.key_start is None else self.key_norm / self.key_start


@dataclass
class ContentDiagnostics:
    """``content_diagnostics``' result: ``layers`` (one ``LayerContent`` each, network order) on
    ``images`` test images; ``accuracy``, the model's own test accuracy (a fraction, None without
    labels); ``changed`` and ``ablated_accuracy``, the same with every layer's content maps
    uniform at once; ``start``, what the query and key norms are compared with, or why with
    nothing (None: not said)."""

    images: int
    accuracy: float | None
    layers: list[LayerContent]
    changed: int
    ablated_accuracy: float | None
    start: str | None = None

    def layer_rows(self) -> list[dict[str, Any]]:
        """One plain row per layer: ``layer`` (index), ``name``, ``kind``, ``keys``,
        ``entropy_min``/``entropy_mean``/``entropy_max`` (over heads, ÷ log N), ``gate_mean``
        (None: no gates), ``query_ratio``, ``key_ratio`` (None: start unknown), ``changed``,
        ``changed_share`` (of the images), ``accuracy`` (under the ablation, None without
        labels)."""
        rows = []
        for index, layer in enumerate(self.layers):
            finite = [e for e in layer.entropy if math.isfinite(e)]
            rows.append(
                {
                    "layer": index,
                    "name": layer.name,
                    "kind": layer.kind,
                    "keys": layer.keys,
                    "entropy_min": min(finite) if finite else math.nan,
                    "entropy_mean": sum(finite) / len(finite) if finite else math.nan,
                    "entropy_max": max(finite) if finite else math.nan,
                    "gate_mean": None
                    if layer.gates is None
                    else sum(layer.gates) / len(layer.gates),
                    "query_ratio": layer.query_ratio,
                    "key_ratio": layer.key_ratio,
                    "changed": layer.changed,
                    "changed_share": layer.changed / self.images,
                    "accuracy": layer.accuracy,
                }
            )
        return rows

    def head_rows(self) -> list[dict[str, Any]]:
        """One plain row per layer and head: ``layer``, ``name``, ``head``, ``entropy`` (÷ log N)
        and ``gate`` (None: no gates)."""
        return [
            {
                "layer": index,
                "name": layer.name,
                "head": head,
                "entropy": entropy,
                "gate": None if layer.gates is None else layer.gates[head],
            }
            for index, layer in enumerate(self.layers)
            for head, entropy in enumerate(layer.entropy)
        ]

    def to_dict(self) -> dict[str, Any]:
        """Plain values (JSON): ``images``, ``accuracy``, ``changed``, ``ablated_accuracy``,
        ``start`` and ``layers``, each with ``name``, ``kind``, ``keys``, ``entropy`` (per head,
        None for NaN), ``gates``, ``query_ratio``, ``key_ratio``, ``changed`` and ``accuracy``: what
        the explorer shows (``attnconv.viz.export``)."""
        return {
            "images": self.images,
            "accuracy": self.accuracy,
            "changed": self.changed,
            "ablated_accuracy": self.ablated_accuracy,
            "start": self.start,
            "layers": [
                {
                    "name": layer.name,
                    "kind": layer.kind,
                    "keys": layer.keys,
                    "entropy": [e if math.isfinite(e) else None for e in layer.entropy],
                    "gates": layer.gates,
                    "query_ratio": layer.query_ratio,
                    "key_ratio": layer.key_ratio,
                    "changed": layer.changed,
                    "accuracy": layer.accuracy,
                }
                for layer in self.layers
            ],
        }


@torch.no_grad()
def _predictions(model: nn.Module, images: Tensor, batch_size: int) -> Tensor:
    """``(B,)`` the class ``model`` predicts for each of ``images (B, C, H, W)``."""
    device = next(model.parameters()).device
    return torch.cat(
        [
            model(images[i : i + batch_size].to(device)).argmax(dim=-1).cpu()
            for i in range(0, images.shape[0], batch_size)
        ]
    )


@torch.no_grad()
def _entropies(
    model: nn.Module, layers: dict[str, ContentLayer], images: Tensor, batch_size: int
) -> tuple[Tensor, dict[str, Tensor], dict[str, int]]:
    """The predictions ``(B,)``, and per layer each content map's entropy ÷ log N ``(maps,)``
    (mean over queries and images) and its number of keys, from one pass over ``images``."""
    device = next(model.parameters()).device
    inputs: dict[str, Tensor] = {}
    hooks = [
        layer.register_forward_pre_hook(
            lambda _module, args, name=name: inputs.__setitem__(name, args[0])
        )
        for name, layer in layers.items()
    ]
    sums: dict[str, Tensor] = {}
    counts: dict[str, int] = dict.fromkeys(layers, 0)
    keys: dict[str, int] = {}
    predictions = []
    try:
        for start in range(0, images.shape[0], batch_size):
            inputs.clear()
            predictions.append(
                model(images[start : start + batch_size].to(device)).argmax(-1).cpu()
            )
            for name, layer in layers.items():
                maps = content_maps(layer, inputs[name])  # (B, maps, N_q, N)
                entropy = normalised_entropy(maps).sum(dim=(0, 2)).cpu()  # (maps,)
                sums[name] = entropy if name not in sums else sums[name] + entropy
                counts[name] += maps.shape[0] * maps.shape[2]
                keys[name] = maps.shape[-1]
    finally:
        for hook in hooks:
            hook.remove()
    return torch.cat(predictions), {n: sums[n] / counts[n] for n in layers}, keys


def _share(predictions: Tensor, labels: Tensor | None) -> float | None:
    return None if labels is None else float((predictions == labels).double().mean())


def content_diagnostics(
    model: nn.Module,
    images: Tensor,
    labels: Tensor | None = None,
    start: nn.Module | None = None,
    start_note: str | None = None,
    batch_size: int = BATCH,
) -> ContentDiagnostics:
    """The content-attention diagnostics of ``model`` (module docstring) on ``images (B, C, H,
    W)`` in ``[0, 1]`` with their ``labels (B,)`` (None: no accuracies), the model in eval mode.

    ``start``: the model as it started (``run_start``, ``pretrained_start``; None: not known),
    whose layers of the same names give the query and key norms at the start; ``start_note`` says
    what it is (or why there is none). Passes over the images: the model's own, one per layer
    with content attention made uniform and, with several such layers, one with all of them;
    ``batch_size`` images a forward. UserError if the model has no content attention.
    """
    layers = content_layers(model)
    if not layers:
        raise UserError(f"{type(model).__name__} has no layer with content attention")
    if labels is not None and labels.shape[0] != images.shape[0]:
        raise ValueError(f"got {labels.shape[0]} labels for {images.shape[0]} images")
    starts = content_layers(start) if start is not None else {}
    labels = None if labels is None else labels.cpu()
    results = []
    with evaluating(model):
        predictions, entropies, keys = _entropies(model, layers, images, batch_size)
        for name, layer in layers.items():
            with uniform_content(model, [name]):
                ablated = _predictions(model, images, batch_size)
            query_norm, key_norm = qk_norms(layer)
            before = starts.get(name)
            same = before is not None and all(
                getattr(before, p).weight.shape == getattr(layer, p).weight.shape
                for p in ("query", "key")
            )
            query_start, key_start = qk_norms(before) if same else (None, None)
            results.append(
                LayerContent(
                    name=name,
                    kind=layer_kind(layer),
                    keys=keys[name],
                    entropy=entropies[name][head_maps(layer)].tolist(),
                    gates=head_gates(layer),
                    query_norm=query_norm,
                    key_norm=key_norm,
                    query_start=query_start,
                    key_start=key_start,
                    changed=int((ablated != predictions).sum()),
                    accuracy=_share(ablated, labels),
                )
            )
        if len(layers) > 1:  # with one layer, all at once is that layer's ablation
            with uniform_content(model):
                ablated = _predictions(model, images, batch_size)
    return ContentDiagnostics(
        images=int(images.shape[0]),
        accuracy=_share(predictions, labels),
        layers=results,
        changed=int((ablated != predictions).sum()),
        ablated_accuracy=_share(ablated, labels),
        start=start_note,
    )


def labelled_test_images(
    dataset: str,
    image_size: Sequence[int],
    count: int | None = None,
    data_dir: str | None = None,
) -> tuple[Tensor, Tensor]:
    """The first ``count`` (None: all) test images of ``dataset`` as floats ``(B, C, H, W)`` in
    ``[0, 1]`` and their labels ``(B,)``. UserError if its images are not ``image_size`` (the
    model's input) or it has fewer than ``count``."""
    from attnconv.data import load_splits

    test = load_splits(dataset, data_dir=data_dir, val_size=0).test
    size = tuple(int(s) for s in image_size)
    if tuple(test.images.shape[2:]) != size:
        raise UserError(
            f"the {dataset} test images are {test.images.shape[2]}x{test.images.shape[3]}, the "
            f"model takes {size[0]}x{size[1]}"
        )
    if count is not None and count > len(test.labels):
        raise UserError(f"{dataset} has {len(test.labels)} test images, fewer than {count}")
    count = len(test.labels) if count is None else count
    return test.images[:count].float() / 255.0, test.labels[:count]


def explorer_content(
    model: nn.Module, images: Tensor, start: tuple[nn.Module | None, str]
) -> dict[str, Any] | None:
    """What an explorer page shows of ``model``'s content attention (``attnconv.viz.export``):
    ``content_diagnostics(...).to_dict()`` on its ``images (B, C, H, W)``, without labels, the
    norms against ``start`` (``run_start``'s or ``pretrained_start``'s answer); None for a model
    without content attention."""
    if not content_layers(model):
        return None
    return content_diagnostics(model, images, start=start[0], start_note=start[1]).to_dict()


# ------------------------------------------------------------------ the start of a model


def _transform_settings(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The ``transform_checkpoint`` keyword arguments that rebuild a transformed network of
    ``arguments`` (its constructor arguments) from the network it transformed."""
    from attnconv.convert import transform_checkpoint

    taken = set(inspect.signature(transform_checkpoint).parameters) - {"checkpoint", "preset"}
    return {key: value for key, value in arguments.items() if key in taken}


def start_from(
    architecture: str,
    arguments: Mapping[str, Any],
    seed: int,
    init: Mapping[str, Any] | None = None,
) -> nn.Module:
    """The model ``MODELS[architecture](**arguments)`` as training started it with ``seed``:

    * ``init`` None: built after ``torch.manual_seed(seed)``, as ``attnconv train`` builds a model
      trained from scratch;
    * ``init`` a checkpoint of a network that a transformed ``architecture`` transformed: that
      network transformed as ``arguments`` say, queries and keys drawn after
      ``torch.manual_seed(seed)`` (as ``attnconv transform --seed`` and ``train --init`` draw them);
    * otherwise ``init``'s own model (a fine-tuned run starts from it).

    Torch's global random state is left as it was. In eval mode, on the CPU.
    """
    from attnconv.models.checkpoint import build_model, construct

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if init is None:
            return construct(architecture, arguments, "the run's start").eval()
        if architecture == "transformed" and init["architecture"] != "transformed":
            from attnconv.convert import transform_checkpoint

            transformed = transform_checkpoint(
                init, **_transform_settings(arguments), preset=init.get("preset")
            )
            return build_model(transformed, "the run's start").eval()
        return build_model(init, "the run's start").eval()


def run_start(checkpoint: Mapping[str, Any]) -> tuple[nn.Module | None, str]:
    """The start of the run a training checkpoint (``load_checkpoint``) comes from, and a line
    saying what it is: rebuilt from the run's seed (trained from scratch), the run's ``--init``
    checkpoint (fine-tuned), or that checkpoint transformed with the run's seed. ``(None, why)``
    where the checkpoint records no run (a transform's own output) or its init cannot be read."""
    from attnconv.models.pretrained import load_init_checkpoint

    config = checkpoint.get("config") or {}
    if "seed" not in config:
        return None, "no run recorded in the checkpoint: its start is not known"
    seed, init = int(config["seed"]), config.get("init")
    if init is None:
        model = start_from(checkpoint["architecture"], checkpoint["arguments"], seed)
        return model, f"the run's start, rebuilt from its seed {seed}"
    try:
        source = load_init_checkpoint(init)
    except (UserError, OSError) as err:
        return None, f"its start, {init}, cannot be read ({str(err).splitlines()[0]})"
    model = start_from(checkpoint["architecture"], checkpoint["arguments"], seed, source)
    if checkpoint["architecture"] == "transformed" and source["architecture"] != "transformed":
        return model, f"the run's start: {init} transformed with seed {seed}"
    return model, f"the run's start, {init}"


def _option(words: list[str], flag: str) -> str | None:
    """The word after ``flag`` in ``words`` (None: no such flag)."""
    return words[words.index(flag) + 1] if flag in words[:-1] else None


def pretrained_start(name: str, folder: str | Path | None = None) -> tuple[nn.Module | None, str]:
    """The start of the shipped model ``name`` (in ``folder``, default the package's weights),
    read from the command its index entry records: the transform of a shipped network
    (``attnconv transform --pretrained X [--seed S] && attnconv train ...``: X transformed with
    seed S, default 0), or the model built with the training command's seed (default 0), or its
    ``--init pretrained:X``. ``(None, why)`` where the record names no start that can be rebuilt
    (a file of the machine that trained it, a command that is not attnconv's)."""
    from attnconv.models.pretrained import (
        PRETRAINED_PREFIX,
        WEIGHTS_DIR,
        pretrained_checkpoint,
        pretrained_info,
    )
    from attnconv.train.config import read_training_command, resolve_config

    folder = WEIGHTS_DIR if folder is None else folder
    info = pretrained_info(name, folder)
    command = info.run.get("command")
    unknown = f"{name}'s start is not known"
    if not command:
        return None, f"{unknown}: its index entry records no training command"
    for part in command.split(" && "):
        words = shlex.split(part)
        if words[:2] == ["attnconv", "transform"]:
            source = _option(words, "--pretrained")
            if source is None:
                return None, f"{unknown}: it was transformed from a file ({part!r})"
            seed = int(_option(words, "--seed") or 0)
            model = start_from(
                info.architecture, info.arguments, seed, pretrained_checkpoint(source, folder)
            )
            return model, f"its start: the shipped {source} transformed with seed {seed}"
    try:
        recorded = read_training_command(command)
        init = recorded.init
        config = resolve_config(
            recorded.preset, recorded.dataset, list(recorded.overrides),
            **({"init": init} if init is not None else {}),
        )  # fmt: skip
    except UserError as err:
        return None, f"{unknown}: {str(err).splitlines()[0]}"
    if init is None:
        model = start_from(info.architecture, info.arguments, config.seed)
        return model, f"its start, rebuilt from the training command's seed {config.seed}"
    if not init.startswith(PRETRAINED_PREFIX):
        return None, f"{unknown}: it was fine-tuned from a file ({init})"
    source = pretrained_checkpoint(init[len(PRETRAINED_PREFIX) :], folder)
    model = start_from(info.architecture, info.arguments, config.seed, source)
    return model, f"its start: {init} with seed {config.seed}"


def analyse_checkpoint(
    path: str | Path, out: str | Path, data_dir: str | None = None
) -> dict[str, Any]:
    """The content diagnostics of the model in checkpoint ``path`` (a run's, e.g. its best.pt) on
    every test image of its dataset, against the run's start (``run_start``), written into
    ``out``: ``content.csv`` (``layer_rows``), ``content_heads.csv`` (``head_rows``) and
    ``content.txt`` (``format_content``). Returns the run's summary of them: ``content_entropy``
    and ``content_changed`` (per layer, the mean entropy ÷ log N over its heads and the share of
    test predictions the uniform-content ablation changes), ``content_changed_all`` (every layer
    at once) and ``content_gate`` (per layer the mean gate, None without gates); ``{}`` for a
    model without content attention, with nothing written."""
    from attnconv.models.checkpoint import load_model
    from attnconv.viz.figures import write_csv

    model, checkpoint = load_model(path)
    if not content_layers(model):
        return {}
    images, labels = labelled_test_images(checkpoint["dataset"], model.image_size, None, data_dir)
    start, note = run_start(checkpoint)
    diagnostics = content_diagnostics(model, images, labels, start, note)
    out = Path(out)
    write_csv(diagnostics.layer_rows(), out / "content.csv")
    write_csv(diagnostics.head_rows(), out / "content_heads.csv")
    text = format_content(
        diagnostics, f"the {diagnostics.images} {checkpoint['dataset']} test images"
    )
    (out / "content.txt").write_text(text + "\n")
    rows = diagnostics.layer_rows()
    return {
        "content_entropy": [row["entropy_mean"] for row in rows],
        "content_changed": [row["changed_share"] for row in rows],
        "content_changed_all": diagnostics.changed / diagnostics.images,
        "content_gate": [row["gate_mean"] for row in rows],
    }


# ------------------------------------------------------------------ text


def _number(value: float | None, form: str) -> str:
    return "—" if value is None or not math.isfinite(value) else format(value, form)


def _rows_text(cells: list[list[str]], left: int) -> list[str]:
    """``cells`` (a header row, then the rows) as aligned lines: column ``left`` (a name)
    left-aligned, the others right-aligned."""
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    return [
        " ".join(
            text.ljust(width) if i == left else text.rjust(width)
            for i, (text, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in cells
    ]


def format_content(diagnostics: ContentDiagnostics, images: str) -> str:
    """``diagnostics`` as text: a line on the images (``images`` names them: "the first 3 digits
    test images") and the model's accuracy, one row per layer (entropy ÷ log N over its heads, mean gate, query and key norms
    against the start, the uniform-content ablation), all layers at once, and each head's entropy
    ÷ log N."""
    accuracy = (
        "" if diagnostics.accuracy is None else f" (accuracy {100 * diagnostics.accuracy:.2f}%)"
    )
    lines = [
        f"Content attention on {images}{accuracy}. entropy: of each head's "
        f"content map, divided by log N (N key pixels), mean over queries and images (1: uniform, "
        f"0: one-hot); uniform: the layer's content maps replaced by uniform attention, test "
        f"predictions changed and accuracy then; q, k: query and key weight norms now ÷ at the "
        f"start ({diagnostics.start or 'not known'}).",
    ]
    cells = [["layer", "module", "kind", "N", "entropy min", "mean", "max", "gate", "q", "k",
              "uniform: changed", "%", "accuracy"]]  # fmt: skip
    for row in diagnostics.layer_rows():
        cells.append(
            [
                str(row["layer"]),
                row["name"],
                row["kind"],
                str(row["keys"]),
                _number(row["entropy_min"], ".3f"),
                _number(row["entropy_mean"], ".3f"),
                _number(row["entropy_max"], ".3f"),
                _number(row["gate_mean"], ".3f"),
                _number(row["query_ratio"], ".3f"),
                _number(row["key_ratio"], ".3f"),
                str(row["changed"]),
                f"{100 * row['changed_share']:.2f}",
                "—" if row["accuracy"] is None else f"{100 * row['accuracy']:.2f}%",
            ]
        )
    lines += _rows_text(cells, left=1)
    everything = (
        "" if diagnostics.ablated_accuracy is None
        else f", accuracy {100 * diagnostics.ablated_accuracy:.2f}%"
    )  # fmt: skip
    lines.append(
        f"every layer's content maps uniform at once: {diagnostics.changed} of "
        f"{diagnostics.images} predictions changed "
        f"({100 * diagnostics.changed / diagnostics.images:.2f}%){everything}"
    )
    heads = max(len(layer.entropy) for layer in diagnostics.layers)
    lines.append("entropy ÷ log N per head:")
    cells = [["module", *(f"h{h}" for h in range(heads))]]
    for layer in diagnostics.layers:
        values = [_number(e, ".3f") for e in layer.entropy]
        cells.append([layer.name, *values, *[""] * (heads - len(values))])
    lines += _rows_text(cells, left=0)
    return "\n".join(lines)
