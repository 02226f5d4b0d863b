"""Adapter slots under pressure on the simulated model (scheduler_simulation.py): a request whose
adapter has no slot neither blocks others nor starves."""
from __future__ import annotations

import random

from scheduler_simulation import VOCAB, NoReservationSlotTable, Simulation, Spec, play, unconstrained_outputs

from loraloom.engine.config import EngineConfig
from loraloom.engine.lora.slots import AdapterSlotTable
from loraloom.engine.request import RequestStatus


# --------------------------------------------------------------------------- adapter slots
def test_slot_blocked_request_does_not_block_base_or_other_resident_adapters():
    config = EngineConfig(block_size=4, num_kv_blocks=256, max_num_seqs=64, max_num_batched_tokens=256, max_loras=3)
    simulation = Simulation(config)
    # Fill the three slots; "a" is acquired first, so it is the slot to drain.
    simulation.add("a1", [1, 2, 3], max_tokens=4, adapter="a")
    simulation.add("b1", [1, 2, 3], max_tokens=20, adapter="b")
    simulation.add("c1", [1, 2, 3], max_tokens=20, adapter="c")
    simulation.step()
    blocked = simulation.add("d1", [4, 5, 6], max_tokens=3, adapter="d")
    base = simulation.add("base1", [4, 5, 6], max_tokens=3)
    resident = simulation.add("c2", [4, 5, 6], max_tokens=3, adapter="c")
    draining = simulation.add("a2", [4, 5, 6], max_tokens=3, adapter="a")
    simulation.step()
    assert base.status is RequestStatus.RUNNING and resident.status is RequestStatus.RUNNING
    assert blocked.status is RequestStatus.WAITING
    assert draining.status is RequestStatus.WAITING, "admitted onto the slot the blocked request waits for"
    while blocked.status is RequestStatus.WAITING:
        simulation.step()
    # d1 took a's slot the step after a's last running request finished.
    assert simulation.admitted_at["d1"] == simulation.finished_at["a1"] + 1
    assert simulation.slot_table.lookup("a@v1") is None and simulation.slot_table.lookup("d@v1") is not None
    simulation.run_to_completion(max_steps=100)




def run_three_endless_streams(slot_table: AdapterSlotTable, stream_steps: int) -> tuple[Simulation, list[int]]:
    """Three adapters fill the three slots with a new request every step until `stream_steps`; one
    request for a fourth adapter, "x", arrives at step 3. Returns the simulation and, for each
    stream step in which x was still waiting, how many of that step's three newcomers were admitted."""
    config = EngineConfig(block_size=4, num_kv_blocks=512, max_num_seqs=128, max_num_batched_tokens=512, max_loras=3)
    simulation = Simulation(config, slot_table)
    newcomers_admitted_while_x_waits = []
    while simulation.step_index < stream_steps or simulation.scheduler.has_unfinished():
        assert simulation.step_index < stream_steps + 200
        step = simulation.step_index
        if step >= stream_steps:
            simulation.step()
            continue
        newcomers = [simulation.add(f"{key}{step}", [1, 2, 3, step % 9 + 1], 4, key) for key in ("a", "b", "c")]
        if step == 3:
            simulation.add("x", [9, 9, 9], max_tokens=4, adapter="x")
        simulation.step()
        if step >= 3 and "x" not in simulation.admitted_at:
            newcomers_admitted_while_x_waits.append(sum(r.request_id in simulation.admitted_at for r in newcomers))
    simulation.assert_everything_released()
    return simulation, newcomers_admitted_while_x_waits


def test_slot_blocked_request_is_served_despite_endless_streams_on_every_slot():
    longest = 4 + 4  # prompt + max_tokens of every stream request: steps a running request needs at most
    simulation, newcomers_admitted = run_three_endless_streams(AdapterSlotTable(3), stream_steps=60)
    assert simulation.admitted_at["x"] - simulation.added_at["x"] <= longest + 1
    # While x waited, only the draining adapter's newcomers were held back.
    assert newcomers_admitted and min(newcomers_admitted) == 2
    # The contrast: without the reservation the same workload starves x until the streams stop.
    naive, _ = run_three_endless_streams(NoReservationSlotTable(3), stream_steps=60)
    assert naive.admitted_at["x"] >= 60


def test_slot_pressure_ten_adapters_three_slots_every_request_within_its_bound():
    rng = random.Random(11)
    config = EngineConfig(block_size=4, num_kv_blocks=400, max_num_seqs=64, max_num_batched_tokens=256, max_loras=3)
    cold = [f"cold{i}" for i in range(9)]
    specs = []
    for index in range(40):  # one arrival per step; every third request is for the hot adapter
        adapter = "hot" if index % 3 == 0 else (None if index % 7 == 1 else rng.choice(cold))
        prompt = tuple(rng.randrange(1, VOCAB) for _ in range(rng.randrange(3, 13)))
        specs.append(Spec(f"s{index}", index, prompt, rng.randrange(2, 9), adapter))
    longest = max(len(spec.prompt) + spec.max_tokens for spec in specs)
    simulation = play(config, specs, max_steps=40 + 41 * (longest + 1))

    by_id = {spec.request_id: spec for spec in specs}
    for spec in specs:
        request_id = spec.request_id
        waiting_ahead = sum(1 for other in specs if other.arrival_step < spec.arrival_step
                            and simulation.admitted_at[other.request_id] >= spec.arrival_step)
        wait = simulation.admitted_at[request_id] - simulation.added_at[request_id]
        assert wait <= (waiting_ahead + 1) * (longest + 1), request_id
        if by_id[request_id].adapter is None:
            assert wait == 0, f"base request {request_id} was held back by slot-blocked requests"
    assert any(simulation.admitted_at[s.request_id] > s.arrival_step for s in specs), "no slot pressure happened"
    assert simulation.outputs() == unconstrained_outputs(config, specs)
