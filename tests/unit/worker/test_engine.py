"""The worker's step with in-process fakes: no gRPC, the real numerics, a tiny GPT-2.

Every test compares the streaming engine with the all-resident reference (``numerics.forward_backward``),
or with another configuration of itself, on the same weights and the same shard.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal

from tests.worker_fakes import MODEL, PARAMS, RAW, STEP, WEIGHTS, WORKERS, WTE, FakeBatches, FakeUnits, L
from weightstream.numerics import forward_backward, forward_loss
from weightstream.params import load_params
from weightstream.training.reference import ReferenceTrainer
from weightstream.worker.engine import BACKWARD, EVAL, FORWARD, StepOutcome, Tensors, WorkerEngine


def run_step(index: int = 0, **kw: Any) -> tuple[StepOutcome, FakeUnits]:
    units = FakeUnits(WEIGHTS)
    return step_of(units, index=index, **kw), units


def step_of(
    units: FakeUnits, batches: FakeBatches | None = None, model: Any = MODEL, index: int = 0, **kw: Any
) -> StepOutcome:
    """Step STEP of a worker engine over ``units`` and ``batches``, closed after."""
    engine = WorkerEngine(model, index, WORKERS, units, batches or FakeBatches(), **kw)
    try:
        return engine.run_step(STEP)
    finally:
        engine.close()


def reference(index: int) -> tuple[float, Tensors, int]:
    """(loss, gradients, target tokens) of worker ``index``'s shard, every weight resident."""
    x, y, _ = FakeBatches().get("train", STEP, index, WORKERS)
    loss, grads = forward_backward(MODEL, WEIGHTS, x, y, y.size * WORKERS)
    return loss, grads, y.size


def assert_same_grads(got: Tensors, want: Tensors, exact: bool = True) -> None:
    assert sorted(got) == sorted(want)
    for n in want:
        if exact:
            assert_array_equal(got[n], want[n], err_msg=n)
        else:  # float32 sums in another order
            assert_allclose(got[n], want[n], rtol=1e-5, atol=1e-7, err_msg=n)


@pytest.mark.parametrize("index", [0, 1])
def test_step_equals_forward_backward_on_the_workers_shard(index: int) -> None:
    """Loss and gradients of one step are exactly the reference's on this worker's shard."""
    outcome, units = run_step(index)
    loss, grads, tokens = reference(index)
    assert outcome.loss == loss and outcome.tokens == tokens
    assert outcome.recomputed_units == 0  # no budget: every unit kept its activations
    assert_same_grads(units.summed(), grads)


def test_shards_of_two_workers_add_up_to_the_reference_trainer() -> None:
    """The loss divides by the global batch's tokens, so the workers' parts sum to the full step."""
    parts = [run_step(i) for i in range(WORKERS)]
    loss, grads, _ = ReferenceTrainer(PARAMS, num_shards=WORKERS).gradients(STEP)
    assert sum(o.loss for o, _ in parts) == pytest.approx(loss, rel=1e-12)
    total: Tensors = {}
    for _, units in parts:
        for n, g in units.summed().items():
            total[n] = total[n] + g if n in total else g
    assert_same_grads(total, grads, exact=False)


def test_units_stream_forward_then_backward_reusing_the_last_one() -> None:
    """Forward fetches 0..L-1; backward fetches L-2..0: the last forward unit is the first backward
    one, kept rather than fetched again."""
    _, units = run_step()
    forward = [(STEP, u, FORWARD) for u in range(L)]
    backward = [(STEP, u, BACKWARD) for u in reversed(range(L - 1))]
    assert units.in_order() == forward + backward


def test_the_second_unit_is_asked_for_with_the_first_at_a_steps_start() -> None:
    """At a step's start both wait for MemoryX's update: unit 1's fetch goes out with unit 0's, not once
    unit 0 is here (then its round trip was a wait every step). Unit 0's fetch here waits for unit 1's
    to be asked for: it would wait out its 10 s if unit 1 came after it. No more than two units at once."""
    units = FakeUnits(WEIGHTS)
    second = threading.Event()
    waited: list[bool] = []
    get_unit = units.get_unit

    def unit(step: int, u: int, phase: int) -> Tensors:
        if (u, phase) == (1, FORWARD):
            second.set()
        if (u, phase) == (0, FORWARD):
            waited.append(second.wait(10))
        return get_unit(step, u, phase)

    units.get_unit = unit  # type: ignore[method-assign,assignment]  # the test's fetch in place of the fake's
    step_of(units)
    assert waited == [True], "unit 1 was asked for only after unit 0 had arrived"
    assert units.max_live == 2


def test_the_first_units_weights_are_asked_for_before_the_batch() -> None:
    """At a step's start the first unit waits for MemoryX's update: its fetch goes out first, and the
    batch arrives meanwhile instead of before it is even asked for."""
    order: list[str] = []
    units, batches = FakeUnits(WEIGHTS), FakeBatches()
    asked = threading.Event()
    get_unit, get_batch = units.get_unit, batches.get

    def unit(step: int, u: int, phase: int) -> Tensors:
        if not order:
            order.append("unit")
            asked.set()
        return get_unit(step, u, phase)

    def batch(*args: Any) -> Any:
        assert asked.wait(10), "the batch was asked for while no unit had been"
        order.append("batch")
        return get_batch(*args)

    units.get_unit, batches.get = unit, batch  # type: ignore[method-assign,assignment]  # the test's, in their place
    step_of(units, batches)
    assert order == ["unit", "batch"]


def test_backwards_first_streamed_unit_is_asked_for_before_backward_begins() -> None:
    """The last forward unit is kept for backward; the next one (L-2) is fetched while the loss and that
    unit's backward run, not when backward reaches it (then its whole fetch was a wait every step). The
    head's backward here waits for that fetch to be asked for: it would wait forever if it came after."""
    units = FakeUnits(WEIGHTS)
    asked = threading.Event()
    get_unit = units.get_unit

    def unit(step: int, u: int, phase: int) -> Tensors:
        if (u, phase) == (L - 2, BACKWARD):
            asked.set()
        return get_unit(step, u, phase)

    head = MODEL.units[L - 1]

    class WaitingHead:
        name, param_names = head.name, head.param_names

        def forward(self, *args: Any) -> Any:
            return head.forward(*args)

        def backward(self, *args: Any) -> Any:
            assert asked.wait(10), "backward began before its next unit was asked for"
            return head.backward(*args)

    model = dataclasses.replace(MODEL, units=(*MODEL.units[:-1], WaitingHead()))
    units.get_unit = unit  # type: ignore[method-assign,assignment]  # the test's fetch in place of the fake's
    step_of(units, model=model)
    assert (STEP, L - 2, BACKWARD) in units.fetches and units.max_live == 2


def test_gradients_go_up_once_per_unit_in_backward_order_one_per_use_of_the_tied_embedding() -> None:
    """Each unit pushes the gradient of exactly its own parameters, head first. The tied embedding is
    in two pushes (head and embedding, each its own contribution, not filtered by ownership): the
    receiver sums them, and the sum is the reference gradient."""
    _, units = run_step()
    _, grads, _ = reference(0)
    assert [u for _, u, _ in units.pushes] == list(reversed(range(L)))
    assert all(step == STEP for step, _, _ in units.pushes)
    for _, u, pushed in units.pushes:
        assert sorted(pushed) == sorted(MODEL.units[u].param_names)
    head, embedding = units.pushes[0][2], units.pushes[-1][2]
    assert WTE not in MODEL.owned_by(L - 1)  # the head uses the embedding but does not own it...
    assert_array_equal(head[WTE] + embedding[WTE], grads[WTE])  # ...and still pushes its share
    assert not np.array_equal(head[WTE], grads[WTE])  # a share, not the whole gradient


def budgets() -> list[tuple[int, int]]:
    """(budget, units recomputed): nothing kept; or only the embedding (its input ids and the same ids
    kept for its backward fit exactly), so kept and recomputed units meet in one backward."""
    ids, _, _ = FakeBatches().get("train", STEP, 0, WORKERS)
    weights = 2 * max(MODEL.unit_bytes(u) for u in range(L))  # the engine counts two units' weights first
    return [(1, L), (weights + 2 * ids.nbytes, L - 1)]


@pytest.mark.parametrize(("budget", "recomputed"), budgets())
def test_recompute_in_backward_gives_the_same_step(budget: int, recomputed: int) -> None:
    """Activations dropped for the budget are recomputed from the kept inputs: the step is unchanged."""
    outcome, units = run_step(memory_budget_bytes=budget)
    plain, plain_units = run_step()
    assert outcome.recomputed_units == recomputed
    assert outcome.loss == plain.loss
    assert_same_grads(units.summed(), plain_units.summed())
    assert units.in_order() == plain_units.in_order()  # recompute uses the weights streamed in anyway


@pytest.mark.parametrize("micro", [1, 2, 3])  # 3: a shard of 4 in uneven pieces
def test_micro_batches_accumulate_to_the_whole_shard(micro: int) -> None:
    """Micro-batches' gradients sum to the whole shard's; each unit still streams in once per pass."""
    outcome, units = run_step(micro_batch=micro)
    plain, plain_units = run_step()
    assert outcome.loss == pytest.approx(plain.loss, rel=1e-6)
    assert outcome.tokens == plain.tokens
    assert_same_grads(units.summed(), plain_units.summed(), exact=False)
    assert units.in_order() == plain_units.in_order()


def test_micro_batches_with_recompute_give_the_same_step() -> None:
    """Budget and micro-batches together: every (unit, micro-batch) is recomputed, from its own input."""
    outcome, units = run_step(micro_batch=2, memory_budget_bytes=1)
    plain, plain_units = run_step(micro_batch=2)
    assert outcome.recomputed_units == 2 * L
    assert outcome.loss == plain.loss
    assert_same_grads(units.summed(), plain_units.summed())


def test_pipelined_fetches_each_unit_once_and_is_bitwise_identical() -> None:
    """Pipelined keeps forward's weights for backward (no backward fetches), same bits as streaming."""
    outcome, units = run_step(pipelined=True)
    plain, plain_units = run_step()
    assert units.in_order() == [(STEP, u, FORWARD) for u in range(L)]
    assert outcome.loss == plain.loss
    assert [u for _, u, _ in units.pushes] == [u for _, u, _ in plain_units.pushes]
    assert_same_grads(units.summed(), plain_units.summed())


def test_streaming_holds_a_few_units_pipelined_holds_all() -> None:
    """Streaming bounds the weights alive whatever the depth; pipelined holds every unit.

    Two: the unit computing and the next, arriving. (The last unit of forward, kept for the first of
    backward, must be let go once backward has used it, or three stay alive.)"""
    _, streaming = run_step()
    _, pipelined = run_step(pipelined=True)
    assert streaming.max_live == 2 < L
    assert pipelined.max_live == L


@pytest.mark.parametrize("pipelined", [False, True])
def test_a_step_failing_part_way_lets_go_of_every_unit_it_held(
    monkeypatch: pytest.MonkeyPatch, pipelined: bool
) -> None:
    """A step that fails in its loss lets go of the units it held for backward (the last of forward, or
    every unit when pipelined) while the error and its traceback are still around, as they are for a
    caller that logs the error or decides on a retry. Backward's first fetch, on its way, is held back
    until after the check: it arrives into a step that no longer wants it."""
    import weightstream.worker.engine as engine_module

    units = FakeUnits(WEIGHTS)
    arrive = threading.Event()
    get_unit = units.get_unit

    def unit(step: int, u: int, phase: int) -> Tensors:
        if phase == BACKWARD:
            arrive.wait(10)  # set by the test once it has counted the live units
        return get_unit(step, u, phase)

    def loss(*args: Any, **kw: Any) -> Any:
        raise FloatingPointError("the loss overflowed")

    units.get_unit = unit  # type: ignore[method-assign,assignment]  # the test's fetch in place of the fake's
    monkeypatch.setattr(engine_module, "cross_entropy_forward", loss)
    try:
        with pytest.raises(FloatingPointError) as failed:
            step_of(units, pipelined=pipelined)
        assert failed.traceback  # still held
        assert units.live == 0
    finally:
        arrive.set()


@pytest.mark.parametrize("index", [0, 1])
def test_evaluate_equals_forward_loss_over_the_eval_shards(index: int) -> None:
    """Evaluate is the sum over eval batches 0..n-1 of this shard's loss (global-token denominator);
    each unit streams in once, in the eval phase."""
    n = 3
    units = FakeUnits(WEIGHTS)
    engine = WorkerEngine(MODEL, index, WORKERS, units, FakeBatches())
    try:
        got = engine.evaluate(STEP, n)
    finally:
        engine.close()
    want = 0.0
    for b in range(n):
        x, y, _ = FakeBatches().get("eval", b, index, WORKERS)
        want += forward_loss(MODEL, WEIGHTS, x, y, y.size * WORKERS)
    assert got == want  # the same operations in the same order
    assert units.fetches == [(STEP, u, EVAL) for u in range(L)]
    assert units.pushes == []


def test_evaluate_of_all_workers_is_the_reference_mean_times_batches() -> None:
    """Summed over workers and divided by the batches, it is ReferenceTrainer's eval loss."""
    n = 2
    total = 0.0
    for i in range(WORKERS):
        engine = WorkerEngine(MODEL, i, WORKERS, FakeUnits(WEIGHTS), FakeBatches())
        try:
            total += engine.evaluate(0, n)
        finally:
            engine.close()
    ref = ReferenceTrainer(load_params(RAW, overrides={"eval_steps": n}), num_shards=WORKERS)
    assert total / n == pytest.approx(ref.evaluate(), rel=1e-6)


def test_the_loss_writes_over_the_logits_in_training_and_evaluation(monkeypatch: pytest.MonkeyPatch) -> None:
    """No vocabulary-sized buffer of the loss's own (412 MB at GPT-2's vocabulary, B8 T256): the softmax,
    then the gradient, go over the logits, which nothing reads after the loss."""
    import weightstream.worker.engine as engine_module

    real = engine_module.cross_entropy_forward
    seen: list[bool] = []

    def spy(logits: np.ndarray, *args: Any, **kw: Any) -> Any:
        out = real(logits, *args, **kw)
        seen.append(np.shares_memory(out[1][0], logits))  # out: (loss, (probabilities, targets, denom))
        return out

    monkeypatch.setattr(engine_module, "cross_entropy_forward", spy)
    run_step(0)
    engine = WorkerEngine(MODEL, 0, WORKERS, FakeUnits(WEIGHTS), FakeBatches())
    try:
        engine.evaluate(STEP, 2)
    finally:
        engine.close()
    assert seen == [True] * 3  # the step's one micro-batch, then two eval batches
