"""The chaos soak (``benchmarks/soak_chaos.py``): its plan and judgements, and a short run behind the ``soak`` marker.

The plan, the books and the ledgers' judgement are plain code, tested here
in a moment; a sink and a teller run in an in-process world. The short run
(3 nodes, 30 s, faults of every kind the plan draws) starts real processes
and loads the machine, so it is marked ``soak`` and left out of the default
run: ``pytest -m soak tests/project/test_soak_chaos.py``.
"""

from __future__ import annotations

import json
import sys

import pytest
from _mp import REPO, run_argv

sys.path.insert(0, str(REPO / "benchmarks"))

from chaos.books import FLAT_MIB, LATE, Book, Fault, Late, Roster, memory_verdict
from chaos.plan import MIN_WORKERS, SETTLE, Plan, make_plan
from chaos.records import Entry, Loss
from chaos.roles import Sink, Teller
from chaos.soak import LedgerWatch

from actorch.testing import local_world

LIVENESS = 2.5


def plan_of(seed: int, seconds: float = 600.0, nodes: int = 5, netns: bool = True) -> Plan:
    return make_plan(seed, seconds, nodes, LIVENESS, 4.0, 10, netns)


def test_a_plan_is_the_same_for_the_same_seed_and_differs_for_another() -> None:
    assert plan_of(7) == plan_of(7)
    assert plan_of(7).events != plan_of(8).events


def test_a_plan_starts_with_a_kill_after_the_warm_up_and_ends_before_the_cool_down() -> None:
    for seed in range(20):
        plan = plan_of(seed, seconds=60.0, nodes=3)
        assert plan.events[0].kind == "kill"
        assert plan.events[0].at >= plan.warm_up
        assert plan.events[-1].at < plan.seconds - plan.cool_down


def test_a_plan_faults_only_live_settled_workers_and_replaces_every_node_it_removes() -> None:
    for seed in range(20):
        plan = plan_of(seed)
        live = dict.fromkeys(range(1, plan.nodes), -SETTLE)
        next_rank = plan.nodes
        for event in plan.events:
            if event.kind == "join":
                assert event.rank == next_rank  # ranks come in the order nodes join
                next_rank += 1
                live[event.rank] = event.at
                continue
            assert len(live) >= plan.nodes - 1, f"seed {seed}: {event} before the last removed node was replaced"
            assert event.rank != 0
            assert event.rank in live, f"seed {seed}: {event} targets a node that is gone"
            assert live[event.rank] + SETTLE <= event.at, f"seed {seed}: {event} targets a node still joining"
            if event.removes(LIVENESS):
                del live[event.rank]
                assert len(live) >= MIN_WORKERS
            assert len(live) <= plan.nodes
    kinds = {event.label(LIVENESS) for seed in range(5) for event in plan_of(seed).events}
    assert {"kill", "leave", "stop short", "stop long", "partition short", "partition long"} <= kinds
    assert {"cut short", "cut long", "join (add_nodes)", "join (serve)", "join (serve-netns)"} <= kinds


def test_a_plan_without_namespaces_neither_cuts_nor_joins_from_one() -> None:
    kinds = {event.label(LIVENESS) for seed in range(5) for event in plan_of(seed, netns=False).events}
    assert not {"cut short", "cut long", "join (serve-netns)"} & kinds


def test_the_faulty_transport_schedule_holds_exactly_the_planned_partitions() -> None:
    plan = plan_of(3)
    planned = [event for event in plan.events if event.kind == "partition"]
    partitions = plan.partitions()
    assert [(set(p.side), p.start, p.stop) for p in partitions] == [
        ({event.rank}, event.at, event.at + event.seconds) for event in planned
    ]


def roster_with(*faults: Fault) -> Roster:
    return Roster(LIVENESS, faults=list(faults))


def test_a_loss_of_a_node_the_soak_did_not_fault_breaks_the_losses_invariant() -> None:
    book = Book()
    roster_with(Fault(2, "kill", 100.0, None)).judge_loss(book, Loss(0, 3, "not heard from", 101.0))
    assert book.tallies["losses"].broken == 1
    assert "node 0 counted node 3 lost" in book.tallies["losses"].examples[0]


def test_a_loss_of_a_killed_node_or_one_stopped_long_holds() -> None:
    book = Book()
    roster = roster_with(Fault(2, "kill", 100.0, None), Fault(3, "stop", 100.0, None))
    roster.judge_loss(book, Loss(0, 2, "connection lost", 100.05))
    roster.judge_loss(book, Loss(1, 3, "not heard from", 500.0))  # a long stop is never over
    assert (book.tallies["losses"].checked, book.tallies["losses"].broken) == (2, 0)


def test_a_short_fault_excuses_a_loss_only_until_the_liveness_timeout_after_it() -> None:
    book = Book()
    roster = roster_with(Fault(2, "stop", 100.0, 101.0))
    roster.judge_loss(book, Loss(0, 2, "not heard from", 101.0 + LIVENESS))
    assert book.tallies["losses"].broken == 0
    roster.judge_loss(book, Loss(0, 2, "not heard from", 110.0))
    assert book.tallies["losses"].broken == 1


def test_a_loss_counted_by_a_node_cut_off_or_out_of_the_system_is_no_evidence() -> None:
    book = Book()
    roster = roster_with(Fault(4, "partition", 100.0, None))
    roster.lost_by_0[5] = 90.0
    roster.judge_loss(book, Loss(4, 1, "not heard from", 103.0))  # node 4 was cut off: it lost everyone
    roster.judge_loss(book, Loss(5, 1, "node 1 counts this node lost", 95.0))  # rank 0 had lost node 5
    assert book.tallies["losses"].checked == 0
    assert book.counts["losses counted by nodes out of the system"] == 2


def test_a_node_that_learns_of_a_loss_late_is_judged_at_rank_0s_moment() -> None:
    book = Book()
    roster = roster_with(Fault(2, "stop", 100.0, 101.0))
    roster.lost_by_0[2] = 102.0
    roster.judge_loss(book, Loss(6, 2, "lost before this node joined", 300.0))
    assert (book.tallies["losses"].checked, book.tallies["losses"].broken) == (1, 0)


def test_a_fault_counts_a_node_lost_only_if_rank_0_lost_it_during_the_fault_or_just_after() -> None:
    roster = roster_with()
    short, long, other = Fault(2, "stop", 100.0, 101.0), Fault(3, "stop", 100.0, None), Fault(4, "stop", 100.0, 101.0)
    roster.lost_by_0.update({2: 102.5, 3: 102.6, 4: 130.0})
    assert [roster.lost_to(fault) for fault in (short, long, other)] == [True, True, False]


def test_a_late_call_breaks_the_deadline_invariant_unless_the_soak_stopped_its_caller() -> None:
    roster = roster_with(Fault(2, "stop", 100.0, 104.0))
    worker = Book(late=[Late("call", 99.5, 105.0, 0.5, 5.0), Late("call", 200.0, 202.0, 0.5, 1.5)])
    book = Book()
    book.add(worker, 2, roster)
    assert book.counts["late calls of callers the soak stopped"] == 1
    assert book.tallies["deadline"].broken == 1
    assert book.tallies["deadline"].examples == ["node 2: call ended 1.50 s past its 0.50 s"]
    assert book.worst_late == 1.5 > LATE


def test_a_survivor_that_grows_past_the_bound_after_its_warm_up_is_not_flat() -> None:
    steady = [(float(t), 300 << 20) for t in range(100)]
    leaking = [(float(t), (300 << 20) + t * (1 << 20)) for t in range(100)]
    warming = [(float(t), (200 << 20) + min(t, 10) * (10 << 20)) for t in range(100)]
    verdict = memory_verdict({1: steady, 2: leaking, 3: warming, 4: steady[:5]}, {1, 2, 3, 4}, 100.0)
    growth = verdict["growth"]
    assert growth[1] == 0
    assert growth[2] > FLAT_MIB
    assert growth[3] == 0  # it grew during its warm-up only
    assert verdict["young"] == [4]


def entry(value: int, incarnation: str = "a", restored_from: int | None = None, intact: bool = True) -> Entry:
    return Entry(value, incarnation, restored_from, intact, 1)


def test_a_ledger_restored_from_its_last_snapshot_holds_the_relocation_invariant() -> None:
    book, moves = Book(), []
    watch = LedgerWatch("soak/ledger/0", 10)
    for value in range(1, 28):
        watch.observe(entry(value), book, moves)
    watch.unknown = 1  # the 28th addition's call failed with its node
    watch.observe(entry(21, "b", restored_from=20), book, moves)
    assert (book.tallies["relocation"].checked, book.tallies["relocation"].broken) == (1, 0)
    assert moves == [7]
    assert book.tallies["typed"].broken == 0


def test_a_ledger_restored_from_an_older_snapshot_or_a_torn_one_breaks_it() -> None:
    for restored, intact in ((10, True), (20, False), (30, True)):
        book, moves = Book(), []
        watch = LedgerWatch("soak/ledger/0", 10)
        for value in range(1, 28):
            watch.observe(entry(value), book, moves)
        watch.observe(entry(restored + 1, "b", restored_from=restored, intact=intact), book, moves)
        assert book.tallies["relocation"].broken == 1, (restored, intact)


def test_a_ledger_whose_count_skips_an_addition_breaks_the_typed_invariant() -> None:
    book, moves = Book(), []
    watch = LedgerWatch("soak/ledger/0", 10)
    watch.observe(entry(1), book, moves)
    watch.observe(entry(3), book, moves)
    assert book.tallies["typed"].broken == 1
    watch.unknown = 1  # an addition that timed out may have been made
    watch.observe(entry(5), book, moves)
    assert book.tallies["typed"].broken == 1


async def test_a_sink_says_whether_every_tell_of_a_sender_arrived() -> None:
    async with local_world(2) as world:
        sink = await world[0].spawn(Sink, on=1)
        book = Book()
        teller = Teller("main", book)
        for _ in range(20):
            teller.tell(sink)
        await teller.check(sink, 5.0)
        assert (book.tallies["tells"].checked, book.tallies["tells"].broken) == (1, 0)
        teller.sent[sink] += 1  # as if a tell had been lost on the way
        await teller.check(sink, 5.0)
        assert book.tallies["tells"].broken == 1
        assert "21 told, the sink saw up to 20" in book.tallies["tells"].examples[0]


@pytest.mark.soak
@pytest.mark.multiprocess
@pytest.mark.timeout(420)
def test_a_short_chaos_soak_of_three_nodes_holds_every_invariant() -> None:
    argv = [sys.executable, str(REPO / "benchmarks" / "soak_chaos.py"), "--seconds", "30", "--nodes", "3"]
    argv += ["--seed", "9", "--every", "3", "--json"]  # a kill, a join, a partition, a long stop, a join
    finished = run_argv(argv, timeout=400.0)
    lines = [line for line in finished.stdout.splitlines() if line.startswith("SOAK-RESULT ")]
    assert lines, f"no result:\n{finished.report()}"
    result = json.loads(lines[-1].removeprefix("SOAK-RESULT "))
    assert result["broken"] == [], finished.stdout
    assert result["left"] == []
    finished.assert_clean_exit(0)
    tallies = result["book"]["tallies"]
    for name in ("deadline", "typed", "tells", "losses", "names", "relocation"):
        assert tallies[name]["checked"] > 0, f"{name} was never checked:\n{finished.stdout}"
    assert sum(result["faults"].values()) >= 4
    assert result["relocations"], "no ledger moved"
