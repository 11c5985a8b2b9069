import io
import json

import pytest
import structlog

from actorch._launch.logs import LOG_LEVEL_ENV, configure_logging


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


def test_configure_logging_refuses_an_unknown_level():
    with pytest.raises(ValueError, match="unknown log level 'LOUDEST'"):
        configure_logging("loudest")
