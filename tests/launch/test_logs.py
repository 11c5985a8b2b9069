import asyncio
import io
import json
import os

import pytest
import structlog
from _mp import SCRIPTS, run_on_terminal, script_argv

import actorch
from actorch._launch.options.environment import LOG_LEVEL_ENV, effective_log_level
from actorch._launch.services.logs import configure_logging
from actorch.testing import local_world


@pytest.fixture(autouse=True)
def _fresh_structlog():
    structlog.reset_defaults()
    yield
    structlog.reset_defaults()


def test_configure_logging_writes_json_lines_when_stderr_is_not_a_terminal(monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    configure_logging("info")
    structlog.get_logger("actorch").bind(node=3).info("hello", actor="a")
    record = json.loads(stream.getvalue().strip().splitlines()[-1])
    assert record["event"] == "hello"
    assert record["node"] == 3
    assert record["actor"] == "a"
    assert record["level"] == "info"


class _Writes(io.StringIO):
    """A stderr that keeps each write apart, as an unbuffered one (``PYTHONUNBUFFERED``) hands each to the pipe."""

    def __init__(self):
        super().__init__()
        self.writes = []

    def write(self, text):
        self.writes.append(text)
        return super().write(text)


def test_each_log_line_is_one_write_so_nodes_sharing_a_stderr_never_cut_each_others(monkeypatch):
    stream = _Writes()
    monkeypatch.setattr("sys.stderr", stream)
    configure_logging("info")
    log = structlog.get_logger("actorch")
    log.info("one", node=0)
    log.warning("two", node=1)
    assert len(stream.writes) == 2
    assert all(text.endswith("\n") and text.count("\n") == 1 for text in stream.writes)


def test_configure_logging_takes_the_level_from_the_environment(monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    monkeypatch.setenv(LOG_LEVEL_ENV, "error")
    configure_logging()
    log = structlog.get_logger("actorch")
    log.warning("quiet")
    log.error("loud")
    text = stream.getvalue()
    assert "loud" in text
    assert "quiet" not in text


def test_configure_logging_leaves_a_configuration_the_program_made(monkeypatch):
    structlog.configure(processors=[structlog.processors.KeyValueRenderer()])
    configure_logging("debug")
    assert structlog.get_config()["processors"][0].__class__ is structlog.processors.KeyValueRenderer


def test_configure_logging_made_here_is_made_again_at_a_new_level(monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    log = structlog.get_logger("actorch")  # module-level, as the library's own loggers are
    configure_logging("error")
    log.debug("before")
    configure_logging("DEBUG")  # a second run() in this process, at another level
    log.debug("after")
    log.bind(node=1).debug("a new node's logger")
    text = stream.getvalue()
    assert "before" not in text
    assert "after" in text
    assert "a new node's logger" in text


def test_configure_logging_refuses_an_unknown_level_naming_the_levels():
    with pytest.raises(ValueError, match="must be one of") as refused:
        configure_logging("loudest")
    assert str(refused.value) == (
        "log_level must be one of 'debug', 'info', 'warning', 'error', 'critical' (in any case), "
        "or None for $ACTORCH_LOG_LEVEL (else 'warning'), not 'loudest'"
    )
    assert not structlog.is_configured()


def test_configure_logging_refuses_an_unknown_level_in_the_environment(monkeypatch):
    monkeypatch.setenv(LOG_LEVEL_ENV, "verbose")
    with pytest.raises(ValueError, match="must be one of") as refused:
        configure_logging()
    assert str(refused.value) == (
        "ACTORCH_LOG_LEVEL must be one of 'debug', 'info', 'warning', 'error', 'critical' (in any case), not 'verbose'"
    )


def test_the_level_given_wins_over_the_environment(monkeypatch):
    monkeypatch.setenv(LOG_LEVEL_ENV, "verbose")  # not read when a level is given
    assert effective_log_level("Info") == "info"
    monkeypatch.setenv(LOG_LEVEL_ENV, "ERROR")
    assert effective_log_level(None) == "error"
    monkeypatch.delenv(LOG_LEVEL_ENV)
    assert effective_log_level(None) == "warning"


RUNTIME = os.path.dirname(actorch.__file__) + os.sep
"""Where actorch's own frames come from."""


class Told(actorch.Actor):
    async def fail(self) -> None:
        raise ValueError("told to fail")

    async def ping(self) -> int:
        return 1


async def test_configure_logging_puts_a_failed_tells_trimmed_traceback_in_json_when_not_a_terminal(monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    configure_logging("warning")
    async with local_world(2) as world:
        ref = await world[0].spawn(Told, on=1)
        ref.tell(Told.fail)
        async with asyncio.timeout(5):
            assert await ref.call(Told.ping) == 1
    [record] = [json.loads(line) for line in stream.getvalue().splitlines() if '"tell failed"' in line]
    assert (record["level"], record["node"], record["error"]) == ("error", 1, "ValueError: told to fail")
    assert record["exception"].startswith("Traceback (most recent call last):\n")
    assert 'raise ValueError("told to fail")' in record["exception"]
    assert RUNTIME not in record["exception"], "the runtime's frames that ran the handler are left out"


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_failures_on_a_worker_print_their_tracebacks_as_lines_on_a_terminal():
    code, text = run_on_terminal(script_argv("failure_logs.py"), timeout=75)
    assert code == 0, text
    script = str(SCRIPTS / "failure_logs.py")
    lines = text.splitlines()
    for event, raised, error in (
        ("tell failed", 'raise ValueError("told to fail")', "ValueError: told to fail"),
        ("actor failed", 'raise KeyError("corrupt")', "KeyError: 'corrupt'"),
    ):
        [at] = [index for index, line in enumerate(lines) if f"] {event} " in line]
        assert "[error" in lines[at], lines[at]
        assert "node=1" in lines[at], lines[at]
        assert "exception=" not in lines[at], lines[at]
        frames = lines[at + 1 : lines.index("", at)]
        assert frames[0] == "Traceback (most recent call last):", text
        assert frames[1].startswith(f'  File "{script}", line '), "the handler's frame comes first, no runtime frame"
        assert frames[2] == f"    {raised}", text
        assert frames[-1] == error, text
        assert not [line for line in frames if RUNTIME in line], text
