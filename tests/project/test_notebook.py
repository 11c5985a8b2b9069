"""``examples/notebook.ipynb`` runs under a real Jupyter kernel, survives an interrupted call, leaves nothing behind.

The notebook starts a system with ``actorch.start`` in the kernel's own event
loop (rank 0 is the kernel, ranks 1 and 2 are worker processes), calls actors
on both workers, catches a remote error, and shuts down. Before its shutdown
cell the test runs cells of its own: one interrupted (the kernel gets SIGINT,
as from the stop button) while it waits for a call, then one that must call
the same actor at once.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from _mp import MARKER_ENV, REPO, leftovers_after, script_env

nbformat = pytest.importorskip("nbformat", reason="needs the test extra: pip install -e '.[test]'")
nbclient = pytest.importorskip("nbclient", reason="needs the test extra: pip install -e '.[test]'")

pytestmark = [
    pytest.mark.multiprocess,
    # Not imported here: the kernel imports it (this process would then count as one, see wake_for_interrupts).
    pytest.mark.skipif(importlib.util.find_spec("ipykernel") is None, reason="needs the test extra (ipykernel)"),
]

NOTEBOOK = REPO / "examples" / "notebook.ipynb"


def _text(cell: Any) -> str:
    """What a cell printed and showed, as one string."""
    parts = []
    for output in cell.outputs:
        if output.output_type == "stream":
            parts.append(output.text)
        elif output.output_type in ("execute_result", "display_data"):
            parts.append(output.data.get("text/plain", ""))
        elif output.output_type == "error":
            parts.append(f"{output.ename}: {output.evalue}")
    return "".join(parts)


class Kernel:
    """Runs cells, the notebook's and the test's own, in one kernel of an nbclient session.

    nbclient files a cell's outputs at its index in the notebook, so the
    test's own cells are appended to it (in memory) before they run.
    """

    def __init__(self, client: Any, notebook: Any) -> None:
        self.client = client
        self.notebook = notebook

    async def run(self, cell: Any) -> Any:
        await self.client.async_execute_cell(cell, self.notebook.cells.index(cell))
        return cell

    def add(self, source: str, *, may_fail: bool = False) -> Any:
        cell = nbformat.v4.new_code_cell(source)
        if may_fail:
            cell.metadata["tags"] = ["raises-exception"]
        self.notebook.cells.append(cell)
        return cell

    async def run_code(self, source: str) -> Any:
        return await self.run(self.add(source))


def _gone(pid: int) -> bool:
    """Whether ``pid`` has ended and been reaped (not even a zombie is left)."""
    return not Path(f"/proc/{pid}").exists()


@pytest.mark.timeout(120)
async def test_notebook_starts_a_system_in_the_kernels_loop_survives_an_interrupt_and_leaves_nothing() -> None:
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=60, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    )
    marker = uuid.uuid4().hex
    env = {**script_env(marker), MARKER_ENV: marker}
    kernel = Kernel(client, notebook)
    worker_pids: list[int] = []
    async with client.async_setup_kernel(env=env):
        for cell in list(notebook.cells):
            if cell.cell_type != "code":
                continue
            if "shutdown" in cell.metadata.get("tags", []):
                worker_pids = await _pids_of_workers(kernel)
                await _interrupt_a_call_then_call_again(kernel)
            await kernel.run(cell)
        printed = "\n".join(_text(cell) for cell in notebook.cells if cell.cell_type == "code")
        caught = next(line for line in printed.splitlines() if line.startswith("caught"))
        assert "ZeroDivisionError" in caught
        assert "division by zero" in caught
        assert "gave up after 0.5 s" in printed
        assert len(worker_pids) == 2
        assert all(_gone(pid) for pid in worker_pids), "the workers were not reaped after system.shutdown()"
        children = await kernel.run_code("import multiprocessing\nprint(len(multiprocessing.active_children()))")
        assert _text(children).strip() == "0"  # the async with block's worker is gone too
        assert os.getpid() not in worker_pids
    assert leftovers_after(marker, None) == []  # the kernel, and anything it started, has ended


async def _pids_of_workers(kernel: Kernel) -> list[int]:
    shown = await kernel.run_code("import json\nprint(json.dumps([node.pid for node in system.nodes if node.rank]))")
    pids: list[int] = json.loads(_text(shown))
    return pids


async def _interrupt_a_call_then_call_again(kernel: Kernel) -> None:
    """Interrupt the kernel while a cell waits for a 60 s call; the next cell's call to that actor answers at once."""
    before = _text(await kernel.run_code("print(await counters[1].call(Counter.add, 0))")).strip()
    waiting = kernel.add(
        'print("waiting", flush=True)\nawait counters[1].call(Counter.add_slowly, 1, 60.0)', may_fail=True
    )
    running = asyncio.ensure_future(kernel.run(waiting))
    while "waiting" not in _text(waiting) and not running.done():  # noqa: ASYNC110 - nbclient has no output hook
        await asyncio.sleep(0.05)
    await kernel.client.km.interrupt_kernel()
    await running
    error = next(output for output in waiting.outputs if output.output_type == "error")
    assert error.ename in ("KeyboardInterrupt", "CancelledError"), error
    # One message at a time: had add_slowly kept running on node 2, this call would wait for it.
    after = await kernel.run_code("async with asyncio.timeout(20):\n    print(await counters[1].call(Counter.add, 0))")
    assert _text(after).strip() == before  # add_slowly was cancelled before it added
