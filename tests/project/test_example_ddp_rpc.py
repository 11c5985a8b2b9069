"""``examples/ddp_rpc.py`` (PyTorch's DDP + RPC tutorial on actorch) runs as docs/guides/ddp-rpc.md says, in short."""

from __future__ import annotations

import re
import sys

import pytest
from _mp import REPO, run_argv

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(200)]


def test_ddp_rpc_example_learns_and_keeps_the_dense_layers_identical() -> None:
    finished = run_argv([sys.executable, str(REPO / "examples" / "ddp_rpc.py"), "--quick"], timeout=150.0)
    finished.assert_clean_exit(0)
    out = finished.stdout
    losses = [float(loss) for loss in re.findall(r"^\s+epoch\s+\d+\s+loss ([\d.]+)$", out, re.MULTILINE)]
    assert len(losses) == 4, out
    assert losses[-1] < 0.8 * losses[0], f"the loss went down: {losses}"
    assert "dense layers identical on both trainers: True" in out
    assert "terminate called" not in finished.stderr, finished.report()  # no worker aborted on its way out
