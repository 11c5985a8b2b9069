"""The parameter server: a model's parameters, an optimizer and a version, as an actor.

Trainers pull the parameters, compute gradients on their own data and push them
back. In ``"async"`` mode (Hogwild) every push is applied at once. In ``"sync"``
mode pushes accumulate until ``trainers`` of them have arrived; the last one
triggers one optimizer step on the averaged gradients and every pusher's
``await`` returns the new parameters. Large models are split by parameter name
over several servers (``shard=(index, count)``) that a :class:`ParameterClient`
drives as one.

The model and the optimizer's state live on the server's device (``spawn(...,
device="cuda:0")``). Gradients may come from any device; pulls and pushes take
``device=`` for the parameters they return.

Followers (observers acting on the newest policy, evaluators) ``watch`` the
server: a stream that delivers each new version as it is made, without polling.

A server spawned with ``Restart(relocate=True)`` saves its parameters,
optimizer state and version (``Actor.save_snapshot``) every ``snapshot_every``
pushes, or when asked (:meth:`ParameterServer.save`): when its node is lost it
starts again elsewhere from the last save, and with a snapshot directory
(``run(snapshots=DIR)``) so does a named server in a job started again.
"""

from __future__ import annotations

import asyncio
import copy
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast, overload

import torch
from torch import nn

from actorch._actors.actor import Actor
from actorch._base.codec import Shared, serializable, shared
from actorch._base.errors import SnapshotError
from actorch._stock.import_paths import resolve
from actorch._stock.transfer import DeviceLike, as_device, to_device

__all__ = ["ParameterServer", "Parameters", "assign_shards"]

ModelFactory = Callable[[], nn.Module] | str
OptimizerClass = type[torch.optim.Optimizer] | str

SNAPSHOT_FORMAT = "actorch.params"
SNAPSHOT_VERSION = 1


@serializable()
@dataclass(frozen=True)
class Parameters:
    """A version of a server's parameters.

    The tensors are shared by every caller that pulled this version: treat them
    as read-only (``model.load_state_dict`` copies them, which is what you want).

    Attributes:
        version: How many optimizer steps the server had taken.
        tensors: The parameters by name, as in the model's ``named_parameters()``.
    """

    version: int
    tensors: dict[str, torch.Tensor] = field(repr=False)

    def to(self, device: DeviceLike) -> Parameters:
        """This version with its tensors on ``device``; itself when they are all there already.

        The copies are queued together, with one wait per GPU they leave.

        Raises:
            ValueError: ``device`` names no device.
        """
        target = as_device(device)
        if all(tensor.device == target for tensor in self.tensors.values()):
            return self
        return Parameters(self.version, to_device(self.tensors, target))


def assign_shards(sizes: Mapping[str, int], count: int) -> list[list[str]]:
    """Split parameter names over ``count`` shards, balancing their element counts.

    Largest first, each to the lightest shard so far; ties break by name and by
    shard index, so every node computes the same split.

    Raises:
        ValueError: If ``count`` is below 1 or above the number of parameters.
    """
    if not 1 <= count <= max(1, len(sizes)):
        raise ValueError(f"cannot split {len(sizes)} parameters over {count} shards")
    shards: list[list[str]] = [[] for _ in range(count)]
    loads = [0] * count
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        lightest = min(range(count), key=lambda i: (loads[i], i))
        shards[lightest].append(name)
        loads[lightest] += sizes[name]
    return shards


class _SnapshotForward(nn.Module):
    """Runs a module on differentiable copies of its parameters taken at the call."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module
        # functional_call swaps the module's attributes for the call's duration:
        # passes on several RPC threads at once must not see each other's copies.
        self._swap = threading.Lock()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with self._swap:
            copies = {name: param.clone() for name, param in self.module.named_parameters()}
            return torch.func.functional_call(self.module, copies, args, kwargs)


@dataclass
class _Round:
    """Gradients of a sync-mode round collected so far."""

    sums: dict[str, torch.Tensor]
    counts: dict[str, int]
    pushes: int
    done: asyncio.Future[Parameters]


class ParameterServer(Actor):
    """Holds (a shard of) a model's parameters and applies the gradients trainers push.

    Args:
        model: Builds the model on the server's node: a callable taking no
            arguments, or its import path (``"package.module:factory"``; strict
            mode cannot send a callable).
        optimizer: The optimizer class, or its import path (``"torch.optim.Adam"``).
        optimizer_kwargs: Keyword arguments for the optimizer (``{"lr": 0.01}``).
        mode: ``"async"`` applies each push at once; ``"sync"`` averages the
            pushes of ``trainers`` trainers and steps once.
        trainers: Pushes per step in sync mode.
        shard: ``(index, count)``: keep only this shard's parameters (see
            :func:`assign_shards`); ``(0, 1)`` keeps them all.
        snapshot_every: For a server spawned with ``Restart(relocate=True)``:
            save its parameters, optimizer state and version
            (``Actor.save_snapshot``) each time this many more pushes were
            applied (in sync mode, at the step that ends a round), so that a
            relocation after its node is lost, or a job started again with
            the same snapshot directory, starts it from there, losing the
            steps after that save. The push that triggers a save waits for
            it; other pushes go on meanwhile (the save holds copies). None:
            only :meth:`save` saves. Without relocation, nothing is sent.

    The model is built, then moved to the server's device (``self.device``,
    set by ``spawn(..., device=...)``) before the optimizer is made, so the
    parameters, their gradients and the optimizer's state all live there.

    Raises:
        TypeError: If ``model`` is a built ``nn.Module``: the server builds its
            own, so pass what builds it.
        ValueError: If an option is out of range or an import path does not resolve.
    """

    # Sync mode holds each push open until its round completes; handlers only
    # interleave at awaits, so the state still needs no lock.
    max_concurrency = 1 << 16

    def __init__(
        self,
        model: ModelFactory,
        *,
        optimizer: OptimizerClass = "torch.optim.SGD",
        optimizer_kwargs: Mapping[str, Any] | None = None,
        mode: str = "async",
        trainers: int | None = None,
        shard: tuple[int, int] | list[int] = (0, 1),
        snapshot_every: int | None = None,
    ) -> None:
        if snapshot_every is not None and (
            not isinstance(snapshot_every, int) or isinstance(snapshot_every, bool) or snapshot_every <= 0
        ):
            raise ValueError(f"snapshot_every must be a positive int of pushes, or None, not {snapshot_every!r}")
        if mode not in ("async", "sync"):
            raise ValueError(f"mode must be 'async' or 'sync', not {mode!r}")
        if mode == "sync" and (not isinstance(trainers, int) or trainers < 1):
            raise ValueError(f"sync mode needs trainers >= 1, not {trainers!r}")
        if mode == "async" and trainers is not None:
            raise ValueError("trainers counts the pushes of a sync-mode step; async mode applies each push")
        index, count = shard
        if not 0 <= index < count:
            raise ValueError(f"shard must be (index, count) with 0 <= index < count, not {tuple(shard)}")
        if isinstance(model, nn.Module):  # callable too: calling it would run its forward() with no input
            raise TypeError(
                f"ParameterServer builds its model on its own node: it takes a function that builds the model, "
                f"not a built {type(model).__qualname__} module. Pass a function that takes no arguments and "
                f"returns the module (def make_model(): return ...), functools.partial(ModuleClass, ...), or the "
                f"function's import path ('package.module:make_model')"
            )
        module = resolve(model, "model factory")()
        if not isinstance(module, nn.Module):
            raise ValueError(f"the model factory returned a {type(module).__qualname__}, not a torch.nn.Module")
        module.to(self.device)
        named = dict(module.named_parameters())
        owned = assign_shards({name: p.numel() for name, p in named.items()}, count)[index]
        self.mode = mode
        self.trainers = trainers
        self.shard = (index, count)
        self._module = module
        self._forward = _SnapshotForward(module)  # one, so its lock covers every trainer
        self._params = {name: named[name] for name in sorted(owned)}
        optimizer_class = resolve(optimizer, "optimizer")
        self._optimizer: torch.optim.Optimizer = optimizer_class(
            list(self._params.values()), **dict(optimizer_kwargs or {})
        )
        self._version = 0
        self._published: dict[torch.device, Parameters] = {}  # the current version, by device
        self._sharing: dict[torch.device, Shared] = {}  # what watch streams send of it: one copy per host or GPU
        self._round: _Round | None = None
        self._rrefs: list[Any] | None = None
        self._counts = {"pulls": 0, "pulls_unchanged": 0, "pushes": 0, "steps": 0, "watched": 0, "saved": 0}
        self._snapshot_every = snapshot_every
        self._saved_at = 0  # pushes applied when the last snapshot was saved
        self._watchers = 0  # watch streams open
        self._moved = asyncio.Event()  # set (and replaced) when the version moves

    async def names(self) -> list[str]:
        """The names of the parameters this server holds, sorted."""
        return list(self._params)

    async def version(self) -> int:
        """How many optimizer steps the server has taken."""
        return self._version

    async def pull(self, since: int | None = None, *, device: DeviceLike | None = None) -> Parameters | None:
        """The current parameters, or ``None`` when ``since`` is already the current version.

        Pass the version you hold as ``since`` to skip transferring what you have.
        Once :meth:`parameter_rrefs` or :meth:`module_rref` has handed out
        RRefs, the parameters may change without a step the server sees, so
        every pull then sends them.

        Args:
            since: The version the caller holds.
            device: A device of the server's node to put the tensors on before
                they leave (one copy per version and device, shared by every
                pull of it). A caller on the server's node gets the tensors as
                they are, so it names its own device here; ``"cpu"`` sends host
                tensors to any caller. None: the server's device; across
                nodes the runtime delivers them (through a device map, or
                staged to the calling actor's device).

        Raises:
            ValueError: ``device`` names no device.
        """
        target = self._target(device)
        self._counts["pulls"] += 1
        if self._rrefs is not None:
            self._published = {}  # RRef holders may have changed them since
        elif since is not None and since == self._version:
            self._counts["pulls_unchanged"] += 1
            return None
        return self._snapshot(target)

    async def push(self, grads: dict[str, torch.Tensor], *, device: DeviceLike | None = None) -> Parameters:
        """Apply (async) or contribute (sync) gradients; return the parameters after the step.

        ``grads`` maps parameter names to gradients of the same shape, on any
        device and of any floating dtype: each is moved to the server's device
        and cast to its parameter's dtype. Names this server does not hold are
        refused, missing names mean no gradient. In sync mode the call returns
        when the round's last push has arrived and the step is taken; a pusher
        whose deadline expires first leaves its gradients in the round.
        ``device`` places the returned parameters as in :meth:`pull`.

        Raises:
            KeyError: If a name is not a parameter of this server.
            ValueError: If a gradient's shape differs from its parameter's, or ``device`` names no device.
            Exception: What the optimizer step raised; in sync mode, every pusher of the round gets it.
        """
        target = self._target(device)
        self._check(grads)
        self._counts["pushes"] += 1
        if self.mode == "async":
            self._step(grads)
            stepped = self._snapshot(target)
            await self._save_if_due()
            return stepped
        collected = self._round
        if collected is None:
            future: asyncio.Future[Parameters] = asyncio.get_running_loop().create_future()
            collected = self._round = _Round({}, {}, 0, future)
        for name, grad in grads.items():
            total = collected.sums.get(name)
            if total is None:
                collected.sums[name] = self._placed(name, grad, copy=True)  # the round's own: add_ writes into it
            else:
                total.add_(self._placed(name, grad))
            collected.counts[name] = collected.counts.get(name, 0) + 1
        collected.pushes += 1
        if collected.pushes < (self.trainers or 1):
            return self._snapshot_of(await asyncio.shield(collected.done), target)
        self._round = None
        try:
            self._step({name: total.div_(collected.counts[name]) for name, total in collected.sums.items()})
            collected.done.set_result(self._snapshot())
        except Exception as exc:  # noqa: BLE001 - every pusher of the round gets the step's error
            collected.done.set_exception(exc)
        params = collected.done.result()
        await self._save_if_due()
        return self._snapshot_of(params, target)

    async def save(self) -> bool:
        """Save a snapshot now: the parameters, the optimizer's state and the version (``Actor.save_snapshot``).

        For a server spawned with ``Restart(relocate=True)``; it returns once
        rank 0 holds the snapshot (and, with a snapshot directory, once it is
        on disk). Pushes go on meanwhile: the snapshot holds copies.

        Returns:
            Whether it was kept: False, and nothing sent, for a server that is not relocatable.
        """
        return await self._save()

    def restore(self, state: dict[str, Any]) -> None:
        """Take the snapshot a relocation or a restarted job hands back: parameters, optimizer state, version.

        Raises:
            SnapshotError: The state is not a parameter server's snapshot, or
                not one of this server's shard and parameters.
        """
        where = f"the snapshot given to {self.name or 'a ParameterServer'}"
        if not isinstance(state, dict) or state.get("format") != SNAPSHOT_FORMAT:
            raise SnapshotError(f"{where} is not a parameter server's snapshot")
        if state.get("format_version") != SNAPSHOT_VERSION:
            raise SnapshotError(f"{where} has format version {state.get('format_version')!r}, not {SNAPSHOT_VERSION}")
        if list(state.get("shard", ())) != list(self.shard):
            raise SnapshotError(f"{where} is of shard {state.get('shard')!r}, this server holds shard {self.shard}")
        params, version = state.get("parameters"), state.get("version")
        if not isinstance(params, dict) or sorted(params) != list(self._params) or not isinstance(version, int):
            held = sorted(params) if isinstance(params, dict) else params
            raise SnapshotError(f"{where} holds parameters {held!r}, this server {list(self._params)}")
        try:
            self._check(params)
            with torch.no_grad():
                for name, value in params.items():
                    self._params[name].copy_(value)
            self._optimizer.load_state_dict(state["optimizer"])
        except (KeyError, TypeError, ValueError) as exc:
            raise SnapshotError(f"{where} does not fit this server: {exc}") from exc
        self._version = version
        self._published = {}
        self._saved_at = self._counts["pushes"]

    async def load(self, tensors: dict[str, torch.Tensor]) -> int:
        """Overwrite parameters by name (a checkpoint, a warm start), from any device; return the new version.

        Raises:
            KeyError: If a name is not a parameter of this server.
            ValueError: If a shape differs from its parameter's.
        """
        self._check(tensors)
        with torch.no_grad():
            for name, value in tensors.items():
                self._params[name].copy_(value)
        self._advance()
        return self._version

    @overload
    def watch(
        self, since: int | None = None, *, parameters: Literal[True] = True, device: DeviceLike | None = None
    ) -> AsyncIterator[Parameters]: ...

    @overload
    def watch(
        self, since: int | None = None, *, parameters: Literal[False], device: DeviceLike | None = None
    ) -> AsyncIterator[int]: ...

    async def watch(
        self, since: int | None = None, *, parameters: bool = True, device: DeviceLike | None = None
    ) -> AsyncIterator[Parameters | int]:
        """Stream each new version as it is made, until the consumer leaves: ``ref.stream(ParameterServer.watch)``.

        The first item comes at once when the server's version is not
        ``since`` (None: always, the current version); after that, one item
        each time the version moves past the last one sent, woken by the step
        or :meth:`load` that moved it. A watcher slower than the steps gets
        the newest version when it has room, skipping the ones it was too slow
        for; up to the stream's window of versions may wait for it, each a copy
        of the parameters, so watch with a small window (``.with_window(1)``).
        A ``since`` this server never reached (another server's version) is
        answered at once with the current one.

        Args:
            since: The version the watcher holds, or None.
            parameters: Stream :class:`Parameters` (as :meth:`pull` returns
                them); False: just the version numbers, which cost nothing to send.
            device: Where the tensors leave from, as for :meth:`pull`.

        Raises:
            TypeError: If ``since`` is not an int or None, or ``parameters`` not a bool.
            ValueError: If ``since`` is negative, or ``device`` names no device.
        """
        if since is not None and (not isinstance(since, int) or isinstance(since, bool)):
            raise TypeError(f"since must be a version (an int) or None, not {type(since).__qualname__}")
        if since is not None and since < 0:
            raise ValueError(f"since must be a version >= 0, not {since}")
        if not isinstance(parameters, bool):
            raise TypeError(f"parameters must be a bool, not {type(parameters).__qualname__}")
        target = self._target(device)
        sent = since
        self._watchers += 1
        try:
            while True:
                if sent == self._version:
                    await self._moved.wait()
                    continue
                sent = self._version
                self._counts["watched"] += 1
                # A watcher receives Parameters: the Shared wrapper only says to place them once per host or GPU.
                yield cast(Parameters, self._watched(target)) if parameters else sent
        finally:
            self._watchers -= 1

    async def parameter_rrefs(self) -> list[Any]:
        """``torch.distributed.rpc.RRef`` s to the parameters, for ``DistributedOptimizer``.

        Raises:
            UnsupportedError: If the system does not run on torch RPC.
        """
        if not self._rrefs:
            self._rrefs = [self.system.rref(param) for param in self._params.values()]
        return self._rrefs

    async def module_rref(self) -> Any:
        """An RRef to the server's model, to run its forward pass under distributed autograd.

        ``rref.rpc_sync().forward(x)`` runs the model on the server on a copy of
        its parameters taken for that pass (gradients still flow to the
        parameters), so trainers running at once never trip autograd's check on
        weights another trainer's optimizer step changed in place (Hogwild).

        Raises:
            UnsupportedError: If the system does not run on torch RPC.
        """
        self._rrefs = self._rrefs or []
        return self.system.rref(self._forward)

    async def statistics(self) -> dict[str, Any]:
        """Version, mode, shard, device, counters, watch streams open, and pushes waiting for the sync round.

        ``saved`` counts the snapshots kept for relocation (:meth:`save`, ``snapshot_every``).
        """
        return {
            **self._counts,
            "version": self._version,
            "mode": self.mode,
            "shard": list(self.shard),
            "device": str(self.device),
            "parameters": sum(p.numel() for p in self._params.values()),
            "waiting": 0 if self._round is None else self._round.pushes,
            "watchers": self._watchers,
        }

    # ------------------------------------------------------------------ internals

    def _check(self, tensors: Mapping[str, Any]) -> None:
        for name, value in tensors.items():
            param = self._params.get(name)
            if param is None:
                raise KeyError(f"{name!r} is not a parameter of {self.name or 'this server'} (shard {self.shard})")
            if not isinstance(value, torch.Tensor) or value.shape != param.shape:
                got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__qualname__
                raise ValueError(f"{name!r} must be a tensor of shape {tuple(param.shape)}, got {got}")

    def _target(self, device: DeviceLike | None) -> torch.device:
        return self.device if device is None else as_device(device)

    def _placed(self, name: str, grad: torch.Tensor, *, copy: bool = False) -> torch.Tensor:
        """``grad`` on its parameter's device and in its dtype; a copy if ``copy``, else maybe itself."""
        param = self._params[name]
        return grad.detach().to(param.device, param.dtype, non_blocking=param.device.type == "cuda", copy=copy)

    def _step(self, grads: Mapping[str, torch.Tensor]) -> None:
        for name, param in self._params.items():
            grad = grads.get(name)
            param.grad = None if grad is None else self._placed(name, grad)
        with torch.no_grad():
            self._optimizer.step()
        self._optimizer.zero_grad(set_to_none=True)
        self._counts["steps"] += 1
        self._advance()

    async def _save_if_due(self) -> None:
        """Save a snapshot if ``snapshot_every`` more pushes were applied since the last one."""
        every = self._snapshot_every
        if every is not None and self._counts["pushes"] - self._saved_at >= every:
            await self._save()

    async def _save(self) -> bool:
        """Save the parameters (this version's copies), a copy of the optimizer's state and the version."""
        self._saved_at = self._counts["pushes"]
        state = {
            "format": SNAPSHOT_FORMAT,
            "format_version": SNAPSHOT_VERSION,
            "shard": list(self.shard),
            "version": self._version,
            "parameters": dict(self._snapshot().tensors),  # copies: later steps change the live ones in place
            "optimizer": copy.deepcopy(self._optimizer.state_dict()),
        }
        saved = await self.save_snapshot(state)
        self._counts["saved"] += saved
        return saved

    def _advance(self) -> None:
        self._version += 1
        self._published = {}
        self._moved.set()  # wakes the watchers
        self._moved = asyncio.Event()

    def _watched(self, device: torch.device) -> Shared | Parameters:
        """The current snapshot as every watcher gets it: placed once per host or GPU and shared, read-only."""
        snapshot = self._snapshot(device)
        sent = self._sharing.get(device)
        if sent is None or sent.value is not snapshot:
            sent = self._sharing[device] = shared(snapshot)
        return sent

    def _snapshot(self, device: torch.device | None = None) -> Parameters:
        # One copy per version and device, shared by every pull of it: the live
        # parameters change in place at the next step, and replies may leave later.
        target = self.device if device is None else device
        published = self._published.get(target)
        if published is None:
            here = self._published.get(self.device)
            if here is None:
                here = Parameters(self._version, {name: p.detach().clone() for name, p in self._params.items()})
                self._published[self.device] = here
            published = self._published[target] = here.to(target)
        return published

    def _snapshot_of(self, params: Parameters, device: torch.device) -> Parameters:
        """``params`` (a sync round's result) on ``device``, from the cache while it is the current version."""
        if params is self._published.get(self.device):
            return self._snapshot(device)
        return params.to(device)
