"""``SystemOptions``: the one declaration of what ``run``, ``start``, ``local_world`` and ``actorch run`` take."""

from __future__ import annotations

import dataclasses
import os
import re
import typing
from pathlib import Path
from typing import Any

import pytest

import actorch
import actorch.testing
from actorch._base.config import SystemConfig
from actorch._launch.options.system_options import (
    IN_PROCESS,
    ConfigKeywords,
    OptionKeywords,
    SystemOptions,
    launcher_environment,
    options_of,
    recording,
    snapshot_directory,
    status_address,
    system_config,
)
from actorch._launch.world.run import _plan
from actorch.testing import local_world


async def setup_marker(system: actorch.ActorSystem) -> str | None:
    return os.environ.get("ACTORCH_OPTIONS_TEST")


def mark(rank: int) -> None:
    os.environ["ACTORCH_OPTIONS_TEST"] = f"set up node {rank}"


def annotation_text(annotation: Any) -> str:
    return annotation.__forward_arg__ if isinstance(annotation, typing.ForwardRef) else str(annotation)


def test_option_keywords_name_every_option_with_its_type() -> None:
    fields = {field.name: field.type for field in dataclasses.fields(SystemOptions)}
    keywords = {name: annotation_text(kind) for name, kind in OptionKeywords.__annotations__.items()}
    assert keywords == fields
    assert set(ConfigKeywords.__annotations__) == set(IN_PROCESS)


def test_in_process_options_are_the_settings_every_node_shares() -> None:
    config = system_config(SystemOptions())
    # devices: the one shared setting local_world leaves alone (its own devices= names GPU inventories)
    assert {field.name for field in dataclasses.fields(config)} == {*IN_PROCESS, "run_record", "devices"}


@pytest.mark.parametrize(
    ("given", "error", "says"),
    [
        ({"liveness_timeout": 0}, ValueError, "liveness_timeout must be a positive number of seconds, not 0"),
        ({"lookup_timeout": -1}, ValueError, "lookup_timeout must be a finite number of seconds >= 0, not -1"),
        ({"mailbox_size": 0}, ValueError, "mailbox_size must be an int >= 1, not 0"),
        ({"devices": "copy"}, ValueError, "devices must be 'stage' or 'strict', not 'copy'"),
        ({"transport": "ib"}, ValueError, "transport must be a transport kind's options record (actorch.TorchRpc"),
        (
            {"transport": {"tensorpipe": "uv"}},
            TypeError,
            "transport= takes a transport kind's options record (TorchRpc",
        ),
        ({"log_level": "loud"}, ValueError, "log_level must be one of 'debug', 'info', 'warning'"),
        ({"record": 1}, TypeError, "record must be True or False, not 1"),
        ({"status": "no"}, ValueError, "status must be True (serve it, the default) or False (serve none), not 'no'"),
        ({"status_host": ""}, ValueError, "status_host must be an address"),
        ({"status_port": 70000}, ValueError, "status_port must be an int in 0..65535 (0: a free one), or None"),
        ({"status": False, "status_port": 1}, ValueError, "status_port=1 was given with status=False"),
        ({"port": -1}, ValueError, "port must be an int in 0..65535 (0: a free one), not -1"),
        ({"setup": "seed"}, TypeError, "setup must be a function of the node's rank, not 'seed'"),
        ({"snapshots": 3}, TypeError, "snapshots must be a directory path (str or os.PathLike), or None, not 3"),
        ({"snapshots": ""}, TypeError, "snapshots must be a directory path"),
        ({"snapshots_kept": 0}, ValueError, "snapshots_kept must be an int >= 1, not 0"),
    ],
)
def test_system_options_refuse_a_bad_value_naming_the_option(
    given: dict[str, Any], error: type[Exception], says: str
) -> None:
    with pytest.raises(error) as refused:
        SystemOptions(**given)
    assert says in str(refused.value)


def test_run_refuses_an_unknown_option_naming_it_before_anything_starts() -> None:
    with pytest.raises(TypeError, match=r"run\(\) got an unexpected keyword argument 'banana' \(its options: "):
        actorch.run(setup_marker, banana=True)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("given", "meant"), [("log_leve", "log_level"), ("stirct", "strict"), ("transprot", "transport")]
)
def test_run_refuses_a_misspelt_option_suggesting_the_one_meant(given: str, meant: str) -> None:
    with pytest.raises(TypeError) as refused:
        actorch.run(setup_marker, **{given: "info"})
    said = str(refused.value)
    assert said.startswith(
        f"run() got an unexpected keyword argument {given!r}; did you mean {meant!r}? (its options: "
    )
    assert "log_level, lookup_timeout" in said  # and every option still follows


def test_start_refuses_options_that_are_not_system_options() -> None:
    with pytest.raises(TypeError, match=r"start\(options=...\) takes a SystemOptions, not \{'strict': True\}"):
        actorch.start(options={"strict": True})  # type: ignore[arg-type]


def test_keywords_override_the_options_given_beside_them() -> None:
    base = SystemOptions(strict=True, lookup_timeout=5.0)
    chosen = options_of("run", base, {"lookup_timeout": 1.0})
    assert (chosen.strict, chosen.lookup_timeout) == (True, 1.0)
    assert base.lookup_timeout == 5.0
    with pytest.raises(ValueError, match="lookup_timeout must be a finite number"):
        options_of("run", base, {"lookup_timeout": float("nan")})


def test_run_takes_options_built_beforehand(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACTORCH_OPTIONS_TEST", raising=False)
    options = actorch.SystemOptions(setup=mark, configure_logs=False)
    assert actorch.run(setup_marker, options=options) == "set up node 0"


def test_the_driver_decides_tune_gc_unless_the_options_do() -> None:
    assert _plan(SystemOptions(configure_logs=False), tune_gc=True).tune_gc is True
    assert _plan(SystemOptions(configure_logs=False), tune_gc=False).tune_gc is False
    assert _plan(SystemOptions(configure_logs=False, tune_gc=True), tune_gc=False).tune_gc is True


async def test_local_world_refuses_an_option_that_does_not_apply_in_one_process() -> None:
    with pytest.raises(TypeError) as refused:
        async with local_world(2, rpc_threads=8):  # type: ignore[call-arg]
            pass
    assert str(refused.value).startswith(
        "local_world() got an unexpected keyword argument 'rpc_threads': an option of run() that local_world() "
        "does not take (its options: "
    )


async def test_local_world_checks_its_options_as_run_does() -> None:
    with pytest.raises(ValueError, match="send_budget must be an int >= 1, not 0"):
        async with local_world(2, send_budget=0):
            pass


def test_launcher_environment_sets_what_run_then_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ACTORCH_STATUS_PORT", "ACTORCH_LOG_LEVEL", "ACTORCH_RECORD"):
        monkeypatch.setenv(name, "put back after the test")  # delenv alone does not restore a variable it did not find
        monkeypatch.delenv(name)
    assert launcher_environment() == {}
    said = launcher_environment(status=False, log_level="INFO", record=False)
    assert said == {"ACTORCH_STATUS_PORT": "off", "ACTORCH_LOG_LEVEL": "info", "ACTORCH_RECORD": "0"}
    assert launcher_environment(status_port=8470) == {"ACTORCH_STATUS_PORT": "8470"}
    for name, value in said.items():
        monkeypatch.setenv(name, value)
    options = SystemOptions(configure_logs=False)
    assert status_address(options) is None
    assert recording(options) is False
    assert _plan(options, tune_gc=True).log_level == "info"


def test_the_snapshot_directory_is_the_options_else_the_environments_as_an_absolute_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ACTORCH_SNAPSHOTS", raising=False)
    assert snapshot_directory(SystemOptions()) is None
    assert system_config(SystemOptions()).snapshots is None
    monkeypatch.setenv("ACTORCH_SNAPSHOTS", "from-env")
    assert snapshot_directory(SystemOptions()) == str(tmp_path / "from-env")
    chosen = SystemOptions(snapshots=Path("ckpt"), snapshots_kept=3)
    assert system_config(chosen).snapshots == str(tmp_path / "ckpt"), "the option wins"
    assert system_config(chosen).snapshots_kept == 3
    assert launcher_environment(snapshots="ckpt") == {"ACTORCH_SNAPSHOTS": str(tmp_path / "ckpt")}


def test_a_snapshot_directory_must_be_absolute_where_every_node_reads_it() -> None:
    with pytest.raises(ValueError, match="snapshots must be an absolute directory path or None, not 'ckpt'"):
        SystemConfig(snapshots="ckpt")


def test_launcher_environment_checks_as_the_options_do() -> None:
    with pytest.raises(ValueError, match="log_level must be one of"):
        launcher_environment(log_level="loud")


async def test_local_world_waits_less_than_run_by_default() -> None:
    async with local_world(1) as world, local_world(1, stop_grace=0.5) as other:
        assert (world[0].config.lookup_timeout, world[0].config.stop_grace) == (5.0, 2.0)
        assert other[0].config.stop_grace == 0.5
    assert (SystemOptions().lookup_timeout, SystemOptions().stop_grace) == (30.0, 10.0)


def test_the_launching_page_has_a_row_for_every_option() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "concepts" / "launching.md").read_text()
    table = page.split("| Option | Default | Meaning |", 1)[1].split("\n\n", 1)[0]
    named = [
        name.strip("` ")
        for row in table.splitlines()[2:]  # past the heading's rule
        for name in row.split("|")[1].split(",")
    ]
    assert sorted(named) == sorted(field.name for field in dataclasses.fields(SystemOptions))


# ---------------------------------------------------------------- the transport: a kind's options record


def test_options_take_a_transport_record_and_default_to_torch_rpc() -> None:
    assert SystemOptions().transport == actorch.TorchRpc()
    record = actorch.testing.FaultyTransport(actorch.TorchRpc(lane=False))
    assert SystemOptions(transport=record).transport is record
    assert (
        _plan(SystemOptions(transport=record, liveness_timeout=4.0, configure_logs=False), tune_gc=False).transport
        is record
    )


@pytest.mark.parametrize(
    ("given", "record", "instead"),
    [
        ({"transport": "uv"}, actorch.TorchRpc(tensorpipe="uv"), "transport=actorch.TorchRpc(tensorpipe='uv')"),
        ({"transport": "shm"}, actorch.TorchRpc(tensorpipe="shm"), "transport=actorch.TorchRpc(tensorpipe='shm')"),
        ({"fast_lane": False}, actorch.TorchRpc(lane=False), "transport=actorch.TorchRpc(lane=False)"),
        ({"rpc_threads": 8}, actorch.TorchRpc(threads=8), "transport=actorch.TorchRpc(threads=8)"),
        ({"rpc_timeout": 5.0}, actorch.TorchRpc(timeout=5.0), "transport=actorch.TorchRpc(timeout=5.0)"),
        ({"device_maps": None}, actorch.TorchRpc(device_maps=None), "transport=actorch.TorchRpc(device_maps=None)"),
    ],
    ids=lambda value: next(iter(value)) if isinstance(value, dict) else "",
)
def test_a_deprecated_option_warns_and_builds_torch_rpcs_record(
    given: dict[str, Any], record: actorch.TorchRpc, instead: str
) -> None:
    with pytest.warns(DeprecationWarning, match=re.escape(f"is deprecated: pass {instead}")) as warned:
        options = SystemOptions(**given)
    assert options.transport == record
    assert warned[0].filename == __file__  # it points at the line that gave the option
    assert dataclasses.replace(options, strict=True).transport == record  # folded in once: no second warning


def test_deprecated_options_fold_into_a_torch_rpc_record_given_with_them() -> None:
    with pytest.warns(DeprecationWarning, match="rpc_threads=2 is deprecated"):
        options = SystemOptions(transport=actorch.TorchRpc(tensorpipe="shm"), rpc_threads=2)
    assert options.transport == actorch.TorchRpc(tensorpipe="shm", threads=2)


def test_deprecated_torch_rpc_options_are_refused_beside_another_kinds_record() -> None:
    faulty = actorch.testing.FaultyTransport(actorch.TorchRpc())
    with pytest.raises(ValueError, match="rpc_threads set torch RPC's options, but transport= is FaultyTransport"):
        SystemOptions(transport=faulty, rpc_threads=2)
