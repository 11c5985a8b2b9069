"""actorch against raw torch RPC, side by side in one world, at the same moment.

Both sides use the very same torch RPC agent (actorch's transport initialises it),
so transport settings are identical. Each measurement alternates raw and actorch
rounds and reports the median of the rounds.

    python benchmarks/bench_rpc.py                 # uv and shm transports, with the fast lane and without
    python benchmarks/bench_rpc.py --transport uv --lane on --rounds 5
    python benchmarks/bench_rpc.py --transport uv --lane on --trace   # and (a), (b) with a timeline recorded
    python benchmarks/bench_rpc.py --transport uv --lane on --otel sdk   # everything with OpenTelemetry spans
    python benchmarks/bench_rpc.py --transport uv --lane on --bare    # and (a), (b), (d) with no instrument installed

actorch sends messages without tensors of their own on its fast lane (direct
TCP connections) unless ``run(transport=TorchRpc(lane=False))``; ``--lane off`` measures
actorch on torch RPC alone, the path it had before the lane.

``--otel api`` runs the whole system with ``otel=True`` and no SDK set up (the
API's no-op tracer: what actorch's own span code costs); ``--otel sdk`` sets
up the SDK on every node as a user would, its batching processor exporting to
nothing (what making the spans costs, without a network). Spans are on or off
for a whole system, so compare with a run without ``--otel``.

``--bare`` measures (a), (b) and (d) again in each round with every instrument
taken off both nodes, the metrics that ``actorch status`` reads included: what
the message path costs with no observer at all, against the default, which
keeps the metrics. No user configuration does that: the benchmark reaches into
the runtime (``_engine/instruments.py``) to measure the hooks themselves.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed.rpc as rpc

import actorch


def noop() -> None:
    return None


def echo(value: Any) -> Any:
    return value


_callee_loop: asyncio.AbstractEventLoop | None = None


@rpc.functions.async_execution  # type: ignore[untyped-decorator]
def bridged_noop() -> torch.futures.Future[None]:
    """The least an asyncio runtime can do on the callee: hand the call to its loop, answer from there."""
    answer: torch.futures.Future[None] = torch.futures.Future()
    assert _callee_loop is not None
    _callee_loop.call_soon_threadsafe(answer.set_result, None)
    return answer


async def bridged_call(worker: Any) -> None:
    """Call ``bridged_noop`` on ``worker`` (a torch ``WorkerInfo``) and await it here: the floor's caller side."""
    loop = asyncio.get_running_loop()
    answered: asyncio.Future[None] = loop.create_future()
    sent = rpc.rpc_async(worker, bridged_noop)
    sent.add_done_callback(lambda _: loop.call_soon_threadsafe(answered.set_result, None))
    await answered


_taken_off: list[Any] = []  # this process's instruments while --bare measures


def set_bare(system: actorch.ActorSystem, bare: bool) -> None:
    """Take every instrument off this process's node (``bare``), or put back those taken off."""
    instruments = system.host.node.instruments  # type: ignore[attr-defined]  # the runtime's own: a measurement only
    if bare:
        _taken_off[:] = list(instruments)
        for instrument in _taken_off:
            instruments.remove(instrument)
    else:
        for instrument in _taken_off:
            instruments.add(instrument)
        _taken_off.clear()


class Echo(actorch.Actor):
    async def noop(self) -> None:
        return None

    async def set_bare(self, bare: bool) -> None:
        """``set_bare`` on this actor's node."""
        set_bare(self.system, bare)

    async def echo(self, value: Any) -> Any:
        return value

    async def lend_loop(self) -> None:
        """Let ``bridged_noop`` reach this node's event loop."""
        global _callee_loop  # noqa: PLW0603 - one loop per process, set once
        _callee_loop = asyncio.get_running_loop()


def sdk_tracing(rank: int) -> None:
    """``--otel sdk``'s set-up on every node: the SDK's provider and batching processor, to an exporter that drops."""
    from opentelemetry import trace  # noqa: PLC0415 - only for --otel sdk
    from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult  # noqa: PLC0415

    class Dropped(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Dropped()))
    trace.set_tracer_provider(provider)


class RawEcho:
    def noop(self) -> None:
        return None


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Settings:
    """What one run measures, and how much: the command line's options."""

    rounds: int
    calls: int  # sequential calls per round
    in_flight: int
    bursts: int  # of in_flight calls per throughput round
    mb: int  # the tensor's size
    trace: bool = False  # (a) and (b) again with a timeline recorded
    bare: bool = False  # (a), (b) and (d) again with no instrument installed
    otel: str | None = None  # spans on: "api" (no SDK set up) or "sdk"


def median_rounds(rounds: int, measure: Callable[[], float]) -> float:
    return statistics.median(measure() for _ in range(rounds))


async def bench(system: actorch.ActorSystem, settings: Settings) -> dict[str, Any]:
    ref = await system.spawn(Echo, on=1)
    local = await system.spawn(Echo, on=0)
    worker = "node1"
    await ref.call(Echo.lend_loop)
    worker_info = rpc.get_worker_info(worker)  # resolved once, as actorch does
    for _ in range(200):  # warm up every path
        rpc.rpc_sync(worker, noop)
        await ref.call(Echo.noop)
        await bridged_call(worker_info)
    results: dict[str, Any] = {}

    def raw_seq() -> float:
        start = time.perf_counter()
        for _ in range(settings.calls):
            rpc.rpc_sync(worker, noop)
        return (time.perf_counter() - start) / settings.calls * 1e6

    async def actorch_seq() -> float:
        start = time.perf_counter()
        for _ in range(settings.calls):
            await ref.call(Echo.noop)
        return (time.perf_counter() - start) / settings.calls * 1e6

    raw_rref = rpc.remote(worker, RawEcho)

    async def floor_seq() -> float:
        # torch RPC bridged into asyncio at both ends and nothing else: what any asyncio runtime pays at least
        start = time.perf_counter()
        for _ in range(settings.calls):
            await bridged_call(worker_info)
        return (time.perf_counter() - start) / settings.calls * 1e6

    def rref_seq() -> float:
        start = time.perf_counter()
        for _ in range(settings.calls):
            raw_rref.rpc_sync().noop()
        return (time.perf_counter() - start) / settings.calls * 1e6

    def raw_flight() -> float:
        start = time.perf_counter()
        for _ in range(settings.bursts):
            torch.futures.wait_all([rpc.rpc_async(worker, noop) for _ in range(settings.in_flight)])
        return settings.bursts * settings.in_flight / (time.perf_counter() - start)

    async def actorch_flight() -> float:
        start = time.perf_counter()
        for _ in range(settings.bursts):
            await asyncio.gather(*(ref.call(Echo.noop) for _ in range(settings.in_flight)))
        return settings.bursts * settings.in_flight / (time.perf_counter() - start)

    tensor = torch.randn(settings.mb * (1 << 20) // 4)

    def raw_tensor() -> float:
        start = time.perf_counter()
        out = rpc.rpc_sync(worker, echo, args=(tensor,))
        elapsed = time.perf_counter() - start
        assert out.shape == tensor.shape
        return 2 * tensor.nbytes / elapsed / 1e9

    async def actorch_tensor() -> float:
        start = time.perf_counter()
        out = await ref.call(Echo.echo, tensor)
        elapsed = time.perf_counter() - start
        assert out.shape == tensor.shape
        return 2 * tensor.nbytes / elapsed / 1e9

    leased = actorch.lease(tensor.shape, tensor.dtype)  # the zero-copy mode: written where the receiver reads
    leased.tensor.copy_(tensor)

    async def actorch_lease_tensor() -> float:
        start = time.perf_counter()
        out = await ref.call(Echo.echo, leased.tensor)
        elapsed = time.perf_counter() - start
        assert out.shape == tensor.shape
        return 2 * tensor.nbytes / elapsed / 1e9

    copied = torch.empty_like(tensor)
    copied.copy_(tensor)

    def memcpy_limit() -> float:
        """The machine's limit: one copy of the tensor's bytes into memory already faulted in (bytes over time)."""
        start = time.perf_counter()
        copied.copy_(tensor)
        return tensor.nbytes / (time.perf_counter() - start) / 1e9

    async def actorch_local() -> float:
        start = time.perf_counter()
        for _ in range(settings.calls * 10):
            await local.call(Echo.noop)
        return (time.perf_counter() - start) / (settings.calls * 10) * 1e6

    async def actorch_local_tell() -> tuple[float, float]:
        sending = 0.0
        start = time.perf_counter()
        for _ in range(10):  # the mailbox holds 4,096: wait after each thousand until they were handled
            sent = time.perf_counter()
            for _ in range(settings.calls):
                local.tell(Echo.noop)
            sending += time.perf_counter() - sent
            await local.call(Echo.noop)
        return sending / (settings.calls * 10) * 1e6, (time.perf_counter() - start) / (settings.calls * 10) * 1e6

    async def plain_await() -> float:
        target = Echo.__new__(Echo)
        start = time.perf_counter()
        for _ in range(settings.calls * 10):
            await target.noop()
        return (time.perf_counter() - start) / (settings.calls * 10) * 1e6

    series: dict[str, list[float]] = {
        key: []
        for key in (
            "raw_seq_us",
            "actorch_seq_us",
            "floor_seq_us",
            "rref_seq_us",
            "raw_calls_per_s",
            "actorch_calls_per_s",
            "raw_tensor_gb_s",
            "actorch_tensor_gb_s",
            "actorch_lease_gb_s",
            "memcpy_gb_s",
            "actorch_local_us",
            "actorch_local_tell_sent_us",
            "actorch_local_tell_us",
            "plain_await_us",
            *(("traced_seq_us", "traced_calls_per_s") if settings.trace else ()),
            *(("bare_seq_us", "bare_calls_per_s", "bare_local_us") if settings.bare else ()),
        )
    }
    for _ in range(settings.rounds):
        series["raw_seq_us"].append(raw_seq())
        series["actorch_seq_us"].append(await actorch_seq())
        series["floor_seq_us"].append(await floor_seq())
        series["rref_seq_us"].append(rref_seq())
        series["raw_calls_per_s"].append(raw_flight())
        series["actorch_calls_per_s"].append(await actorch_flight())
        series["raw_tensor_gb_s"].append(raw_tensor())
        series["actorch_tensor_gb_s"].append(await actorch_tensor())
        series["actorch_lease_gb_s"].append(await actorch_lease_tensor())
        series["memcpy_gb_s"].append(memcpy_limit())
        series["actorch_local_us"].append(await actorch_local())
        tell_sent, tell_handled = await actorch_local_tell()
        series["actorch_local_tell_sent_us"].append(tell_sent)
        series["actorch_local_tell_us"].append(tell_handled)
        series["plain_await_us"].append(await plain_await())
        if settings.trace:  # (a) and (b) again, every call and handler recorded on a timeline (written, then removed)
            with tempfile.TemporaryDirectory() as directory:
                async with system.trace(
                    os.path.join(directory, "bench.json"), max_events=10 * settings.in_flight * settings.bursts
                ):
                    series["traced_seq_us"].append(await actorch_seq())
                    series["traced_calls_per_s"].append(await actorch_flight())
        if settings.bare:  # (a), (b) and (d) again, with no instrument on either node
            set_bare(system, True)
            await ref.call(Echo.set_bare, True)
            series["bare_seq_us"].append(await actorch_seq())
            series["bare_calls_per_s"].append(await actorch_flight())
            series["bare_local_us"].append(await actorch_local())
            await ref.call(Echo.set_bare, False)
            set_bare(system, False)
    results = {key: statistics.median(values) for key, values in series.items()}

    pids = [node.pid for node in system.nodes]
    before = [cpu_seconds(pid) for pid in pids]
    await asyncio.sleep(3.0)
    after = [cpu_seconds(pid) for pid in pids]
    results["idle_cpu_percent"] = [round((b - a) / 3.0 * 100, 1) for a, b in zip(before, after, strict=True)]
    return results


def report(transport: str, lane: bool, res: dict[str, Any]) -> None:
    print(f"\n== transport {transport}, fast lane {'on' if lane else 'off'} (medians of rounds) ==")
    rows = [
        (
            "(a) sequential no-op round trip",
            f"{res['raw_seq_us']:.0f} us",
            f"{res['actorch_seq_us']:.0f} us",
            res["actorch_seq_us"] / res["raw_seq_us"],
            "<= 1.2",
        ),
        (
            "(b) throughput, calls in flight",
            f"{res['raw_calls_per_s']:.0f}/s",
            f"{res['actorch_calls_per_s']:.0f}/s",
            res["actorch_calls_per_s"] / res["raw_calls_per_s"],
            ">= 8",
        ),
        (
            "(c) tensor round trip",
            f"{res['raw_tensor_gb_s']:.2f} GB/s",
            f"{res['actorch_tensor_gb_s']:.2f} GB/s",
            res["actorch_tensor_gb_s"] / res["raw_tensor_gb_s"],
            ">= 5",
        ),
    ]
    print(f"{'measure':34} {'raw torch RPC':>14} {'actorch':>14} {'ratio':>7}  target")
    for label, raw, ours, ratio, target in rows:
        print(f"{label:34} {raw:>14} {ours:>14} {ratio:7.2f}  {target}")
    print(
        f"{'(d) call to a same-process actor':34} {res['plain_await_us']:>11.2f} us {res['actorch_local_us']:>11.2f} us"
        f" {'':7}  <= 5 us  (raw column: plain await of the method)"
    )
    memcpy = res["memcpy_gb_s"]
    print(
        f"{'(c) the limit: one memcpy':34} {'':>14} {memcpy:>9.2f} GB/s {'':7}  "
        f"actorch {res['actorch_tensor_gb_s'] / memcpy:.0%} of it (target >= 50%)"
    )
    print(
        f"{'(c) from an actorch.lease':34} {res['raw_tensor_gb_s']:>9.2f} GB/s {res['actorch_lease_gb_s']:>9.2f} GB/s"
        f" {res['actorch_lease_gb_s'] / res['raw_tensor_gb_s']:7.2f}  no copy at all (same host)"
    )
    print(f"{'(d) tell, the sending alone':34} {'':>14} {res['actorch_local_tell_sent_us']:>11.2f} us {'':7}  < call")
    print(f"{'(d) tell, sent and handled':34} {'':>14} {res['actorch_local_tell_us']:>11.2f} us")
    floor = res["floor_seq_us"]
    print(
        f"{'(a) floor: torch RPC bridged only':34} {res['raw_seq_us']:>11.0f} us {floor:>11.0f} us"
        f" {floor / res['raw_seq_us']:7.2f}  actorch / floor: {res['actorch_seq_us'] / floor:.2f}"
    )
    print(f"{'RRef method call (rref.rpc_sync)':34} {res['rref_seq_us']:>11.0f} us")
    if "traced_seq_us" in res:
        print(
            f"{'(a) with a trace running':34} {'':>14} {res['traced_seq_us']:>11.0f} us"
            f" {res['traced_seq_us'] / res['actorch_seq_us']:7.2f}  of untraced (target <= 1.15)"
        )
        print(
            f"{'(b) with a trace running':34} {'':>14} {res['traced_calls_per_s']:>11.0f}/s"
            f" {res['traced_calls_per_s'] / res['actorch_calls_per_s']:7.2f}  of untraced"
        )
    if "bare_seq_us" in res:
        bare = [
            ("(a) with nothing installed", f"{res['bare_seq_us']:.0f} us", res["bare_seq_us"] / res["actorch_seq_us"]),
            (
                "(b) with nothing installed",
                f"{res['bare_calls_per_s']:.0f}/s",
                res["bare_calls_per_s"] / res["actorch_calls_per_s"],
            ),
            (
                "(d) with nothing installed",
                f"{res['bare_local_us']:.2f} us",
                res["bare_local_us"] / res["actorch_local_us"],
            ),
        ]
        for label, ours, ratio in bare:
            print(f"{label:34} {'':>14} {ours:>14} {ratio:7.2f}  of the default (the metrics installed)")
    print(f"idle CPU per process (rank 0, rank 1): {res['idle_cpu_percent']} %")


def run_one(transport: str, lane: bool, settings: Settings) -> dict[str, Any]:
    async def main(system: actorch.ActorSystem) -> dict[str, Any]:
        return await bench(system, settings)

    setup = sdk_tracing if settings.otel == "sdk" else None
    record = actorch.TorchRpc(tensorpipe=transport, lane=lane)
    return actorch.run(main, world_size=2, transport=record, otel=settings.otel is not None, setup=setup)


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--transport", choices=["uv", "shm", "both"], default="both")
    parser.add_argument("--lane", choices=["on", "off", "both"], default="both", help="actorch's fast lane")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=1000, help="sequential calls per round")
    parser.add_argument("--in-flight", type=int, default=2000)
    parser.add_argument("--bursts", type=int, default=5, help="bursts of --in-flight calls per throughput round")
    parser.add_argument("--mb", type=int, default=64, help="tensor size in MB")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--trace", action="store_true", help="also measure (a) and (b) with a timeline recorded")
    parser.add_argument(
        "--bare", action="store_true", help="also measure (a), (b) and (d) with no instrument installed (no metrics)"
    )
    parser.add_argument(
        "--otel",
        choices=["api", "sdk"],
        help="run everything with OpenTelemetry spans: no SDK set up (api), or the SDK's, exporting nowhere (sdk)",
    )
    args = parser.parse_args()
    transports = ["uv", "shm"] if args.transport == "both" else [args.transport]
    lanes = [True, False] if args.lane == "both" else [args.lane == "on"]
    spans = "off" if args.otel is None else f"on ({args.otel})"
    settings = Settings(
        args.rounds, args.calls, args.in_flight, args.bursts, args.mb, trace=args.trace, bare=args.bare, otel=args.otel
    )
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, {args.rounds} rounds, OpenTelemetry spans {spans}")
    results = {}
    for transport in transports:
        for lane in lanes:
            key = f"{transport}, lane {'on' if lane else 'off'}"
            results[key] = run_one(transport, lane, settings)
            report(transport, lane, results[key])
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)


if __name__ == "__main__":
    cli()
