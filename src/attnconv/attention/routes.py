"""Routes chosen by measurement: of the exact ways to compute an attention, the fastest here.

The layers compute the same function by several routes (``attention/layer.py``: the separable
factors, one head at a time or all at once, or the shared ``(heads, N, N)`` matrix;
``attention/content.py``: SDPA's fused kernel, or the folded kernel in blocks of several sizes).
Which is fastest depends on the machine: a CPU whose matrix unit multiplies bfloat16 (Intel AMX)
favours a few large products, where a CPU without one favours the separable route's fewer
operations; the best block of images depends on the caches. Rules tuned on one machine are wrong
on another, so, as cuDNN's benchmark mode, oneDNN and Triton's autotuner pick kernels,
[`RouteSelector.choose`][] times the candidate routes briefly on the real tensors the first time
a key is seen, keeps the fastest and answers from its cache afterwards.

A key is the route family, the shapes and options the routes' speed depends on, the dtype they
compute in, whether a backward pass follows, the device and torch's threads. Each candidate is
timed as it runs: its forward pass, and where gradients are wanted its backward pass too (on
detached copies of the inputs, so nothing reaches the model's ``.grad``), one untimed warm-up run
and then timed rounds in which the candidates alternate, the best run of each counting (on a CPU
with one thread in CPU time, else in wall-clock time: ``default_clock``). The rounds race the
candidates: after each, those slower than ``1 + CONTENDER_MARGIN`` times the best so far drop
out, and rounds go on among the rest until one is left, or at least ``MIN_ROUNDS`` rounds have
run and the timed runs have taken ``MEASURE_SECONDS``, or ``max_rounds`` have run. One run of
the same route varies by 10–15% on a shared virtual machine, so near-equal routes get several
rounds (a single round picked one 7% slower than the fastest, measured), and clearly slower ones
cost one. The random number
generators are restored afterwards, so the timing draws no dropout masks that the run would
otherwise have drawn. Every route is exact (the tests hold each to a float64 reference), so the
choice changes results by float rounding only.

Settings:

- ``ATTNCONV_ROUTE_TIMING=off`` (or ``configure(timing=False)``) takes the rule-based route of
  each family instead: the rules the layers had before, tuned on the machines their docstrings
  name. The test suite runs so, pinning routes where it compares bits.
- Under ``torch.compile``, ``torch.export`` or TorchScript tracing the rule-based route runs (a
  measurement would be traced); under a dispatch mode (``FlopCounterMode``, fake tensors) and on
  the meta device a choice already made is used, else the rule, and nothing is measured.
- ``ATTNCONV_ROUTE_CACHE=PATH`` (or ``configure(cache_file=PATH)``, or the ``cache_file`` context
  that ``attnconv train`` opens on its run folder's ``routes.json``) keeps the choices in a JSON
  file (in a folder that exists), keyed by ``attnconv.hardware.machine_key()``: a later process
  on the same machine reads them instead of measuring again (a resumed training run takes the
  routes it took, so its weights stay bit-identical), and a different machine measures its own.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from attnconv import hardware
from attnconv.errors import UserError
from attnconv.runs import FileFormatError, read_json, write_json

TIMING_ENV = "ATTNCONV_ROUTE_TIMING"
"""Environment variable: ``off`` (also ``0``, ``false``, ``no``) takes the rule-based routes."""
CACHE_ENV = "ATTNCONV_ROUTE_CACHE"
"""Environment variable: a JSON file that keeps the choices across processes."""
CACHE_VERSION = 1
"""Version of the cache file's layout (``{"version", "machines": {machine: {key: choice}}}``)."""
MEASURE_SECONDS = 3.0
"""Timed runs of one measurement after which no further round starts (once ``MIN_ROUNDS`` have
run): candidates of milliseconds get up to the selector's ``max_rounds``, candidates of seconds
``MIN_ROUNDS`` among those still in the race."""
MIN_ROUNDS = 3
"""Rounds the candidates still in the race run at least (unless one is left)."""
CONTENDER_MARGIN = 0.25
"""After each round a candidate whose best run is slower than ``1 + CONTENDER_MARGIN`` times the
best so far leaves the race: more than the spread of one route's runs (10–15% here)."""


@dataclass(frozen=True)
class Choice:
    """The route a key takes: ``route``, the best seconds of each candidate as measured, and
    where the choice came from: ``"measured"`` (in this process) or ``"cache"`` (a cache file)."""

    route: str
    seconds: dict[str, float]
    source: str = "measured"


def _false(value: str) -> bool:
    return value.strip().lower() in ("off", "0", "false", "no")


def traced() -> bool:
    """True under ``torch.compile``, ``torch.export`` or TorchScript: a measurement would be
    traced, so only the rule applies."""
    if hasattr(torch.compiler, "is_compiling"):  # torch >= 2.3
        compiling = torch.compiler.is_compiling()
    else:
        compiling = torch._dynamo.is_compiling()
    return compiling or torch.jit.is_tracing() or torch.jit.is_scripting()


def in_dispatch_mode() -> bool:
    """True inside a dispatch mode (``FlopCounterMode``, fake tensors): a measurement would run
    through it (and be counted), so nothing is measured there."""
    return torch._C._len_torch_dispatch_stack() > 0


def autocast_dtype(tensor: torch.Tensor) -> torch.dtype:
    """The dtype matrix products of ``tensor`` run in here: autocast's where it is on (and
    ``tensor`` is not float64), else ``tensor``'s own."""
    device_type = tensor.device.type
    autocasts = device_type != "meta" and torch.is_autocast_enabled(device_type)
    if autocasts and tensor.dtype != torch.float64:
        return torch.get_autocast_dtype(device_type)
    return tensor.dtype


def route_key(
    family: str,
    shape: Mapping[str, object],
    dtype: torch.dtype,
    needs_grad: bool,
    device: torch.device,
) -> str:
    """The key a choice is kept under: the family, ``shape`` (what the routes' speed depends on,
    as ``name=value``), the dtype, ``fwd+bwd`` or ``no-grad``, the device and torch's threads."""
    parts = [family, *(f"{name}={value}" for name, value in shape.items())]
    parts += [str(dtype).removeprefix("torch."), "fwd+bwd" if needs_grad else "no-grad"]
    parts += [device_name(device), f"{torch.get_num_threads()} threads"]
    return " ".join(parts)


def trial(
    route: Callable[..., torch.Tensor],
    tensors: Sequence[torch.Tensor | None],
    leaves: Iterable[torch.Tensor],
    needs_grad: bool,
) -> Callable[[], None]:
    """A call that runs ``route(*copies)`` once, for timing: ``copies`` are ``tensors`` detached
    (requiring gradients as they do), and with ``needs_grad`` the backward pass follows, to the
    copies and ``leaves`` (parameters) by ``torch.autograd.grad``, so no ``.grad`` changes and
    the graph of the real forward pass is not touched."""
    leaves = list(leaves)

    def run() -> None:
        copies = [None if t is None else t.detach().requires_grad_(t.requires_grad)
                  for t in tensors]
        out = route(*copies)
        if needs_grad:
            wanted = [t for t in (*copies, *leaves) if t is not None and t.requires_grad]
            torch.autograd.grad(out, wanted, grad_outputs=out.detach(), allow_unused=True)

    return run


def device_name(device: torch.device) -> str:
    """The device part of a key: ``cpu``, or ``cuda NAME`` (a GPU model is its own entry)."""
    if device.type == "cuda":
        return f"cuda {torch.cuda.get_device_name(device)}"
    return device.type


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def default_clock(device: torch.device) -> Callable[[], float]:
    """The clock routes are timed with on ``device``: on a CPU running one torch thread this
    process's CPU time (the time on the core; waiting for a core shared with other work does not
    count), else wall-clock time (with several threads, how well a route spreads over them is
    part of its speed)."""
    if device.type == "cpu" and torch.get_num_threads() == 1:
        return time.process_time
    return time.perf_counter


class RouteSelector:
    """Measures the candidate routes of a key once and answers with the fastest afterwards.

    Args:
        clock: seconds; ``None`` (the default) takes ``default_clock`` of the device measured
            on (tests pass a fake one).
        max_rounds: the most timed rounds of one measurement after the warm-up (the best run of
            each candidate counts; ``MIN_ROUNDS`` and ``MEASURE_SECONDS`` decide how many run).
    """

    def __init__(self, clock: Callable[[], float] | None = None, max_rounds: int = 7) -> None:
        self.clock = clock
        self.max_rounds = max_rounds
        self.timing: bool | None = None  # None: the environment decides (TIMING_ENV)
        self.cache_path: Path | None = None  # None: the environment's (CACHE_ENV), if any
        self._choices: dict[tuple[Path | None, str], Choice] = {}
        self._files: dict[Path, dict[str, dict]] = {}  # cache file -> its entries for this machine

    # ------------------------------------------------------------------ settings

    def timing_enabled(self) -> bool:
        """Whether keys are measured (``timing``, else ``ATTNCONV_ROUTE_TIMING``; default on)."""
        if self.timing is not None:
            return self.timing
        return not _false(os.environ.get(TIMING_ENV, "on"))

    def current_file(self) -> Path | None:
        """The file the choices are kept in (``cache_path``, else ``ATTNCONV_ROUTE_CACHE``)."""
        if self.cache_path is not None:
            return self.cache_path
        value = os.environ.get(CACHE_ENV, "").strip()
        return Path(value).expanduser() if value else None

    # ------------------------------------------------------------------ choosing

    def choose(
        self,
        key: str,
        candidates: Mapping[str, Callable[[], object]],
        rule: str,
        device: torch.device,
    ) -> str:
        """The route ``key`` takes, a name in ``candidates``.

        ``candidates`` maps each route's name to a call that runs it once on the real inputs
        (forward, and backward where the key says so); ``rule`` is the rule-based choice, taken
        with timing off and under tracing. The first time ``key`` is seen each candidate is
        timed (module docstring); afterwards the choice comes from memory or the cache file.
        """
        if rule not in candidates:
            raise ValueError(f"rule {rule!r} is not among the candidates {list(candidates)}")
        if len(candidates) == 1 or not self.timing_enabled() or traced():
            return rule
        known = self.choice(key, candidates)
        if known is not None:
            return known.route
        if device.type == "meta" or in_dispatch_mode():
            return rule
        choice = self._measure(candidates, device)
        self._remember(key, choice)
        return choice.route

    def choice(self, key: str, candidates: Mapping[str, object] | None = None) -> Choice | None:
        """The choice made for ``key`` in this process or kept in the cache file, or ``None``
        (also where the cached route is not among ``candidates``: code that changed)."""
        path = self.current_file()
        known = self._choices.get((path, key))
        if known is None and path is not None:
            entry = self._entries(path).get(key)
            if entry is not None:
                known = Choice(entry["route"], dict(entry.get("seconds", {})), "cache")
                self._choices[path, key] = known
        if known is not None and candidates is not None and known.route not in candidates:
            return None
        return known

    def forget(self) -> None:
        """Drop every choice held in memory (the cache file keeps its own)."""
        self._choices.clear()
        self._files.clear()

    def _measure(
        self, candidates: Mapping[str, Callable[[], object]], device: torch.device
    ) -> Choice:
        """Best seconds of each candidate: one warm-up run each, then the race of timed rounds
        (module docstring) in which the order rotates each round, with the random number
        generators restored afterwards. A candidate that left the race keeps its best so far."""
        names = list(candidates)
        devices = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            for name in names:
                self._time(candidates[name], device)
            best = dict.fromkeys(names, float("inf"))
            racing, spent, rounds = names, 0.0, 0
            while len(racing) > 1 and rounds < self.max_rounds and (
                rounds < MIN_ROUNDS or spent < MEASURE_SECONDS
            ):
                shift = rounds % len(racing)
                for name in racing[shift:] + racing[:shift]:
                    seconds = self._time(candidates[name], device)
                    spent += seconds
                    best[name] = min(best[name], seconds)
                rounds += 1
                leader = min(best[name] for name in racing)
                racing = [name for name in racing
                          if best[name] <= (1 + CONTENDER_MARGIN) * leader]
        route = min(names, key=best.__getitem__)  # the first of equals: the candidates' order
        return Choice(route, best)

    def _time(self, run: Callable[[], object], device: torch.device) -> float:
        clock = self.clock or default_clock(device)
        _synchronize(device)
        started = clock()
        run()
        _synchronize(device)
        return clock() - started

    # ------------------------------------------------------------------ the cache file

    def _entries(self, path: Path) -> dict[str, dict]:
        """This machine's entries of the cache file ``path`` (read once; {} if it is missing)."""
        if path not in self._files:
            self._files[path] = _read_cache(path).get(hardware.machine_key(), {})
        return self._files[path]

    def _remember(self, key: str, choice: Choice) -> None:
        path = self.current_file()
        self._choices[path, key] = choice
        if path is None:
            return
        entry = {"route": choice.route, "seconds": choice.seconds}
        self._entries(path)[key] = entry
        cache = _read_cache(path)  # another process may have added keys meanwhile
        cache.setdefault(hardware.machine_key(), {})[key] = entry
        try:
            write_json(path, {"version": CACHE_VERSION, "machines": cache})
        except OSError as err:
            raise UserError(f"cannot write the route cache {path}: {err.strerror or err}") from err


def _read_cache(path: Path) -> dict[str, dict[str, dict]]:
    """``{machine: {key: {"route", "seconds"}}}`` of the cache file ``path`` ({} if missing);
    UserError naming the file if it is not a route cache (it is never overwritten then)."""
    try:
        value = read_json(path, "route cache", fields={"version": int, "machines": dict})
    except FileNotFoundError:
        return {}
    except FileFormatError as err:
        raise UserError(f"{err} (a route cache, {CACHE_ENV}; remove it or give another)") from err
    if value["version"] != CACHE_VERSION:
        raise UserError(
            f"route cache {path} has version {value['version']}, this attnconv writes "
            f"{CACHE_VERSION}; remove it or give another ({CACHE_ENV})"
        )
    machines = value["machines"]
    for machine, entries in machines.items():
        if not isinstance(entries, dict) or not all(
            isinstance(entry, dict) and isinstance(entry.get("route"), str)
            for entry in entries.values()
        ):
            raise UserError(f"route cache {path}: the entries of {machine!r} are not choices")
    return machines


SELECTOR = RouteSelector()
"""The selector the layers ask."""


def configure(timing: bool | None = None, cache_file: str | Path | None = None) -> None:
    """Set the selector's settings for this process: ``timing`` (``False``: the rule-based routes;
    ``None``: ``ATTNCONV_ROUTE_TIMING`` decides) and ``cache_file`` (``None``:
    ``ATTNCONV_ROUTE_CACHE`` decides)."""
    SELECTOR.timing = timing
    SELECTOR.cache_path = None if cache_file is None else Path(cache_file).expanduser()


@contextmanager
def cache_file(path: str | Path) -> Iterator[None]:
    """Keep the choices made within the block in ``path`` (unless ``ATTNCONV_ROUTE_CACHE`` or
    ``configure`` named a file), and take those it holds: a training run's ``routes.json``."""
    if SELECTOR.cache_path is not None or os.environ.get(CACHE_ENV, "").strip():
        yield
        return
    SELECTOR.cache_path = Path(path)
    try:
        yield
    finally:
        SELECTOR.cache_path = None
