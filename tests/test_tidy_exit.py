"""``run`` waits for the worker processes it started: none is left behind when it returns, zombie or not."""

from __future__ import annotations

import pytest
from _mp import run_script

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]


def test_run_leaves_no_worker_process_behind_in_the_process_table() -> None:
    run = run_script("tidy_exit.py", timeout=90.0)
    run.assert_clean_exit(0)
    returned = run.returned()
    assert returned["returned"] == 3
    # multiprocessing's own resource tracker stays until this process exits; nothing of actorch's does
    left = [child for child in returned["children"] if "resource_tracker" not in child["command"]]
    assert left == [], run.report()
