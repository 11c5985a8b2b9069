"""The model-parallel RNN of PyTorch's RPC tutorial: embedding and decoder on a server, the LSTM on the trainer.

Run it with ``python examples/model_parallel_rnn.py`` (``--quick`` for a short
run); it needs nothing beyond torch. Two processes, as in the tutorial
("Implementing Distributed Pipeline/Model Parallel with RPC", the RNN part):
rank 1 is the parameter server and hosts the model's ``EmbeddingTable`` and
``Decoder`` as actors; rank 0 is the trainer, holds the LSTM, and runs the
forward pass through actor calls inside a distributed autograd context, so
``dist_autograd.backward`` reaches the server's parameters and one
``DistributedOptimizer`` steps them where they live, together with the local LSTM's.

The data are synthetic, as in the tutorial, but learnable: sequences that count
up modulo the vocabulary, and the target of each token is the next one. It
prints the mean loss of every epoch and how far the server's parameters moved.
docs/guides/tutorials.md compares it with the tutorial's program.

torch 2.13's DistributedOptimizer prints a DeprecationWarning about TorchScript
once per node that holds parameters; torch forces it past warning filters.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time
from typing import Any

import torch
import torch.distributed.autograd as dist_autograd
from torch import nn
from torch.distributed.optim import DistributedOptimizer

import actorch


class RemoteModule(actorch.Actor):
    """A part of the model that lives on the parameter server; subclasses build ``self.module``."""

    module: nn.Module

    async def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x)

    async def parameter_rrefs(self) -> list[Any]:
        """RRefs to this part's parameters, owned by this node, for the DistributedOptimizer."""
        return [self.system.rref(p) for p in self.module.parameters()]

    async def weights(self) -> list[torch.Tensor]:
        return [p.detach().clone() for p in self.module.parameters()]


class EmbeddingTable(RemoteModule):
    """The encoding layers of the RNN model."""

    def __init__(self, ntoken: int, ninp: int, dropout: float) -> None:
        encoder = nn.Embedding(ntoken, ninp)
        nn.init.uniform_(encoder.weight, -0.1, 0.1)
        self.module = nn.Sequential(encoder, nn.Dropout(dropout))


class Decoder(RemoteModule):
    """The decoding layers of the RNN model."""

    def __init__(self, ntoken: int, nhid: int, dropout: float) -> None:
        decoder = nn.Linear(nhid, ntoken)
        nn.init.zeros_(decoder.bias)
        nn.init.uniform_(decoder.weight, -0.1, 0.1)
        self.module = nn.Sequential(nn.Dropout(dropout), decoder)


class RNNModel:
    """The distributed RNN: the remote embedding table and decoder around a local LSTM."""

    def __init__(
        self,
        table: actorch.ActorRef[EmbeddingTable],
        decoder: actorch.ActorRef[Decoder],
        ninp: int,
        nhid: int,
        nlayers: int,
        dropout: float = 0.5,
    ) -> None:
        self.table, self.decoder = table, decoder
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)

    async def forward(
        self, tokens: torch.Tensor, hidden: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        emb = await self.table.call(EmbeddingTable.forward, tokens)
        output, hidden = self.rnn(emb, hidden)
        return await self.decoder.call(Decoder.forward, output), hidden

    async def parameter_rrefs(self, system: actorch.ActorSystem) -> list[Any]:
        remote = await asyncio.gather(
            self.table.call(EmbeddingTable.parameter_rrefs), self.decoder.call(Decoder.parameter_rrefs)
        )
        return [*remote[0], *[system.rref(p) for p in self.rnn.parameters()], *remote[1]]


def batches(count: int, seq_len: int, batch: int, ntoken: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Columns that count up modulo ``ntoken`` from random starts; each token's target is the next one."""
    out = []
    for _ in range(count):
        starts = torch.randint(0, ntoken, (1, batch))
        sequence = (starts + torch.arange(seq_len + 1).unsqueeze(1)) % ntoken  # (seq_len + 1, batch)
        out.append((sequence[:-1], sequence[1:]))
    return out


def seed(rank: int) -> None:
    """Run on every node before it serves: the same seed everywhere, one torch thread per process."""
    torch.manual_seed(0)
    torch.set_num_threads(1)


async def main(system: actorch.ActorSystem) -> None:
    args = parse_args()
    ntoken, ninp, nhid, nlayers, seq_len, batch = 10, 16, 32, 2, 12, 8
    table = await system.spawn(EmbeddingTable, args=(ntoken, ninp, 0.1), name="ps/embedding", on=1)
    decoder = await system.spawn(Decoder, args=(ntoken, nhid, 0.1), name="ps/decoder", on=1)
    model = RNNModel(table, decoder, ninp, nhid, nlayers, dropout=0.1)
    # DistributedOptimizer makes blocking torch RPC calls: build it off the event loop.
    rrefs = await model.parameter_rrefs(system)
    optimizer = await asyncio.to_thread(DistributedOptimizer, torch.optim.Adam, rrefs, lr=args.lr)
    before = await asyncio.gather(table.call(EmbeddingTable.weights), decoder.call(Decoder.weights))
    criterion = nn.CrossEntropyLoss()
    hidden = (torch.zeros(nlayers, batch, nhid), torch.zeros(nlayers, batch, nhid))
    print(f"trainer on rank 0 (LSTM), embedding and decoder on rank 1; chance loss is {math.log(ntoken):.2f}")
    started = time.perf_counter()
    losses: list[float] = []
    for epoch in range(1, args.epochs + 1):
        epoch_losses = []
        for tokens, target in batches(args.batches, seq_len, batch, ntoken):
            with dist_autograd.context() as context_id:
                hidden = (hidden[0].detach(), hidden[1].detach())
                output, hidden = await model.forward(tokens, hidden)
                loss = criterion(output.reshape(-1, ntoken), target.reshape(-1))
                # Both block on torch RPC; worker threads keep the event loop serving.
                await asyncio.to_thread(dist_autograd.backward, context_id, [loss])
                await asyncio.to_thread(optimizer.step, context_id)
            epoch_losses.append(loss.item())
        losses.append(sum(epoch_losses) / len(epoch_losses))
        print(f"  epoch {epoch:2d}  loss {losses[-1]:.3f}")
    after = await asyncio.gather(table.call(EmbeddingTable.weights), decoder.call(Decoder.weights))
    moved = [sum(float((b - a).norm()) for a, b in zip(*pair, strict=True)) for pair in zip(before, after, strict=True)]
    print(f"the server's parameters moved by {moved[0]:.2f} (embedding) and {moved[1]:.2f} (decoder)")
    print(
        f"done: {args.epochs} epochs, loss {losses[0]:.3f} -> {losses[-1]:.3f}, {time.perf_counter() - started:.1f} s"
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batches", type=int, default=10, help="batches per epoch")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--quick", action="store_true", help="a short run: 5 epochs")
    args = parser.parse_args()
    if args.quick:
        args.epochs = 5
    return args


if __name__ == "__main__":
    parse_args()  # --help and bad flags end here, before any process starts
    actorch.run(main, world_size=2, setup=seed)
