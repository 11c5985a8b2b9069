"""Every tensor arrives bitwise as it was sent, or is refused with ``SerializationError`` naming where it sat.

In one process through the codec (inlined in the bytes, on the side list, as
parts), and between real processes over torch RPC, with the fast lane and
without: ``tensor_fidelity.py`` draws the payloads there. The tensors are drawn
by ``tests/mp_scripts/tensor_cases.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from _mp import Finished, run_script
from hypothesis import HealthCheck, given, settings
from tensor_cases import bits, payloads, quietly

from actorch import SerializationError
from actorch._base.channels.route import TensorRoute
from actorch._base.codec import Codec
from actorch._engine.wire import message_size

ROUTE = TensorRoute(1)
"""Bound for another process: small CPU tensors ride inside the bytes, the rest on the side list."""

pytestmark = [
    # torch warns, once per process, on making kinds it deprecates or calls beta: the receiver rebuilds them.
    pytest.mark.filterwarnings("ignore:.*quantized tensor creation functions.*deprecated:UserWarning"),
    pytest.mark.filterwarnings("ignore:Sparse (CSR|CSC|BSR|BSC) tensor support is in beta state:UserWarning"),
    pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental:UserWarning"),
]


def send(value: Any, *, route: TensorRoute | None = ROUTE, copy_tensors: bool = False) -> Any:
    """``value`` encoded and decoded, as another process (or this one, without a route) would receive it."""
    codec = Codec()
    data, side = codec.encode(value, route=route, copy_tensors=copy_tensors)
    return codec.decode(data, side)


def side_list(value: Any, *, route: TensorRoute | None = ROUTE) -> list[Any]:
    return Codec().encode(value, route=route)[1]


# ---------------------------------------------------------------------- what arrived wrong before


def test_codec_sends_a_conjugate_view_as_its_values() -> None:
    sent = torch.tensor([1 + 2j, 3 - 4j]).conj()  # the values [1-2j, 3+4j], memory holding [1+2j, 3-4j]
    assert sent.is_conj()
    [received] = send([sent])
    assert received.tolist() == [1 - 2j, 3 + 4j]


def test_codec_sends_a_negative_view_as_its_values() -> None:
    sent = torch.tensor([1 + 4j]).conj().imag  # the value -4.0, memory holding 4.0
    assert sent.is_neg()
    [received] = send([sent])
    assert received.tolist() == [-4.0]


def test_codec_sends_a_noncontiguous_conjugate_view_as_its_values() -> None:
    base = torch.tensor([[1 + 1j, 2 + 2j], [3 + 3j, 4 + 4j]])
    sent = base.t().conj()
    [received] = send([sent])
    assert torch.equal(received, base.t().conj().resolve_conj())


def test_codec_sends_an_efficient_zero_tensor_as_zeros() -> None:
    sent = torch._efficientzerotensor(3)  # no memory behind it
    [received] = send([sent])
    assert received.tolist() == [0.0, 0.0, 0.0]


def test_codec_gives_torch_rpc_a_real_tensor_for_a_large_efficient_zero_one() -> None:
    # torch RPC's serializer aborts the process on an efficient-zero tensor.
    [carried] = side_list([torch._efficientzerotensor(10_000)])
    assert not carried._is_zerotensor()
    assert torch.equal(carried, torch.zeros(10_000))


def test_codec_sends_an_empty_tensor_as_its_metadata_whatever_its_storage() -> None:
    # An empty view may start past its empty storage; torch RPC's receiver aborts the process on one.
    sent = torch.zeros(0, 4, dtype=torch.float8_e4m3fn).narrow(1, 3, 0)
    assert sent.storage_offset() == 3
    assert side_list([sent]) == [], "nothing to carry: the message holds its dtype, shape and strides"
    [received] = send([sent])
    assert (received.shape, received.stride(), received.dtype) == (sent.shape, sent.stride(), sent.dtype)
    assert received.storage_offset() == 0


def test_codec_gives_torch_rpc_an_empty_tensor_that_requires_grad_starting_within_its_storage() -> None:
    # One that requires grad keeps torch RPC's path (distributed autograd records it there).
    sent = torch.zeros(0, 4, requires_grad=True).narrow(1, 3, 0)
    assert sent.storage_offset() == 3
    [carried] = side_list([sent])
    assert carried.storage_offset() == 0
    assert carried.shape == sent.shape
    assert carried.requires_grad


# ---------------------------------------------------------------------- kinds that travel as their parts

SPARSE = {
    "coo": lambda: torch.tensor([[0.0, 2.0], [3.0, 0.0]]).to_sparse(),
    "coo-uncoalesced": lambda: torch.sparse_coo_tensor(
        torch.tensor([[0, 0], [1, 1]]), torch.tensor([1.0, 2.0]), (2, 2), check_invariants=True
    ),
    "coo-hybrid": lambda: torch.arange(6.0).reshape(2, 3).to_sparse(1),
    "csr": lambda: torch.tensor([[0.0, 2.0], [3.0, 0.0]]).to_sparse_csr(),
    "csc": lambda: torch.tensor([[0.0, 2.0], [3.0, 0.0]]).to_sparse_csc(),
    "bsr": lambda: torch.arange(16.0).reshape(4, 4).to_sparse_bsr((2, 2)),
    "bsc": lambda: torch.arange(16.0).reshape(4, 4).to_sparse_bsc((2, 2)),
    "complex-coo-conjugated": lambda: torch.tensor([[0, 1 + 2j], [3 - 1j, 0]]).to_sparse().conj(),
}


@pytest.mark.parametrize("make", SPARSE.values(), ids=SPARSE.keys())
@pytest.mark.parametrize("route", [ROUTE, None], ids=["other process", "same process"])
def test_codec_carries_a_sparse_tensor_of_every_layout(make: Any, route: TensorRoute | None) -> None:
    sent = quietly(make)
    [received] = send([sent], route=route)
    assert received.layout == sent.layout
    assert bits(received) == bits(sent)


@pytest.mark.parametrize("make", SPARSE.values(), ids=SPARSE.keys())
def test_codec_sends_a_small_sparse_tensor_inside_the_bytes(make: Any) -> None:
    assert side_list([quietly(make)]) == []  # no tensor of its own: the fast lane may carry it


def test_codec_leaves_nothing_on_the_side_list_whose_size_is_unknown() -> None:
    # Sizing a message reads each side tensor's nbytes, which a sparse tensor does not have.
    dense = torch.ones(100, 100)  # values too large to ride inside the bytes
    side = side_list([dense.to_sparse(), quietly(dense.to_sparse_csr)])
    assert side
    assert all(tensor.layout == torch.strided for tensor in side)
    assert message_size(b"", side) >= 2 * dense.nbytes


QUANTIZED = {
    "per-tensor": lambda: torch.quantize_per_tensor(torch.tensor([1.0, 2.5, -3.0]), 0.5, 3, torch.quint8),
    "per-channel": lambda: torch.quantize_per_channel(
        torch.arange(6.0).reshape(2, 3), torch.tensor([0.1, 0.2]), torch.tensor([0, 1]), 0, torch.qint8
    ),
    "per-channel-float-zero-points": lambda: torch.quantize_per_channel(
        torch.arange(6.0).reshape(2, 3), torch.tensor([0.1, 0.2]), torch.tensor([0.5, 1.0]), 0, torch.quint8
    ),
    "qint32": lambda: torch.quantize_per_tensor(torch.tensor([1.0, -2.0]), 0.25, 0, torch.qint32),
    "empty": lambda: torch.quantize_per_tensor(torch.ones(2, 0), 0.5, 3, torch.quint8),  # torch RPC aborts on it
    "transposed": lambda: torch.quantize_per_tensor(torch.arange(6.0).reshape(2, 3), 0.5, 3, torch.quint8).t(),
}


@pytest.mark.parametrize("make", QUANTIZED.values(), ids=QUANTIZED.keys())
def test_codec_carries_a_quantized_tensor_as_its_integers_and_scales(make: Any) -> None:
    sent = quietly(make)
    [received] = send([sent])
    assert received.qscheme() == sent.qscheme()
    assert bits(received) == bits(sent)
    assert side_list([sent]) == []


def test_codec_keeps_a_jagged_nested_tensor_whole_for_torch_rpc() -> None:
    sent = torch.nested.nested_tensor([torch.ones(2, 3), torch.zeros(1, 3)], layout=torch.jagged)
    [carried] = side_list([sent])
    assert carried is sent
    assert message_size(b"", [carried]) > 0


# ---------------------------------------------------------------------- kinds refused by name

REFUSED = {
    "nested-strided": (
        lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]),
        "nested tensor of strided layout.*layout=torch.jagged",
    ),
    "mkldnn": (lambda: torch.ones(3).to_mkldnn(), "layout torch._mkldnn cannot travel.*to_dense"),
    "sparse-requires-grad": (
        lambda: torch.ones(2, 2).to_sparse().requires_grad_(),
        "sparse tensor that requires grad cannot travel",
    ),
    "sparse-meta": (lambda: torch.empty((2, 2), layout=torch.sparse_coo, device="meta"), "meta tensor has no data"),
    "quantized-packed": (
        lambda: torch.quantize_per_tensor(torch.ones(4), 0.5, 0, torch.quint4x2),
        "quantized tensor of dtype torch.quint4x2 cannot travel.*dequantize",
    ),
}


ROUTES = {"other process": ROUTE, "same process": None}
REFUSALS = [
    pytest.param(make, why, route, id=f"{place}-{kind}")
    for kind, (make, why) in REFUSED.items()
    for place, route in ROUTES.items()
    if route is not None or kind != "quantized-packed"  # a quantized tensor stays whole within a process
]


@pytest.mark.parametrize(("make", "why", "route"), REFUSALS)
def test_codec_refuses_a_tensor_with_no_faithful_form_naming_its_argument(
    make: Any, why: str, route: TensorRoute | None
) -> None:
    tensor = quietly(make)
    with pytest.raises(SerializationError, match=rf"^kwargs\['batch'\]\[1\]: .*{why}"):
        Codec().encode([(1,), {"batch": [torch.ones(1), tensor]}], route=route, arguments=True)


def test_codec_refuses_a_meta_tensor_bound_for_another_process_naming_its_argument() -> None:
    with pytest.raises(SerializationError, match=r"^args\[0\]: a tensor on meta cannot be staged"):
        Codec().encode([(torch.empty(3, device="meta"),), {}], route=ROUTE, arguments=True)


# ---------------------------------------------------------------------- the property, in one process


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(payload=payloads())
def test_codec_delivers_every_drawn_tensor_bitwise(payload: list[torch.Tensor]) -> None:
    expected = [bits(tensor) for tensor in payload]
    for route, copy_tensors in [(ROUTE, False), (ROUTE, True), (None, True), (None, False)]:
        codec = Codec()
        data, side = codec.encode(payload, route=route, copy_tensors=copy_tensors)
        message_size(data, side)  # the transport sizes every message it sends
        assert [bits(tensor) for tensor in codec.decode(data, side)] == expected, (route, copy_tensors)


# ---------------------------------------------------------------------- the property, between processes


@pytest.fixture(scope="module", params=["lane", "no-lane"])
def world_run(request: pytest.FixtureRequest) -> Finished:
    return run_script("tensor_fidelity.py", request.param, "60", timeout=240.0)


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_tensors_cross_torch_rpc_bitwise_as_sent(world_run: Finished) -> None:
    world_run.assert_clean_exit(0)
    fidelity = world_run.result("fidelity")
    assert fidelity["calls"] >= 60
    assert fidelity["tensor_bytes"] > 0, "some tensors went apart from their messages"
    lane = "lane" in world_run.argv
    if lane:
        assert fidelity["channels"]["shm"] > 0, "tensors for this host went by reference in shared memory"
    else:
        assert "shm" not in fidelity["channels"], "channels=('staged',) leaves shared memory out"
        assert fidelity["channels"]["transport"] > 0, "tensors took torch RPC's own path"
    assert (fidelity["lane_bundles"] > 0) == lane, "small messages went on the fast lane exactly when it was on"


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_tensors_with_no_faithful_form_are_refused_by_argument_over_torch_rpc(world_run: Finished) -> None:
    refusals = world_run.result("refusals")
    for kind, outcome in refusals["outcomes"].items():
        assert outcome != "sent", kind
        assert outcome["type"] == "SerializationError", (kind, outcome)
        assert outcome["message"].startswith("call to 'echo' of actor TensorEcho#"), (kind, outcome)
        assert " on node 1: args[0][1]: " in outcome["message"], (kind, outcome)
    assert refusals["still_serving"]
