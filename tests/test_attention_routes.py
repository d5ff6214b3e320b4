"""attention/routes.py: the fastest route by measurement (a fake clock here), its caches in memory
and on disk keyed by the machine, and the rule where timing is off or would be traced."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from attention_reference import rel_err
from attnconv import MultiHeadSelfAttention2d, hardware
from attnconv.attention import content, routes
from attnconv.errors import UserError
from route_helpers import pinned_route

pytestmark = pytest.mark.usefixtures("one_thread")
CPU = torch.device("cpu")


class FakeClock:
    """Seconds that pass only when a candidate says it took them."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def timed_candidates(clock: FakeClock, costs: dict[str, float], calls: list[str]) -> dict:
    """Candidates that record their name and advance ``clock`` by their cost."""

    def candidate(name: str):
        def run() -> None:
            calls.append(name)
            clock.now += costs[name]

        return run

    return {name: candidate(name) for name in costs}


@pytest.fixture
def selector(monkeypatch) -> routes.RouteSelector:
    """A fresh selector with timing on, a fake clock and no cache file, as the layers' own."""
    monkeypatch.delenv(routes.CACHE_ENV, raising=False)
    chosen = routes.RouteSelector(clock=FakeClock())
    chosen.timing = True
    monkeypatch.setattr(routes, "SELECTOR", chosen)
    return chosen


def test_the_fastest_candidate_is_chosen_once_and_then_served_from_memory(selector) -> None:
    calls: list[str] = []
    costs = {"a": 0.75, "b": 0.25, "c": 0.5}  # seconds, exact in binary
    candidates = timed_candidates(selector.clock, costs, calls)
    assert selector.choose("key", candidates, rule="a", device=CPU) == "b"
    # one warm-up run each, then one round: "a" and "c" are more than CONTENDER_MARGIN slower
    # than "b" and leave the race, which ends with one candidate left
    assert calls == ["a", "b", "c", "a", "b", "c"]
    assert selector.choice("key") == routes.Choice("b", costs)
    calls.clear()
    assert selector.choose("key", candidates, rule="a", device=CPU) == "b"
    assert calls == []  # cached
    # Another key is measured on its own: here "c" is fastest.
    other = timed_candidates(selector.clock, {"a": 3.0, "b": 4.0, "c": 2.0}, calls)
    assert selector.choose("other key", other, rule="a", device=CPU) == "c"


def test_the_best_run_counts_and_near_ties_race_more_rounds(selector) -> None:
    clock, calls = selector.clock, []
    # warm-up, then rounds: the warm-up does not count, the best run does; after round 1 "a" is
    # within the margin of "b" and stays, after round 2 "b" is not and leaves
    steps = {"a": iter([1.0, 0.3, 0.125]), "b": iter([0.25, 0.25, 0.375])}

    def candidate(name):
        def run():
            calls.append(name)
            clock.now += next(steps[name])

        return run

    assert selector.choose("key", {n: candidate(n) for n in steps}, "b", CPU) == "a"
    assert selector.choice("key").seconds == {"a": 0.125, "b": 0.25}
    assert calls == ["a", "b", "a", "b", "b", "a"]  # the order rotates each round
    calls.clear()
    # Candidates of seconds within the margin of each other: MIN_ROUNDS rounds, no more (the
    # timed runs took more than MEASURE_SECONDS)
    slow = timed_candidates(clock, {"a": 1.5, "b": 1.25}, calls)
    assert selector.choose("slow key", slow, "a", CPU) == "b"
    assert len(calls) == 2 * (1 + routes.MIN_ROUNDS)
    calls.clear()
    # Of milliseconds: max_rounds rounds fit MEASURE_SECONDS
    fast = timed_candidates(clock, {"a": 0.0625, "b": 0.0703125}, calls)
    assert selector.choose("fast key", fast, "b", CPU) == "a"
    assert len(calls) == 2 * (1 + selector.max_rounds)
    calls.clear()
    # A clearly slower candidate runs once after its warm-up; the close two race on
    race = timed_candidates(clock, {"a": 1.0, "b": 0.25, "c": 0.3}, calls)
    assert selector.choose("race key", race, "a", CPU) == "b"
    assert calls.count("a") == 2
    assert calls.count("b") == calls.count("c") >= 1 + routes.MIN_ROUNDS


def test_timing_off_takes_the_rule_and_runs_no_candidate(selector, monkeypatch) -> None:
    calls: list[str] = []
    candidates = timed_candidates(selector.clock, {"a": 3.0, "b": 1.0}, calls)
    selector.timing = None  # the environment decides
    monkeypatch.setenv(routes.TIMING_ENV, "off")
    assert selector.choose("key", candidates, rule="a", device=CPU) == "a"
    monkeypatch.setenv(routes.TIMING_ENV, "on")
    selector.timing = False
    assert selector.choose("key", candidates, rule="a", device=CPU) == "a"
    assert calls == [] and selector.choice("key") is None
    with pytest.raises(ValueError, match="rule 'z' is not among the candidates"):
        selector.choose("key", candidates, rule="z", device=CPU)


@pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated")
def test_under_tracing_the_rule_runs_and_in_a_dispatch_mode_nothing_is_measured(selector) -> None:
    calls: list[str] = []
    candidates = timed_candidates(selector.clock, {"a": 3.0, "b": 1.0}, calls)

    def chosen(x: torch.Tensor) -> torch.Tensor:
        return x + (1.0 if selector.choose("key", candidates, "a", CPU) == "a" else 2.0)

    compiled = torch.compile(chosen, backend="eager", fullgraph=True)  # dynamo traces it
    assert compiled(torch.zeros(2)).tolist() == [1.0, 1.0] and calls == []
    traced = torch.jit.trace(chosen, torch.zeros(2), check_trace=False)
    assert traced(torch.zeros(2)).tolist() == [1.0, 1.0] and calls == []
    with FlopCounterMode(display=False):
        assert selector.choose("key", candidates, "a", CPU) == "a"
    assert calls == [] and selector.choice("key") is None
    assert selector.choose("key", candidates, "a", CPU) == "b"  # measured outside the mode
    calls.clear()
    with FlopCounterMode(display=False):  # a choice already made holds there
        assert selector.choose("key", candidates, "a", CPU) == "b"
    assert compiled(torch.zeros(2)).tolist() == [1.0, 1.0]  # compiled: still the rule
    assert calls == []


def test_the_measurement_leaves_the_random_numbers_as_they_were(selector) -> None:
    def draws() -> None:
        torch.rand(100)
        selector.clock.now += 1.0

    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    selector.choose("key", {"a": draws, "b": draws}, "a", CPU)
    assert torch.equal(torch.rand(3), expected)


def test_a_cached_choice_survives_a_restart_keyed_by_the_machine(
    selector, tmp_path, monkeypatch
) -> None:
    """A fresh selector (a new process) with the same cache file takes the choice without
    measuring; on another machine it measures its own, kept beside the first."""
    path = tmp_path / "routes.json"
    monkeypatch.setenv(routes.CACHE_ENV, str(path))
    monkeypatch.setattr(hardware, "machine_key", lambda: "machine A")
    calls: list[str] = []
    candidates = timed_candidates(selector.clock, {"a": 3.0, "b": 1.0}, calls)
    assert selector.choose("key", candidates, "a", CPU) == "b" and calls
    saved = json.loads(path.read_text())
    assert saved == {
        "version": routes.CACHE_VERSION,
        "machines": {"machine A": {"key": {"route": "b", "seconds": {"a": 3.0, "b": 1.0}}}},
    }

    restarted = routes.RouteSelector(clock=FakeClock())
    restarted.timing = True
    calls.clear()
    assert restarted.choose("key", candidates, "a", CPU) == "b" and calls == []
    assert restarted.choice("key").source == "cache"

    monkeypatch.setattr(hardware, "machine_key", lambda: "machine B")
    elsewhere = routes.RouteSelector(clock=restarted.clock)
    elsewhere.timing = True
    slower_b = timed_candidates(restarted.clock, {"a": 1.0, "b": 3.0}, calls)
    assert elsewhere.choose("key", slower_b, "a", CPU) == "a" and calls
    machines = json.loads(path.read_text())["machines"]
    assert machines["machine A"]["key"]["route"] == "b"
    assert machines["machine B"]["key"]["route"] == "a"
    # A cached route that is no longer a candidate (the code changed) is measured again.
    calls.clear()
    renamed = timed_candidates(restarted.clock, {"c": 0.25, "d": 0.125}, calls)
    assert elsewhere.choose("key", renamed, "c", CPU) == "d" and calls


def test_a_file_that_is_not_a_route_cache_is_named_and_left_alone(selector, tmp_path) -> None:
    path = tmp_path / "routes.json"
    path.write_text('{"something": "else"}\n')
    routes.configure(timing=True, cache_file=path)
    try:
        with pytest.raises(UserError, match=r"route cache .*routes\.json.*version"):
            routes.SELECTOR.choose("key", {"a": lambda: None, "b": lambda: None}, "a", CPU)
    finally:
        routes.configure()
    assert path.read_text() == '{"something": "else"}\n'


def test_a_training_runs_cache_file_holds_its_choices(selector, tmp_path) -> None:
    calls: list[str] = []
    candidates = timed_candidates(selector.clock, {"a": 3.0, "b": 1.0}, calls)
    with routes.cache_file(tmp_path / "routes.json"):
        assert selector.choose("key", candidates, "a", CPU) == "b"
    assert selector.current_file() is None
    machines = json.loads((tmp_path / "routes.json").read_text())["machines"]
    assert machines[hardware.machine_key()]["key"]["route"] == "b"


def test_the_key_names_shapes_dtype_mode_device_and_threads() -> None:
    key = routes.route_key("position", {"batch": 2, "height": 5}, torch.bfloat16, True, CPU)
    assert key == f"position batch=2 height=5 bfloat16 fwd+bwd cpu {torch.get_num_threads()} threads"
    x = torch.zeros(2)
    assert routes.autocast_dtype(x) == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert routes.autocast_dtype(x) == torch.bfloat16
        assert routes.autocast_dtype(x.double()) == torch.float64


# ---------------------------------------------------------------- the layers ask the selector


def spy_routes(monkeypatch, clock: FakeClock, costs: dict[str, float]) -> list[str]:
    """Make each position-only route of MultiHeadSelfAttention2d advance ``clock`` by its cost
    (``"shared"``, ``"separable"``, ``"per head"``) and record its runs."""
    ran: list[str] = []
    for method, name in (("_forward_shared", "shared"), ("_forward_separable", None)):
        original = getattr(MultiHeadSelfAttention2d, method)

        def wrapped(self, *args, original=original, name=name, **kwargs):
            route = name or ("separable" if kwargs["chunk"] is None else "per head")
            ran.append(route)
            clock.now += costs[route]
            return original(self, *args, **kwargs)

        monkeypatch.setattr(MultiHeadSelfAttention2d, method, wrapped)
    return ran


@pytest.mark.parametrize("fastest", ["shared", "separable", "per head"])
def test_a_layer_takes_the_route_measured_fastest_and_its_result_is_that_routes(
    selector, monkeypatch, fastest
) -> None:
    costs = dict.fromkeys(("shared", "separable", "per head"), 5.0) | {fastest: 1.0}
    ran = spy_routes(monkeypatch, selector.clock, costs)
    torch.manual_seed(0)
    layer = MultiHeadSelfAttention2d(6, 3, positional="gaussian", max_size=8).double()
    x = torch.randn(2, 4, 5, 6, dtype=torch.float64, requires_grad=True)
    y = layer(x)
    assert len(ran) > 3 and ran[-1] == fastest  # measured, then run
    assert all(p.grad is None for p in layer.parameters()) and x.grad is None  # trials: no .grad
    y.sum().backward()
    ran.clear()
    y_again = layer(x)
    assert ran == [fastest]  # cached
    [key] = [key for _, key in selector._choices]
    assert key.startswith("position batch=2 height=4 width=5 dim=6 heads=3") and "fwd+bwd" in key
    with pinned_route("separable" if fastest != "separable" else "shared"):
        other = layer(x)
    assert torch.equal(y, y_again) and rel_err(other, y) < 1e-12  # exact on every route
    with torch.no_grad():  # a key of its own
        layer(x)
    assert len(selector._choices) == 2


def test_the_content_kernel_asks_the_selector_with_its_own_candidates(
    selector, monkeypatch
) -> None:
    """Without gradients and probabilities SDPA's fused kernel is a candidate beside the folded
    kernel's block sizes; with the probabilities only the folded kernel is. Block sizes that cut
    the batch alike are one candidate. Every candidate gives the layer's function (float64)."""
    # 20 tokens: 400 entries per (image, head); an L2 cache of 1600 bytes holds 400 float32
    # entries, so the blocks measured hold 100, 400 and 1600 entries: one slice (twice), four,
    # and the rule's BLOCK_ENTRIES all six of 3 images × 2 heads.
    monkeypatch.setattr(hardware, "cache_bytes", lambda level: 1600)
    torch.manual_seed(0)
    layer = MultiHeadSelfAttention2d(8, 2, positional="learned", content=True, max_size=6).double()
    x = torch.randn(3, 4, 5, 8, dtype=torch.float64)
    with torch.no_grad():
        y = layer(x)
        _, probs = layer(x, return_attention=True)
    plain, with_probs = (selector.choice(key) for _, key in selector._choices)
    keys = [key for _, key in selector._choices]
    assert keys[0].startswith("content batch=3 heads=2 tokens=20 query=8 folded=0")
    assert "probs=False" in keys[0] and "probs=True" in keys[1] and "no-grad" in keys[0]
    folded = [f"folded, blocks of {budget}" for budget in (100, 1600, content.BLOCK_ENTRIES)]
    assert list(plain.seconds) == ["fused", *folded] and list(with_probs.seconds) == folded
    layer.impl = "dense"
    y_ref, probs_ref = layer(x, return_attention=True)
    layer.impl = "auto"
    assert rel_err(y, y_ref) < 1e-12 and rel_err(probs, probs_ref) < 1e-12
    for name in plain.seconds:
        with pinned_route(name), torch.no_grad():
            assert rel_err(layer(x), y_ref) < 1e-12, name


def test_a_cache_file_in_a_missing_folder_is_refused_in_one_line(selector, tmp_path) -> None:
    calls: list[str] = []
    candidates = timed_candidates(selector.clock, {"a": 0.25, "b": 0.125}, calls)
    with routes.cache_file(tmp_path / "gone" / "routes.json"), pytest.raises(
        UserError, match=r"cannot write the route cache .*gone/routes\.json"
    ):
        selector.choose("key", candidates, "a", CPU)


def test_a_training_run_keeps_its_routes_and_its_resume_takes_them(
    selector, tmp_path, monkeypatch
) -> None:
    """The routes a run measured are in its routes.json; resumed in a new process (a selector
    that remembers nothing), it takes them from there and measures only keys it meets for the
    first time (the test set, evaluated at the end), so its weights are those of the
    uninterrupted run."""
    from attnconv.train.config import resolve_config
    from attnconv.train.loop import ROUTES_FILE, train
    from train_helpers import QUIET, TINY

    run = tmp_path / "run"
    train(resolve_config("quick", overrides=["epochs=2", *TINY, *QUIET]), run, stop_after=1)
    entries = json.loads((run / ROUTES_FILE).read_text())["machines"][hardware.machine_key()]
    keys = [key for key in entries if key.startswith("position batch=64 height=8 width=8")]
    assert {"fwd+bwd" in key for key in keys} == {True, False}  # training, and validation
    selector.forget()
    measured: list[str] = []
    remember = selector._remember
    monkeypatch.setattr(selector, "_remember",
                        lambda key, choice: (measured.append(key), remember(key, choice)))
    train(None, run, resume=True)
    assert measured and not set(measured) & set(entries)
    after = json.loads((run / ROUTES_FILE).read_text())["machines"][hardware.machine_key()]
    assert after == {**entries, **{key: after[key] for key in measured}}
