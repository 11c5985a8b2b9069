"""Chaos soak: a system of 4 to 6 nodes under a mixed load, hit at random by kills, stops, partitions, joins and leaves.

    python benchmarks/soak_chaos.py                               # 5 nodes for 120 s, a random seed (printed)
    python benchmarks/soak_chaos.py --seconds 600 --seed 7        # the run of docs/reliability.md
    python benchmarks/soak_chaos.py --seconds 30 --nodes 3        # the marked test's short run

The system is ``actorch.run(main, world_size=--nodes, elastic=True)`` over
``FaultyTransport(TorchRpc(), ...)``, with a snapshot directory. Rank 0 runs
``main``, which drives the load, injects the faults and keeps the books; it
is never faulted itself, so the soak's bookkeeping survives everything it
does to the others.

**The load.** Every node but rank 0 hosts a ``Sentinel`` (it watches its own
node's membership events and tells rank 0 of every node it counts lost), an
``Echo`` (calls, streams, broadcasts), a ``Sink`` (numbered tells), a
``Caller`` (the workers' own load: calls with deadlines to other nodes' echoes
and numbered tells to their sinks, which it checks itself) and a stock
``Collector`` playing a small corridor. From rank 0, ``main`` makes calls with
deadlines (some of them meant to time out), numbered tells to every sink,
streams, broadcasts of a tensor to every echo, lookups, and reads the
collectors as one ``Collection`` feeding a learner that publishes its weights
back (a broadcast). ``Ledger`` actors, named and relocatable, count the
additions ``main`` makes to them and save a snapshot every
``--snapshot-every`` additions.

**The faults**, planned up front from the seed (``--seed``, printed; the same
seed gives the same plan): ``kill -9``; ``SIGSTOP`` then ``SIGCONT``, short
(under ``liveness_timeout``: the node should come through) or long (past it:
the node is lost, and leaves once it runs again); partitions of one node from
all others through ``FaultyTransport``, short or long; where root can make
network namespaces, one node joins from a second namespace and its link is
cut silently (``tc``), short or long; graceful leaves (``system.leave``);
and joins that keep the system at ``--nodes`` to ``--nodes + 1`` nodes,
through ``system.add_nodes``, ``actorch.serve`` in a process of the soak's,
and ``serve`` in the other namespace. Rank 0 is never a target. Joined nodes
get ranks in the order they join, so the plan knows them beforehand; a fault
whose target is not there when its time comes is skipped and counted.

**The invariants**, checked as the run goes:

- *deadline*: every call, stream, broadcast and collector batch ends within
  its deadline plus ``LATE`` seconds (the event loop's own lag on a loaded
  machine);
- *typed*: each ends with its right value or with a typed error (an
  ``actorch.ActorchError`` or ``TimeoutError``); a ledger's count goes up by
  one per addition, never skips or repeats;
- *tells*: no tell to a live actor is lost: when a sink answers a check from
  a sender, it has received every tell that sender sent it before the check,
  in order, once each (a tell refused at once with an error was not sent);
- *losses*: no node the soak did not fault is counted lost. A node counts
  another lost when its membership events say so (``NodeLost``; its sentinel
  tells rank 0, and rank 0 watches its own). The soak faulted a node if it
  killed it, stopped it, cut it off or began its leave; a short fault
  excuses a loss until ``liveness_timeout`` + 1 s after it ended. A count
  made by a node the soak cut off, or by one rank 0 had already counted lost,
  is no evidence (such a node is no longer a member);
- *names*: names resolve to live actors: each role of each ready node, and
  each ledger, is looked up and answers, unless its node was faulted or left
  meanwhile; ``lookup_all`` lists no actor of a node rank 0 counted lost
  more than ``NAME_GRACE`` seconds before;
- *memory*: each survivor's memory stays flat after warm-up: its resident
  set, sampled every second, has a median over the last fifth of its watched
  life (after a warm-up of a quarter of it, at least 10 s) within
  ``FLAT_MIB`` of the median over the first fifth after the warm-up. A leak
  of a kilobyte per message grows hundreds of megabytes in ten minutes;
- *relocation*: a relocated ledger (its node lost, or gone with a leave and
  spawned again under its name) starts from exactly its last snapshot: the
  count it restores is the last multiple of ``--snapshot-every`` the old
  instance reached (counting the additions whose outcome is unknown), with
  its tensor intact; it loses exactly what came after that save.

At the end it prints the faults injected, the load carried and each
invariant's checks, breaks and figures, and exits 1 naming every invariant
that broke (2 if the run itself failed). Every process it started must be
gone when it returns: the harness (this script without ``--inner``) checks
that too.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parent
REPO = BENCHMARKS.parent
sys.path[:0] = [str(BENCHMARKS), str(REPO / "tests")]  # chaos, and netns: the partition tests' namespaces

import torch  # noqa: E402 - after the path is set
from chaos.books import INVARIANTS, Book  # noqa: E402
from chaos.plan import Plan, make_plan  # noqa: E402
from chaos.soak import Options, Soak, host_pair  # noqa: E402

import actorch  # noqa: E402
from actorch.testing import FaultyTransport  # noqa: E402

RESULT = "SOAK-RESULT "
"""Prefix of the line that gives the whole result as JSON, with ``--json`` (the marked test reads it)."""
PROCESSES = "every process the system started is gone after it"
"""The harness's own invariant, checked once the system has ended."""
WIDTH = 66
"""Width of the invariants' words in the table."""
MARKER_ENV = "ACTORCH_SOAK_MARKER"
"""Set in the environment of every process of a run, so that the harness finds any left behind."""


def print_tables(plan: Plan, result: dict[str, Any], wall: float) -> list[str]:
    """Print the faults, the load and the invariants; return the names of those that broke."""
    book = Book.from_json(result["book"])
    done, skipped, lost = result["faults"], result["skipped"], result["lost_to"]
    print(f"\n{f'faults injected (seed {plan.seed})':<46} done  skipped  node lost")
    for row in sorted(set(done) | set(skipped)):
        print(f"  {row:<44} {done.get(row, 0):>5}  {skipped.get(row, 0):>7}  {lost.get(row, 0):>9}")
    print(f"  {'all':<44} {sum(done.values()):>5}  {sum(skipped.values()):>7}  {sum(lost.values()):>9}")
    print("\nload carried")
    for what in (
        "call",
        "tell",
        "tell check",
        "stream",
        "broadcast",
        "collector batch",
        "frames learned",
        "publish",
        "ledger add",
        "lookup",
    ):
        print(f"  {what:<44} {book.counts.get(what, 0):>8}")
    errors = ", ".join(f"{name} {count}" for name, count in book.errors.most_common())
    print(f"  typed errors: {errors or 'none'}")
    relocations = result["relocations"]
    downtimes = result["downtimes"]
    figures = {
        "deadline": f"worst {book.worst_late:+.2f} s past a deadline; "
        f"{book.counts.get('late calls of callers the soak stopped', 0)} late calls of callers stopped meanwhile",
        "losses": f"{book.counts.get('losses counted by nodes out of the system', 0)} counts by nodes cut off or lost",
        "memory": "growth "
        + ", ".join(f"node {rank} {mib:+.1f}" for rank, mib in sorted(result["memory"]["growth"].items()))
        + " MiB"
        + (f"; too young to judge: {result['memory']['young']}" if result["memory"]["young"] else ""),
        "relocation": (
            f"{len(relocations)} moves, lost {min(relocations, default=0)} to {max(relocations, default=0)} "
            f"additions (interval {plan.snapshot_every}); back within {max(downtimes, default=0.0):.2f} s"
        ),
    }
    print(f"\n{'invariant':<{WIDTH + 9}} checked  broken  figures")
    broke = []
    for name, words in INVARIANTS.items():
        tally = book.tallies[name]
        held = "held" if tally.broken == 0 else "BROKEN"
        print(f"  {held:<6} {words:<{WIDTH}} {tally.checked:>7}  {tally.broken:>6}  {figures.get(name, '')}")
        if tally.broken:
            broke.append(name)
            for example in tally.examples:
                print(f"           {example}")
    print(f"\n{wall:.0f} s in all; nodes at the end: {result['nodes_at_end']}")
    return broke


# ---------------------------------------------------------------------------------------------------- processes


def inner(plan: Plan, options: Options) -> int:
    """The system itself (rank 0 and the workers it starts): run the plan, print the tables, exit 1 if one broke."""
    record = FaultyTransport(actorch.TorchRpc(), *plan.partitions(), seed=plan.seed, epoch=options.epoch)
    started = time.monotonic()

    async def main(system: actorch.ActorSystem) -> dict[str, Any]:
        return await Soak(system, plan, options).run()

    result = actorch.run(
        main,
        world_size=plan.nodes,
        elastic=True,
        transport=record,
        host=host_pair(options.namespaces).a.address if options.namespaces else "127.0.0.1",
        liveness_timeout=plan.liveness,
        stop_grace=2.0,
        snapshots=os.path.join(options.folder, "snapshots"),
        log_level="warning",
    )
    broke = print_tables(plan, result, time.monotonic() - started)
    (Path(options.folder) / "result.json").write_text(json.dumps({"broken": broke, **result}, default=str))
    return 1 if broke else 0


def live_marked(marker: str) -> list[int]:
    """Processes still running (not zombies) that carry the run's marker in their environment."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if f"{MARKER_ENV}={marker}".encode() in environ.split(b"\0") and state not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def harness(args: argparse.Namespace, plan: Plan) -> int:
    """Start the system in a session of its own (in a namespace where root allows), wait, and check what is left.

    Returns:
        0 if every invariant held, 1 if one broke (each is named), 2 if the
        system ended without a result (it crashed, or outlived its time and
        was killed).
    """
    folder = Path(tempfile.mkdtemp(prefix="soak-chaos-"))
    marker = uuid.uuid4().hex
    env = dict(os.environ, **{MARKER_ENV: marker}, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), str(BENCHMARKS), env.get("PYTHONPATH")]))
    argv = [sys.executable, str(Path(__file__).resolve()), "--inner", "--folder", str(folder), *args.passed]
    with contextlib.ExitStack() as stack:
        if plan.netns:
            import netns  # noqa: PLC0415 - only where namespaces can be made

            pair = stack.enter_context(netns.host_pair())
            argv = pair.a.exec_argv([*argv, "--namespaces", f"{pair.a.namespace},{pair.b.namespace}"])
        log = (folder / "system.log").open("wb")
        process = subprocess.Popen(argv, env=env, stderr=log, start_new_session=True)
        try:
            finished = process.wait(plan.seconds + 300) is not None
        except subprocess.TimeoutExpired:
            finished = False
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            log.close()
        deadline = time.monotonic() + 10.0
        while (left := live_marked(marker)) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
    held = "held" if not left else "BROKEN"
    print(f"  {held:<6} {PROCESSES:<{WIDTH}} {1:>7}  {int(bool(left)):>6}  {len(left)} left")
    lost_lines = sum('"event": "node lost"' in line for line in (folder / "system.log").read_text().splitlines())
    print(f"\nlogs: {folder / 'system.log'} ({lost_lines} 'node lost' lines)")
    path = folder / "result.json"
    if not finished or not path.exists():
        print("the system ended without a result" if finished else "the system did not end in time: killed")
        return 2
    result = json.loads(path.read_text())
    broke = [INVARIANTS[name] for name in result["broken"]] + ([PROCESSES] if left else [])
    result["left"] = left
    if args.json:
        print(RESULT + json.dumps(result), flush=True)
    if broke:
        print(f"broken: {'; '.join(broke)}", flush=True)
        return 1
    if not args.keep:
        for each in sorted(folder.rglob("*"), reverse=True):
            each.rmdir() if each.is_dir() else each.unlink()
        folder.rmdir()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="how long the soak runs (default 120)")
    parser.add_argument("--nodes", type=int, default=5, help="nodes at the start, rank 0 included (3 to 6)")
    parser.add_argument("--seed", type=int, default=None, help="the plan's seed (default: a random one, printed)")
    parser.add_argument("--every", type=float, default=4.0, help="mean seconds between faults (default 4)")
    parser.add_argument("--snapshot-every", type=int, default=10, help="ledger additions per snapshot")
    parser.add_argument("--liveness", type=float, default=2.5, help="liveness_timeout (default 2.5)")
    parser.add_argument("--netns", choices=["auto", "on", "off"], default="auto", help="a node in another namespace")
    parser.add_argument("--keep", action="store_true", help="keep the logs and snapshots (their folder is printed)")
    parser.add_argument("--show-plan", action="store_true", help="print every planned event")
    parser.add_argument("--json", action="store_true", help=f"print the whole result as JSON, after {RESULT.strip()}")
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--namespaces", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return actorch.serve(name="soak-joined")
    if not 3 <= args.nodes <= 6:
        parser.error("--nodes must be 3 to 6")
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 31)
    if args.netns == "auto":
        import netns  # noqa: PLC0415

        args.netns = "off" if netns.unavailable_reason() else "on"
    plan = make_plan(
        args.seed, args.seconds, args.nodes, args.liveness, args.every, args.snapshot_every, args.netns == "on"
    )
    if args.inner:
        namespaces = None
        if args.namespaces:
            a, b = args.namespaces.split(",")
            namespaces = (a, b)
        return inner(plan, Options(time.time(), namespaces, args.folder))
    print(
        f"chaos soak: seed {plan.seed}, {plan.seconds:g} s, {plan.nodes} nodes, {len(plan.events)} events planned "
        f"(one every {plan.every:g} s on average), liveness_timeout {plan.liveness:g} s, a snapshot every "
        f"{plan.snapshot_every} additions, network namespaces {args.netns}; torch {torch.__version__}, "
        f"{os.cpu_count()} CPUs",
        flush=True,
    )
    if args.show_plan:
        for event in plan.events:
            print(f"  {event.at:7.1f} s  {event.label(plan.liveness):<22} node {event.rank}  {event.seconds:.1f} s")
    args.passed = [
        *("--seconds", str(args.seconds), "--nodes", str(args.nodes), "--seed", str(args.seed)),
        *("--every", str(args.every), "--snapshot-every", str(args.snapshot_every), "--liveness", str(args.liveness)),
        *("--netns", args.netns),
    ]
    return harness(args, plan)


if __name__ == "__main__":
    raise SystemExit(main())
