"""Batches by reference on one host: who may get them, the slots reused round robin, the one copy out."""

from __future__ import annotations

import os

import torch

from actorch._stock.handover import Handover, Mappings, Slots, by_reference, carve, host_identity, room, usable
from actorch.rl import Batch


def test_usable_hands_over_only_to_another_process_of_this_host() -> None:
    here = host_identity()
    assert usable(None) is None
    assert usable((here, os.getpid(), 3)) is None, "the same process takes batches as they are"
    assert usable(("elsewhere", os.getpid() + 1, 3)) is None
    assert usable((here, os.getpid() + 1, 0)) is None
    assert usable((here, os.getpid() + 1, 3)) == Handover(here, os.getpid() + 1, 3)


def test_slots_are_taken_round_robin_and_grow_for_a_bigger_batch() -> None:
    slots = Slots(2)
    first, second = slots.take(100), slots.take(100)
    assert first is not second
    assert slots.take(100) is first
    bigger = slots.take(1000)
    assert bigger is not second
    assert bigger.nbytes() >= 1000


def batch_in(storage: torch.UntypedStorage) -> Batch:
    observations, finals = carve(storage, (3, 2, 4), torch.uint8, 2)
    observations.copy_(torch.arange(24, dtype=torch.uint8).view(3, 2, 4))
    finals.copy_(observations + 1)
    flags = torch.zeros((3, 2), dtype=torch.bool)
    return Batch("c", 4, observations, torch.ones(3, 2), torch.zeros(3, 2), torch.ones(3, 2), flags, flags, finals)


def test_batch_by_reference_names_its_slot_and_is_copied_out_whole() -> None:
    storage = Slots(1).take(room((3, 2, 4), torch.uint8, 2))
    sent = by_reference(batch_in(storage), storage)
    assert sent.slot is not None
    assert sent.observations.numel() == sent.next_observations.numel() == 0
    mappings = Mappings()
    taken = mappings.resolved(sent)
    assert taken.slot is None
    assert torch.equal(taken.observations, torch.arange(24, dtype=torch.uint8).view(3, 2, 4))
    assert torch.equal(taken.next_observations, taken.observations + 1)
    storage[0] = 200  # the collector writes the slot again: the batch taken keeps its own copy
    assert int(taken.observations[0, 0, 0]) == 0
    again = mappings.resolved(by_reference(batch_in(storage), storage))
    assert len(mappings) == 1, "a slot is mapped once"
    assert int(again.observations[0, 0, 0]) == 0
    mappings.clear()
    assert len(mappings) == 0
    assert mappings.resolved(taken) is taken, "a batch sent by value is left as it is"


def test_host_identity_is_stable_within_a_process() -> None:
    assert host_identity() == host_identity()
    assert host_identity()
