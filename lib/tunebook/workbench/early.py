"""A notebook's kernel, started while the notebook before it runs.

On a GPU node every notebook's kernel spent 14-17 s in its parameter cell, importing vLLM for
the value checks while its launchers imported it too, before its first engine could start: about
90 of the h200 profile's 1,212 GPU-seconds (runs/h100-20261206d). The runner starts the next
notebook's kernel when a notebook starts and runs ``tunebook.workbench.notebook.prepare`` in it, silently
(no history, no execution count), while the notebook before it runs; papermill then executes the
notebook in that kernel, and ``begin`` finds that work done.

Only where notebooks start their launchers early (``launcher.wants_prestart``: GPU nodes), or
``TUNEBOOK_EARLY_KERNEL=1``; ``0`` turns it off. On a few CPU cores the imports would compete with
the notebook being measured.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import threading
import time
from pathlib import Path
from queue import Empty

from tunebook.engine.launcher import wants_prestart
from tunebook.workbench.console import StderrFilter, harmless
from tunebook.workbench.notebook import CALL_START_ENV

KERNEL = "python3"
# papermill's client starts its kernels so (nbclient's ipython_hist_file): no history database.
KERNEL_ARGS = ["--HistoryManager.hist_file=:memory:"]
READY_TIMEOUT_S = 600.0  # prepare() imports vLLM: 20 s on an H100 host, more on a cold file cache


def wanted() -> bool:
    """Whether the runner starts each notebook's kernel during the notebook before it."""
    flag = os.environ.get("TUNEBOOK_EARLY_KERNEL", "").strip().lower()
    if flag:
        return flag not in ("0", "false", "no", "off")

    return wants_prestart()


def _run(coro):
    # papermill's client runs its coroutines on this thread's loop (jupyter_core's run_sync): the
    # kernel manager handed to it must live on that loop too.
    from jupyter_core.utils import run_sync

    async def call():
        return await coro

    return run_sync(call)()


def _copy_to_stderr(r: int) -> None:

    with os.fdopen(r, "rb") as src:
        for line in src:
            # Until the runner filters its stderr, the lines it would hide are not shown either.
            if not StderrFilter.active and harmless(line.decode(errors="replace")) is not None:
                continue
            try:
                os.write(2, line)
            except OSError:
                pass


class EarlyKernel:
    """A kernel started for ``notebook`` before its turn, running ``notebook.prepare``."""

    def __init__(self, notebook: str, folder: Path):
        self.notebook = notebook
        self.folder = folder  # the notebook's folder in the run: removed if the notebook never ran
        self.made = not folder.exists()
        self.started = time.time()
        self.km = None
        self.kc = None
        self.msg_id = ""

    @classmethod
    def start(cls, notebook: str, params: dict, cwd: Path, run_dir: Path) -> EarlyKernel:
        """Start the kernel and send it ``prepare``; returns at once (the kernel works alone)."""
        from jupyter_client.manager import AsyncKernelManager

        self = cls(notebook, run_dir / notebook)
        # The kernel's environment is the runner's, as papermill's would be, without the start
        # of the call now running: the runner sets this notebook's own when its turn comes.
        env = {k: v for k, v in os.environ.items() if k != CALL_START_ENV}
        code = (
            f'__import__("tunebook.workbench.notebook").workbench.notebook.prepare({notebook!r},'
            f' __import__("json").loads({json.dumps(params)!r}))'
        )

        # Its stderr is copied line by line to this process's file descriptor 2 as it is when
        # written: the first kernel starts before the runner filters its stderr into run.log.
        r, w = os.pipe()

        async def go():
            self.km = AsyncKernelManager(kernel_name=KERNEL)
            await self.km.start_kernel(
                extra_arguments=list(KERNEL_ARGS), cwd=str(cwd), env=env, stderr=w
            )
            self.kc = self.km.client()
            self.kc.start_channels()
            self.msg_id = self.kc.execute(code, silent=True, store_history=False)

        try:
            _run(go())
        except BaseException:
            os.close(r)
            self.shut_down()
            raise
        finally:
            os.close(w)
        threading.Thread(target=_copy_to_stderr, args=(r,), daemon=True).start()
        return self

    def hand_over(self, call_start: float, timeout: float = READY_TIMEOUT_S) -> dict:
        """Wait until ``prepare`` is done and give the kernel this call's start. Returns what
        run.json keeps: how long before its turn the kernel started, how long the turn waited
        for it, and ``prepare``'s status ("ok", or the error it raised)."""
        t0 = time.time()
        code = f"__import__('os').environ[{CALL_START_ENV!r}] = {repr(call_start)!r}"

        async def go():
            self.kc.execute(code, silent=True, store_history=False)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                try:
                    msg = await self.kc.get_shell_msg(timeout=1.0)
                except Empty:
                    if not await self.km.is_alive():
                        return "the kernel died"
                    continue
                if msg["parent_header"].get("msg_id") == self.msg_id:
                    c = msg["content"]
                    ok = c.get("status") == "ok"
                    return "ok" if ok else f"{c.get('ename')}: {c.get('evalue')}"
            return f"not ready after {timeout:.0f} s"

        status = _run(go())
        self.kc.stop_channels()
        self.kc = None
        return {
            "started_before_s": round(t0 - self.started, 1),
            "waited_s": round(time.time() - t0, 1),
            "prepare": status,
        }

    def shut_down(self) -> None:
        """Stop the kernel as papermill stops its own (a shutdown request, then a kill)."""
        km, self.km = self.km, None
        if km is None:
            return

        async def go():
            try:
                if await km.is_alive():
                    await km.shutdown_kernel(now=False)
            finally:
                await km.cleanup_resources()

        if self.kc is not None:
            self.kc.stop_channels()
            self.kc = None
        try:
            _run(go())
        except (RuntimeError, asyncio.CancelledError):
            pass

    def discard(self) -> None:
        """The notebook will not run in this kernel: stop it and remove what it wrote."""
        self.shut_down()
        if self.made:
            shutil.rmtree(self.folder, ignore_errors=True)
