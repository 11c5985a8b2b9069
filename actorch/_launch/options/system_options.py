"""``SystemOptions``: every option of a launch, declared, defaulted, documented and checked in one place.

``run`` and ``start`` take them as keywords (typed by ``OptionKeywords``, so
that a user's type checker sees each one), or as a ``SystemOptions`` built
beforehand; ``actorch.testing.local_world`` takes the ones that apply in one
process (``ConfigKeywords``). Each builds one ``SystemOptions``, which checks
every value as it is made, and the settings every node shares
(``SystemConfig``) are made from it by ``system_config`` alone. What an
option leaves to the environment (``ACTORCH_STATUS_PORT``,
``ACTORCH_LOG_LEVEL``, ``ACTORCH_RECORD``, ``ACTORCH_TRACE``, ``ACTORCH_OTEL``,
``ACTORCH_SNAPSHOTS``: what ``actorch run``'s flags set)
is read where the launch is planned, by the functions here; ``launcher_environment``
sets it for ``actorch run``.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import sys
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from actorch._base.channels.leases import DEFAULT_SHM_POOL
from actorch._base.channels.plane import check_channels
from actorch._base.config import (
    DEFAULT_MAILBOX_SIZE,
    DEFAULT_MAX_MESSAGE,
    DEFAULT_SEND_BUDGET,
    DEFAULT_SNAPSHOTS_KEPT,
    SystemConfig,
    is_count,
    is_number,
)
from actorch._base.record import RECORD_ENV
from actorch._launch.options.environment import (
    LOG_LEVEL_ENV,
    OFF,
    ON,
    OTEL_ENV,
    SNAPSHOTS_ENV,
    STATUS_OFF,
    STATUS_PORT_ENV,
    TRACE_ENV,
    check_log_level,
)
from actorch._launch.options.setup import Setup, takes_system
from actorch._transport.kind import KindOptions
from actorch._transport.kinds import DEFAULT_KIND, default_options, kind_of

__all__ = [
    "IN_PROCESS",
    "ConfigKeywords",
    "OptionKeywords",
    "ResourceSpec",
    "SystemOptions",
    "is_port",
    "launcher_environment",
    "options_of",
    "otel_on",
    "recording",
    "snapshot_directory",
    "status_address",
    "system_config",
    "trace_path",
]

IN_PROCESS = (
    "strict",
    "lookup_timeout",
    "stop_grace",
    "mailbox_size",
    "max_message_size",
    "send_budget",
    "otel",
    "channels",
    "shm_pool",
    "snapshots",
    "snapshots_kept",
)
"""The options that apply to an in-process world (``local_world``): those of ``SystemConfig``."""

DeviceMapSpec = str | Mapping[Any, Any] | None
"""What the deprecated ``device_maps`` option takes (``TorchRpc(device_maps=...)`` now)."""

TENSORPIPE_NAMES = ("uv", "shm")
"""The deprecated strings ``transport=`` took: TensorPipe's channels (``TorchRpc(tensorpipe=...)`` now)."""

_UNSET: Any = type("Unset", (), {"__repr__": lambda self: "<unset>"})()
"""A deprecated option not given (None means something for ``device_maps``)."""

TORCH_RPC_ALIASES = {
    "fast_lane": "lane",
    "rpc_threads": "threads",
    "rpc_timeout": "timeout",
    "device_maps": "device_maps",
}
"""The deprecated options that are torch RPC's, and the field of ``TorchRpc`` each sets."""

ResourceSpec = Mapping[str, float] | Mapping[int, Mapping[str, float]] | None
"""What the ``resources`` option takes: one mapping for every node, or mappings by rank."""


def is_port(port: object) -> bool:
    """Whether ``port`` is a TCP port number, 0 (a free one) included."""
    return is_count(port, 0) and isinstance(port, int) and port <= 65535


@dataclass(frozen=True, kw_only=True)
class SystemOptions:
    """The options of an actor system's launch: what ``actorch.run`` and ``actorch.start`` take as keywords.

    Build one to launch several systems alike: ``run(main, options=opts)``, or
    ``start(options=opts, log_level="debug")`` (keywords override the
    options'). Every value is checked as the options are made; a bad one
    raises ``ValueError`` (``TypeError`` for ``setup``, ``record``, ``otel``
    and a ``transport`` that is no kind's record) naming the option and what it
    takes; ``otel`` on without the OpenTelemetry API installed raises
    ``ImportError``. A deprecated option warns (``DeprecationWarning``) and
    sets the field of ``TorchRpc`` it stands for.

    Attributes:
        strict: Refuse to send values that would need pickle.
        transport: The kind of transport the nodes talk through, as that kind's
            options record: ``actorch.TorchRpc(...)`` (the default: torch RPC,
            with the fast lane beside it; its options are TensorPipe's channel,
            the lane, torch's threads and timeout, device maps), or
            ``actorch.testing.FaultyTransport(...)`` around it. The record
            travels to every node. Deprecated: ``"uv"`` or ``"shm"``, which
            stand for ``TorchRpc(tensorpipe=...)``.
        fast_lane: Deprecated: ``TorchRpc(lane=...)``.
        host: Address of rank 0 for local launches; loopback unless you mean otherwise.
        lookup_timeout: Seconds ``lookup`` waits for a name without a deadline.
        stop_grace: Seconds a stopping actor's messages may run before cancellation.
        liveness_timeout: Seconds without a sign of life after which a node that
            did not close its connections (a stopped process, a network
            partition) is lost; heartbeats go every fifth of it. A killed
            process is noticed at once, whatever this is; a silent node on
            this machine whose process still runs (starved, or busy in a long
            call) is lost only after ten times this.
        mailbox_size: Messages one node may have waiting at one actor; beyond
            it a call waits for room and a tell raises ``MailboxFullError``.
        max_message_size: Bytes of host memory a call, tell or result between
            nodes may take by value (its encoded body and the tensors that
            travel on the transport's path or staged through the host); a
            larger one raises ``MessageTooLargeError`` where it is sent.
            Tensors that go device to device (device maps, CUDA IPC) or by
            reference in shared memory do not count: device memory bounds the
            first, ``shm_pool`` the second.
        send_budget: Bytes one node may have on their way to one other node
            (sent, not yet taken there: a frozen or overloaded node's backlog);
            past it a tell raises ``MailboxFullError`` and a call waits for
            them to drain. A single larger message still leaves when nothing
            else is on its way.
        rpc_timeout: Deprecated: ``TorchRpc(timeout=...)``.
        rpc_threads: Deprecated: ``TorchRpc(threads=...)``.
        device_maps: Deprecated: ``TorchRpc(device_maps=...)``.
        devices: What happens to a tensor on a GPU that no map carries to its
            destination: ``"stage"`` copies it through pinned host memory, and
            it arrives on the receiving actor's device (else the CPU);
            ``"strict"`` refuses it with ``SerializationError``.
        channels: The tensor channels a node may use, beyond those always there
            (empty tensors as metadata, small ones inside their message, the
            rest by value on the transport's path): ``"shm"`` (CPU tensors by
            reference in shared memory, to nodes of the same host),
            ``"cuda_ipc"`` (GPU tensors by CUDA IPC handle, on one host),
            ``"device_map"`` (TensorPipe's device maps) and ``"staged"`` (GPU
            tensors through host memory). None: every one. ``("staged",)``
            sends every tensor over the network as if no peer shared the host
            (nodes in network namespaces of one machine do share it). See
            docs/guides/gpus.md.
        shm_pool: Bytes of shared memory each node keeps at most for the
            tensors it sends to nodes of its host and for its leases
            (``actorch.lease``); past it, tensors go by value. So do those for
            a node that holds ``send_budget`` bytes of them and has not let go.
        elastic: Let nodes join the running system (``actorch.serve``) and
            leave it (``system.leave``); ``world_size`` (or None: 1) is how many
            nodes it starts with. Runs on torch RPC even with one node. The
            join token is ``ACTORCH_JOIN_TOKEN`` if set, else a new random one;
            ``system.join_env()`` gives what a joining process needs. No
            device maps: GPU tensors are staged. Not under torchrun. See
            docs/guides/elastic.md.
        port: Port rank 0 listens on for a local launch (0: a free one);
            give one when other processes join an elastic system.
        setup: A function called once on every node, with its rank, before the
            node serves (seed the random generators, set torch's threads,
            import plugins); it may be ``async``. It must be importable (a
            module-level function), as local workers are new processes. If it
            raises, the system does not start.
        tune_gc: Tune Python's cyclic garbage collector once a node has
            started (imports, ``setup``, torch RPC): move every object then
            alive out of its reach (``gc.freeze()``: ~170,000 objects, mostly
            torch's, that each full collection would walk), collect the
            youngest generation every ``YOUNG_GC_THRESHOLD`` (3,000)
            allocations rather than Python's 700, and make a full collection
            wait for ``OLD_GC_THRESHOLD`` (100) collections of the middle
            generation rather than 10. Measured: twice the sustained message
            throughput, and actors that stop in a time linear in their number
            (10,000 in 0.43 s rather than 0.95 s). Frozen objects are never
            freed: set False if ``setup`` leaves cyclic garbage it expects
            collected, or to keep Python's defaults. None (the default): True
            under ``run``, False under ``start``, whose process is yours
            (``gc.freeze()`` would keep everything it holds now for good).
        status: Have rank 0 serve the system's live status, read-only, for
            ``actorch status`` (and Prometheus metrics at ``/metrics`` with
            ``actorch[metrics]`` installed), and write its address into the
            runtime file where ``actorch status`` finds it. On by default: an
            idle listening socket on rank 0's event loop, which costs nothing
            until asked. False serves none (``actorch stop`` still finds the
            system); so does ``ACTORCH_STATUS_PORT=off`` (``actorch run
            --no-status``) when ``status_port`` is None.
        status_port: The port the status is served on; None reads
            ``ACTORCH_STATUS_PORT`` (``actorch run --status-port``), else 0: a
            free one, which the runtime file records.
        status_host: The address the status is served on; loopback unless you mean otherwise.
        resources: Amounts of resources the nodes declare, over the CPUs,
            memory and GPUs they detect, for ``Where`` placement: one mapping
            for every node (``{"env_slots": 4}``), or mappings by rank
            (``{1: {"env_slots": 4}}``). See docs/guides/placement.md.
        log_level: Log level of actorch's structlog output on every node:
            ``"debug"``, ``"info"``, ``"warning"``, ``"error"`` or
            ``"critical"``; None reads ``ACTORCH_LOG_LEVEL`` (``actorch run
            --log-level``), else ``"warning"``.
        configure_logs: Configure structlog here (unless the program already
            did); the other nodes are processes of their own, configured at
            ``log_level`` either way.
        record: Keep a record of the run, written by every node as it goes:
            nodes joined and lost, actors started, failed, restarted,
            relocated and stopped (with their statistics), errors with their
            tracebacks. ``actorch history`` lists and shows past runs; the
            directory is ``ACTORCH_RUNS_DIR``, else ``~/.local/state/actorch/runs``.
            ``ACTORCH_RECORD=0`` (``actorch run --no-record``) turns it off too.
        trace: Under ``run``, write a timeline of the whole run to this file
            (Chrome Trace Event JSON, for ui.perfetto.dev): every call, tell,
            handler run and mailbox wait, as ``ActorSystem.trace`` records
            them, from ``main``'s start to its end. None reads
            ``ACTORCH_TRACE`` (``actorch run --trace PATH``), else no trace.
            ``start`` takes none: trace a block with ``system.trace(PATH)``.
        otel: Make every call, tell and stream made through a ref an
            OpenTelemetry span on its caller (CLIENT; a tell: PRODUCER), and
            every handler run a span on its node (SERVER; a tell's:
            CONSUMER), child of its call's span: the context travels in the
            message, so a span around ``await ref.call(...)`` is the parent of
            the handler's span on the other node and of the calls that
            handler makes. Needs ``pip install 'actorch[otel]'``; spans go to
            the global tracer provider, which each process sets up itself
            (``setup`` runs on every node). None reads ``ACTORCH_OTEL``
            (``actorch run --otel``), else off: then messages carry nothing
            more. See docs/guides/seeing-inside.md.
        snapshots: A directory for the snapshots of named relocatable
            actors (``Restart(relocate=True)``): rank 0 writes each
            ``save_snapshot`` there (a checksummed file, written and renamed
            before ``save_snapshot`` returns), and a system started again with
            the same directory (``actorch run --max-restarts``, torchrun's
            agent, the script run again) starts each such actor, found by its
            name, from its last snapshot. A new directory is a fresh start.
            Made if missing; shared by the hosts of a job that spans several.
            None reads ``ACTORCH_SNAPSHOTS`` (``actorch run --snapshots
            DIR``), else snapshots live in rank 0's memory and end with it.
            See docs/reliability.md.
        snapshots_kept: Snapshot files kept per actor in ``snapshots``; older
            ones are removed. A newest file that cannot be read (torn,
            corrupt) falls back on the one before, with a warning.
    """

    strict: bool = False
    transport: KindOptions | str = field(default_factory=default_options)
    fast_lane: bool = _UNSET
    host: str = "127.0.0.1"
    lookup_timeout: float = 30.0
    stop_grace: float = 10.0
    liveness_timeout: float = 2.5
    mailbox_size: int = DEFAULT_MAILBOX_SIZE
    max_message_size: int = DEFAULT_MAX_MESSAGE
    send_budget: int = DEFAULT_SEND_BUDGET
    rpc_timeout: float = _UNSET
    rpc_threads: int = _UNSET
    device_maps: DeviceMapSpec = _UNSET
    devices: str = "stage"
    channels: Sequence[str] | None = None
    shm_pool: int = DEFAULT_SHM_POOL
    elastic: bool = False
    port: int = 0
    setup: Setup | None = None
    tune_gc: bool | None = None
    status: bool = True
    status_port: int | None = None
    status_host: str = "127.0.0.1"
    resources: ResourceSpec = None
    log_level: str | None = None
    configure_logs: bool = True
    record: bool = True
    trace: str | os.PathLike[str] | None = None
    otel: bool | None = None
    snapshots: str | os.PathLike[str] | None = None
    snapshots_kept: int = DEFAULT_SNAPSHOTS_KEPT

    def __post_init__(self) -> None:
        self._resolve_transport()
        if not is_number(self.liveness_timeout, inclusive=False):
            raise ValueError(f"liveness_timeout must be a positive number of seconds, not {self.liveness_timeout!r}")
        check_log_level(self.log_level)
        if self.otel is not None and not isinstance(self.otel, bool):
            raise TypeError(f"otel must be True, False or None (read {OTEL_ENV}), not {self.otel!r}")
        if self.snapshots is not None and (
            not isinstance(self.snapshots, (str, os.PathLike)) or not os.fspath(self.snapshots)
        ):
            raise TypeError(f"snapshots must be a directory path (str or os.PathLike), or None, not {self.snapshots!r}")
        system_config(self)
        if self.setup is not None and not callable(self.setup):
            raise TypeError(f"setup must be a function of the node's rank, not {self.setup!r}")
        if self.setup is not None and takes_system(self.setup):
            raise TypeError(
                f"setup {getattr(self.setup, '__qualname__', self.setup)!r} asks for the system, but run() and "
                "start() call setup with the node's rank before the node serves (only serve() hands a setup the system)"
            )
        if not isinstance(self.record, bool):
            raise TypeError(f"record must be True or False, not {self.record!r}")
        if self.trace is not None and (not isinstance(self.trace, (str, os.PathLike)) or not os.fspath(self.trace)):
            raise TypeError(f"trace must be a file path (str or os.PathLike), or None, not {self.trace!r}")
        self._check_status()
        if not is_port(self.port):
            raise ValueError(f"port must be an int in 0..65535 (0: a free one), not {self.port!r}")

    @property
    def transport_record(self) -> KindOptions:
        """The transport's options record: ``transport`` once checked (a deprecated string is one by then)."""
        assert not isinstance(self.transport, str), "made a record in __post_init__"
        return self.transport

    def _resolve_transport(self) -> None:
        """Check ``transport``, and fold the deprecated options into torch RPC's record (one warning each)."""
        record: Any = self.transport
        if isinstance(record, str):
            if record not in TENSORPIPE_NAMES:
                raise ValueError(
                    "transport must be a transport kind's options record (actorch.TorchRpc(...), "
                    f"actorch.testing.FaultyTransport(...)), or the deprecated 'uv' or 'shm'; not {record!r}"
                )
            _deprecated(f"transport={record!r}", f"transport=actorch.TorchRpc(tensorpipe={record!r})")
            record = DEFAULT_KIND.options(tensorpipe=record)
        else:
            kind_of(record)  # a record of no kind raises, naming those it takes
        given = {name: getattr(self, name) for name in TORCH_RPC_ALIASES if getattr(self, name) is not _UNSET}
        if given:
            if type(record) is not DEFAULT_KIND.options:
                names = ", ".join(given)
                raise ValueError(
                    f"{names} set torch RPC's options, but transport= is {record!r}: set them in its record instead"
                )
            for name, value in given.items():
                field_name = TORCH_RPC_ALIASES[name]
                _deprecated(f"{name}={value!r}", f"transport=actorch.TorchRpc({field_name}={value!r})")
                object.__setattr__(self, name, _UNSET)  # folded in: a later replace() does not fold it again
            record = dataclasses.replace(record, **{TORCH_RPC_ALIASES[name]: value for name, value in given.items()})
        object.__setattr__(self, "transport", record)

    def _check_status(self) -> None:
        if not isinstance(self.status, bool):
            raise ValueError(f"status must be True (serve it, the default) or False (serve none), not {self.status!r}")
        if not isinstance(self.status_host, str) or not self.status_host:
            raise ValueError(
                f"status_host must be an address (a non-empty str such as '127.0.0.1'), not {self.status_host!r}"
            )
        if self.status_port is not None and not is_port(self.status_port):
            raise ValueError(
                f"status_port must be an int in 0..65535 (0: a free one), or None, not {self.status_port!r}"
            )
        if not self.status and self.status_port is not None:
            raise ValueError(
                f"status_port={self.status_port!r} was given with status=False, which serves no status: drop one"
            )


class ConfigKeywords(TypedDict, total=False):
    """``SystemOptions``' fields that apply in one process (``IN_PROCESS``), as keywords a type checker sees."""

    strict: bool
    lookup_timeout: float
    stop_grace: float
    mailbox_size: int
    max_message_size: int
    send_budget: int
    otel: bool | None
    channels: Sequence[str] | None
    shm_pool: int
    snapshots: str | os.PathLike[str] | None
    snapshots_kept: int


class OptionKeywords(ConfigKeywords, total=False):
    """Every field of ``SystemOptions``, as keywords a type checker sees (``run(main, **options)``)."""

    transport: KindOptions | str
    fast_lane: bool
    host: str
    liveness_timeout: float
    rpc_timeout: float
    rpc_threads: int
    device_maps: DeviceMapSpec
    devices: str
    elastic: bool
    port: int
    setup: Setup | None
    tune_gc: bool | None
    status: bool
    status_port: int | None
    status_host: str
    resources: ResourceSpec
    log_level: str | None
    configure_logs: bool
    record: bool
    trace: str | os.PathLike[str] | None


def system_config(options: SystemOptions, run_record: str | None = None) -> SystemConfig:
    """The settings every node of a system shares, from its options, under the run record ``run_record`` (None: none).

    The one place a ``SystemConfig`` is made from options.
    """
    return SystemConfig(
        strict=options.strict,
        lookup_timeout=options.lookup_timeout,
        stop_grace=options.stop_grace,
        mailbox_size=options.mailbox_size,
        max_message_size=options.max_message_size,
        send_budget=options.send_budget,
        run_record=run_record,
        otel=otel_on(options),
        devices=options.devices,
        channels=check_channels(options.channels),
        shm_pool=options.shm_pool,
        snapshots=snapshot_directory(options),
        snapshots_kept=options.snapshots_kept,
    )


def _is_ours(module: str) -> bool:
    """Whether a frame of ``module`` is actorch's own, or the dataclass machinery that built the options."""
    return module.startswith("actorch.") or module == "dataclasses"


def _deprecated(given: str, instead: str) -> None:
    """Warn that ``given`` is deprecated, and say what to pass ``instead``, at the user's line that gave it."""
    level, frame = 2, sys._getframe(1)  # stack level 2: the caller of this function
    while frame is not None and _is_ours(frame.f_globals.get("__name__", "")):
        level, frame = level + 1, frame.f_back  # type: ignore[assignment]
    warnings.warn(f"{given} is deprecated: pass {instead}", DeprecationWarning, stacklevel=level)


def recording(options: SystemOptions) -> bool:
    """Whether to keep a run record: ``record``, unless ``ACTORCH_RECORD`` says 0."""
    return options.record and os.environ.get(RECORD_ENV, "1").strip().lower() not in OFF


def otel_on(options: SystemOptions) -> bool:
    """Whether every node makes OpenTelemetry spans: ``otel``, else ``ACTORCH_OTEL``; else not.

    Raises:
        ValueError: ``ACTORCH_OTEL`` is read and is neither on (``1``,
            ``true``, ``yes``, ``on``) nor off (``0``, ``false``, ``no``,
            ``off``, empty).
        ImportError: It is on and the OpenTelemetry API cannot be imported
            (``pip install 'actorch[otel]'``); nothing has started.
    """
    on = options.otel
    if on is None:
        found = os.environ.get(OTEL_ENV, "").strip().lower()
        if found not in ON and found not in ("", *OFF):
            raise ValueError(f"{OTEL_ENV} must be 1 (on) or 0 (off), not {os.environ[OTEL_ENV]!r}")
        on = found in ON
    if on:
        import actorch._engine.otel  # noqa: F401, PLC0415 - the optional extra, checked before anything starts
    return on


def snapshot_directory(options: SystemOptions) -> str | None:
    """Where rank 0 keeps snapshots, as an absolute path: ``snapshots``, else ``ACTORCH_SNAPSHOTS``; None: nowhere."""
    chosen = options.snapshots if options.snapshots is not None else os.environ.get(SNAPSHOTS_ENV) or None
    return None if chosen is None else os.path.abspath(os.fspath(chosen))


def trace_path(options: SystemOptions) -> str | None:
    """Where ``run`` writes the run's timeline: ``trace``, else ``ACTORCH_TRACE``; None: nowhere."""
    if options.trace is not None:
        return os.fspath(options.trace)
    return os.environ.get(TRACE_ENV) or None


def status_address(options: SystemOptions) -> tuple[str, int] | None:
    """Where rank 0 serves the status: None when ``status`` is False or ``ACTORCH_STATUS_PORT`` is ``off``.

    The port is ``status_port``, else ``ACTORCH_STATUS_PORT``, else 0 (a free one).

    Raises:
        ValueError: ``ACTORCH_STATUS_PORT`` is read and is neither a port nor ``off``.
    """
    if not options.status:
        return None
    port = options.status_port
    if port is None:
        found = os.environ.get(STATUS_PORT_ENV, "")
        if found == STATUS_OFF:
            return None
        if found and (not found.isdigit() or not is_port(int(found))):
            raise ValueError(f"{STATUS_PORT_ENV} must be a port (0..65535) or {STATUS_OFF!r}, not {found!r}")
        port = int(found) if found else 0
    return options.status_host, port


_FIELDS = frozenset(field.name for field in dataclasses.fields(SystemOptions))


def options_of(
    taker: str,
    options: SystemOptions | None,
    keywords: Mapping[str, object],
    *,
    takes: frozenset[str] | tuple[str, ...] = _FIELDS,
    defaults: Mapping[str, object] | None = None,
) -> SystemOptions:
    """The options ``taker`` (``"run"``) was given: ``options`` (else ``defaults``) with ``keywords`` over them.

    Raises:
        TypeError: A keyword is not one of ``takes``, or ``options`` is not a ``SystemOptions``.
        ValueError: An option's value is not one it takes (see ``SystemOptions``).
    """
    unknown = [name for name in keywords if name not in takes]
    if unknown:
        raise TypeError(f"{taker}() got an unexpected keyword argument {unknown[0]!r}{_hint(unknown[0], takes, taker)}")
    if options is None:
        return SystemOptions(**{**(defaults or {}), **keywords})  # type: ignore[arg-type]
    if not isinstance(options, SystemOptions):
        raise TypeError(f"{taker}(options=...) takes a SystemOptions, not {options!r}")
    return dataclasses.replace(options, **keywords)  # type: ignore[arg-type]


def _hint(name: str, takes: frozenset[str] | tuple[str, ...], taker: str) -> str:
    """What a refusal of the keyword ``name`` adds: the option meant, if one is close, then every option."""
    every = f"its options: {', '.join(sorted(takes))}"
    if name in _FIELDS:
        return f": an option of run() that {taker}() does not take ({every})"
    close = difflib.get_close_matches(name, sorted(takes), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}? ({every})" if close else f" ({every})"


def launcher_environment(
    *,
    status: bool = True,
    status_port: int | None = None,
    log_level: str | None = None,
    record: bool = True,
    trace: str | None = None,
    otel: bool = False,
    snapshots: str | None = None,
) -> dict[str, str]:
    """What a launcher (``actorch run``) puts in the script's environment to give its ``run`` these options.

    They are the options ``run`` reads from the environment where the script
    leaves them at their defaults (``status_address``, ``recording``, and
    the log level), checked as ``SystemOptions`` checks
    them. An option left at its default sets nothing: what the environment
    says already holds.

    Raises:
        ValueError: A value is not one the option takes.
    """
    chosen = SystemOptions(
        status=status,
        status_port=status_port,
        log_level=log_level,
        record=record,
        trace=trace,
        otel=otel or None,
        snapshots=snapshots,
    )
    environment: dict[str, str] = {}
    if chosen.status_port is not None:
        environment[STATUS_PORT_ENV] = str(chosen.status_port)
    elif not chosen.status:
        environment[STATUS_PORT_ENV] = STATUS_OFF
    level = check_log_level(chosen.log_level)
    if level is not None:
        environment[LOG_LEVEL_ENV] = level
    if not chosen.record:
        environment[RECORD_ENV] = "0"
    if trace is not None:
        environment[TRACE_ENV] = os.path.abspath(trace)  # the script may change its directory
    if chosen.otel:
        environment[OTEL_ENV] = "1"
    if snapshots is not None:
        environment[SNAPSHOTS_ENV] = os.path.abspath(snapshots)  # every rank, whatever directory it runs in
    return environment
