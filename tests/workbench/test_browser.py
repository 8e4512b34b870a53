"""The assembly explorer in a real browser: JupyterLab, headless Chromium, Playwright.

What it checks: a notebook that shows ``tunebook.topics.explorer.Explorer`` (as section 6 of
05_assemble_config does) runs in JupyterLab, its widgets render, and typing into the p99 TTFT field in
the page (the field with class ``tunebook-slo-ttft``) changes the recommendation shown in the page (the front-end -> kernel -> front-end round
trip of ipywidgets), not only the text of the SLO but the decision itself.

The saved results are synthetic, written with ``tunebook.core.results.SweepDir`` in the run layout
that ``assemble.discover`` reads (``<run>/03_prefill_scaling/max_num_seqs/<point>.json`` plus
``summary.csv``): this is a test of the UI logic and makes no claim about vLLM, so no engine
starts. The numbers are chosen so the decision depends on the TTFT SLO: ``max_num_seqs=512``
doubles goodput but its p99 TTFT is 800 ms, so it is chosen under a 1000 ms SLO and not under a
600 ms one. The notebook is a small one the test writes (04 itself imports vLLM, ~30-70 s on a
CPU box, and its validation step starts engines).

Needs /usr/bin/chromium (Debian's ``chromium`` package) and the ``playwright`` Python package
(its wheel bundles the driver; no ``playwright install``: the browser is the system's). Skipped,
with the reason, where either is missing. A screenshot goes to test-artifacts/browser/.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import write_sweep

from tunebook.engine.vllm_http import free_port

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOT = REPO / "test-artifacts" / "browser" / "explorer.png"
REPORT_SCREENSHOT = REPO / "test-artifacts" / "browser" / "report.png"
BASE = {"enforce_eager": True, "kv_cache_memory_bytes": 67108864, "max_model_len": 2048}
NOTEBOOK = "explorer.ipynb"

# Generous: on a shared two-core box a kernel start alone has taken 15 s.
SERVER_START_S = 90
KERNEL_READY_S = 120
WIDGET_S = 90
CHANGE_S = 30


def _requirements() -> None:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} not found (Debian: apt-get install -y chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("the playwright Python package is not installed (pip install playwright)")


# --------------------------------------------------------------------------- saved results
def write_saved_run(run_dir: Path) -> None:
    """One sweep of max_num_seqs, three engine starts per config (the fewest whose ranges can be
    apart beyond the noise, metrics.compare), with per-request timings."""
    configs = {
        # name: (settings, p99 TTFT of every request, durations of the three repeats)
        "default": ({}, 500.0, (1.0, 1.02, 1.01)),
        "max_num_seqs=512": ({"max_num_seqs": 512}, 800.0, (0.5, 0.51, 0.505)),
    }
    n = 20
    write_sweep(
        run_dir / "03_prefill_scaling" / "max_num_seqs",
        [
            {
                "config": name,
                "repeat": r,
                "settings": {**BASE, **settings},
                "workload": {"name": "chat", "kind": "shared_prefix"},
                "metrics": {
                    "duration_s": dur,
                    "request_throughput_rps": n / dur,
                    "output_throughput_tok_s": 8 * n / dur,
                    "ttft_p99_ms": ttft,
                    "tpot_p50_ms": 10.0,
                },
                "capacity": {
                    "max_num_seqs": settings.get("max_num_seqs", 256),
                    "kv_capacity_tokens": 131072,
                },
                "requests": [
                    {"ttft_ms": ttft, "tpot_ms": 10.0, "prompt_tokens": 16, "output_tokens": 8}
                ]
                * n,
            }
            for name, (settings, ttft, durations) in configs.items()
            for r, dur in enumerate(durations)
        ],
    )


def write_notebook(path: Path, run_dir: Path) -> None:
    import nbformat

    code = (
        "from IPython.display import display\n"
        "from tunebook.topics.explorer import Explorer\n\n"
        "explorer = Explorer(\n"
        f"    {str(run_dir)!r},\n"
        '    scenario="high_concurrency_chat",\n'
        "    slo_ttft_ms=1000.0,\n"
        "    slo_tpot_ms=200.0,\n"
        f"    base_settings={BASE!r},\n"
        '    model="tiny-ernie",\n'
        ")\n"
        "display(explorer.widget)"
    )
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
    }
    nb.cells = [
        nbformat.v4.new_markdown_cell(
            "# Explorer over a saved run (browser test)\n\nSynthetic results; no engine starts."
        ),
        nbformat.v4.new_code_cell(code),
    ]
    nbformat.write(nb, path)


def test_saved_run_decision_depends_on_the_ttft_slo(tmp_path):
    """The premise of the browser test, without a browser: 1000 ms -> 512, 600 ms -> default."""
    from tunebook.topics import assemble

    write_saved_run(tmp_path)
    sweeps = assemble.discover(tmp_path)
    loose = assemble.choose(
        sweeps, "high_concurrency_chat", {"ttft_ms": 1000, "tpot_ms": 200}, BASE
    )
    tight = assemble.choose(sweeps, "high_concurrency_chat", {"ttft_ms": 600, "tpot_ms": 200}, BASE)
    assert loose["changed"] == {"max_num_seqs": 512}
    assert tight["changed"] == {}


def test_explorer_keeps_exact_slo_and_offers_goodput(tmp_path):
    """Without a browser: the SLO fields hold the exact numbers given, and the metric dropdown
    offers goodput_rps (computed under the SLO, absent from the saved rows), chosen by default for
    high_concurrency_chat."""
    from tunebook.topics.explorer import SLO_TPOT_CLASS, SLO_TTFT_CLASS, Explorer

    write_saved_run(tmp_path)
    ex = Explorer(
        tmp_path,
        scenario="high_concurrency_chat",
        slo_ttft_ms=1000.0,
        slo_tpot_ms=200.0,
        base_settings=BASE,
        figure_widget=False,
    )
    assert ex.slo == {"ttft_ms": 1000.0, "tpot_ms": 200.0}
    assert SLO_TTFT_CLASS in ex.ttft._dom_classes and SLO_TPOT_CLASS in ex.tpot._dom_classes
    assert "goodput_rps" in ex.metric.options
    assert ex.metric.value == "goodput_rps"
    assert "ttft_ms &lt;= 1000" in ex.recommendation.value
    ex.metric.value = "ttft_p99_ms"
    ex.ttft.value = 600.0
    assert ex.slo["ttft_ms"] == 600.0 and ex.choice["changed"] == {}
    assert ex.metric.value == "ttft_p99_ms"  # an SLO change keeps the metric being looked at


# --------------------------------------------------------------------------- JupyterLab


def _get_json(url: str, token: str):
    req = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read())


def _alive(pids: set[int]) -> list[int]:
    import psutil

    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


class Lab:
    """A JupyterLab server of this test: its own port, token, config/runtime dirs and session."""

    def __init__(self, root: Path, home: Path):
        self.root, self.port, self.token = root, free_port(), secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = home / "jupyterlab.log"
        cfg, data = home / "config", home / "data"
        # No "Jupyter news?" toast and no update check (they would cover the page and phone home).
        notif = cfg / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
        notif.mkdir(parents=True)
        (notif / "notification.jupyterlab-settings").write_text(
            json.dumps({"fetchNews": "false", "checkForUpdates": False})
        )
        env = {
            **os.environ,
            "JUPYTER_CONFIG_DIR": str(cfg),
            "JUPYTER_DATA_DIR": str(data),
            "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
            "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
            "IPYTHONDIR": str(home / "ipython"),
        }
        cmd = [
            str(Path(sys.executable).with_name("jupyter")),
            "lab",
            "--no-browser",
            f"--port={self.port}",
            "--ServerApp.ip=127.0.0.1",
            f"--IdentityProvider.token={self.token}",  # ServerApp.token, not deprecated
            f"--ServerApp.root_dir={root}",
            "--ServerApp.open_browser=False",
            "--ServerApp.port_retries=0",
        ]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.append("--allow-root")  # CI containers run as root
        self._log = open(self.log, "w")
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        self.seen: set[int] = {self.proc.pid}  # the server and every child it was seen with

    def wait_ready(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited ({self.proc.returncode}):\n{self.tail()}")
            try:
                _get_json(f"{self.url}/api/status", self.token)
                return
            except (urllib.error.URLError, OSError):
                time.sleep(0.3)
        raise TimeoutError(f"jupyter lab not up after {timeout:g} s:\n{self.tail()}")

    def kernel_idle(self, notebook: str) -> bool:
        """The notebook's session exists and its kernel has answered (server-side state)."""
        self.note_children()
        for s in _get_json(f"{self.url}/api/sessions", self.token):
            if (
                s.get("path") == notebook
                and (s.get("kernel") or {}).get("execution_state") == "idle"
            ):
                return True
        return False

    def note_children(self) -> None:
        import psutil

        try:
            self.seen |= {c.pid for c in psutil.Process(self.proc.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            pass

    def tail(self, n: int = 4000) -> str:
        self._log.flush()
        return self.log.read_text(errors="replace")[-n:]

    def shutdown(self) -> list[int]:
        """Ask the server to stop (it shuts its kernels down), then make sure; returns leftovers."""
        self.note_children()
        if self.proc.poll() is None:
            try:
                req = urllib.request.Request(
                    f"{self.url}/api/shutdown",
                    method="POST",
                    headers={"Authorization": f"token {self.token}"},
                )
                urllib.request.urlopen(req, timeout=5).close()
            except (urllib.error.URLError, OSError):
                pass
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                # Our own session (start_new_session): its group id is the server's pid.
                os.killpg(self.proc.pid, signal.SIGTERM)
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait(10)
        end = time.monotonic() + 10
        while _alive(self.seen) and time.monotonic() < end:
            time.sleep(0.2)
        left = _alive(self.seen)
        for pid in left:  # never leave them running, but report them: the test fails
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._log.close()
        return left


@pytest.fixture
def lab(tmp_path):
    _requirements()
    root = tmp_path / "lab"
    root.mkdir()
    run_dir = tmp_path / "run"
    write_saved_run(run_dir)
    write_notebook(root / NOTEBOOK, run_dir)
    server = Lab(root, tmp_path / "jupyter")
    leftovers: list[int] = []
    try:
        server.wait_ready(SERVER_START_S)
        yield server
    finally:
        leftovers = server.shutdown()
    assert not leftovers, f"processes left after JupyterLab shut down: {leftovers}"


# --------------------------------------------------------------------------- the test
@pytest.mark.browser
def test_explorer_recommendation_follows_the_ttft_slider(lab):
    from playwright.sync_api import expect, sync_playwright

    t0 = time.monotonic()
    SCREENSHOT.with_name("explorer-failure.png").unlink(missing_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1100})
            page.goto(f"{lab.url}/lab/tree/{NOTEBOOK}?token={lab.token}")
            page.wait_for_selector(".jp-NotebookPanel", timeout=SERVER_START_S * 1000)

            # The kernel must be up before "Run All": the toolbar's execution indicator reads
            # "idle" even before a kernel exists, so ask the server as well.
            end = time.monotonic() + KERNEL_READY_S
            while not lab.kernel_idle(NOTEBOOK):
                assert time.monotonic() < end, f"kernel not idle:\n{lab.tail()}"
                time.sleep(0.5)
            panel = page.locator(".jp-NotebookPanel")
            expect(
                panel.locator('.jp-Notebook-ExecutionIndicator[data-status="idle"]')
            ).to_be_visible(timeout=KERNEL_READY_S * 1000)

            # Run > Run All Cells, through the menu bar as a user would.
            page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
            page.locator('.lm-Menu-item[data-command="runmenu:run-all"]').click()

            rec = page.locator(".tunebook-recommendation")
            expect(rec).to_be_visible(timeout=WIDGET_S * 1000)
            expect(rec).to_contain_text("Set max_num_seqs = 512", timeout=CHANGE_S * 1000)
            before = rec.inner_text()
            assert "ttft_ms <= 1000" in before, before

            # The p99 TTFT field (found by its class): type 600 and Enter.
            ttft = page.locator(".tunebook-slo-ttft")
            expect(ttft).to_have_count(1)
            expect(ttft.locator("label")).to_contain_text("p99 TTFT")
            readout = ttft.locator("input")
            assert float(readout.input_value()) == 1000
            readout.click()
            page.keyboard.press("Control+A")
            page.keyboard.type("600")
            page.keyboard.press("Enter")

            expect(rec).not_to_have_text(before, timeout=CHANGE_S * 1000)
            expect(rec).to_contain_text("Keep vLLM's defaults", timeout=CHANGE_S * 1000)
            after = rec.inner_text()
            assert "Set max_num_seqs" not in after, after
            # The field keeps the exact number (a log slider would have snapped it to its grid).
            m = re.search(r"ttft_ms <= ([0-9.]+)", after)
            assert m and 500 < float(m.group(1)) < 800, after
            assert float(m.group(1)) == 600, after
            assert float(readout.input_value()) == pytest.approx(float(m.group(1)), rel=0.01)

            # The serve command under the recommendation follows too.
            cmd = page.locator(".tunebook-serve-command")
            expect(cmd).not_to_contain_text("--max-num-seqs", timeout=CHANGE_S * 1000)

            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            page.locator(".tunebook-explorer").scroll_into_view_if_needed()
            page.screenshot(path=str(SCREENSHOT))
        except Exception:
            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            for p in browser.contexts[0].pages if browser.contexts else []:
                p.screenshot(path=str(SCREENSHOT.with_name("explorer-failure.png")))
            raise
        finally:
            browser.close()
    print(f"browser test: {time.monotonic() - t0:.1f} s in the browser; screenshot {SCREENSHOT}")


# --------------------------------------------------------------------------- the run's report
def _console_errors(page, errors: list, name: str) -> None:
    """Collect the page's console errors and uncaught exceptions (a blocked fetch of a CDN
    script is one: 'Failed to load resource')."""
    page.on("console", lambda m: errors.append(f"{name}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"{name}: {e}"))


@pytest.mark.browser
def test_report_answers_first_and_every_page_works_offline(tmp_path):
    """report/index.html and each notebook page opened from disk, the network cut off: the
    summary card (what to deploy, its ratio to the default, the command that starts it) lies
    within the first 900 px, the ledger is one line per claim with its full text folded, plotly
    (embedded, or report/plotly.min.js) draws the charts, and no page logs a console error."""
    _requirements()
    from playwright.sync_api import expect, sync_playwright
    from test_report import LONG_NOTE, add_deployment, build_run

    from tunebook.workbench.report import write_report

    run = build_run(tmp_path)
    add_deployment(run)
    index = write_report(run)
    pages = sorted(index.parent.glob("*.html"))
    assert [p.name for p in pages] == ["02_block_size_sweep.html", "index.html"]
    errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            page.route("http*://**", lambda route: route.abort())  # offline: nothing is fetched
            _console_errors(page, errors, "index.html")
            page.goto(index.as_uri())
            card = page.locator("#summary")
            expect(card).to_be_visible()
            box = card.bounding_box()
            assert box["y"] + box["height"] <= 900, box  # the answer is on the first screen
            first = card.locator("tbody tr").first
            expect(first).to_contain_text("2 vllm serve replicas behind vllm-router")
            expect(first).to_contain_text("stream_interval=16")
            expect(first).to_contain_text(re.compile(r"\d+\.\d\dx the default's"))
            expect(first).to_contain_text(
                f"bash runs/{run.name}/04_assemble_config/deployment/start.sh"
            )
            REPORT_SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(REPORT_SCREENSHOT))  # the first 900 px
            # the ledger: one line per claim, the full note folded until opened
            rows = page.locator("table.claims tbody tr")
            expect(rows).to_have_count(1)
            expect(rows.first).to_contain_text("C4")
            expect(rows.first).to_contain_text("refuted")
            note = page.locator("#claim-C4").get_by_text(LONG_NOTE.split()[-1], exact=False)
            expect(note).to_be_hidden()
            rows.first.locator("a").click()  # the claim's link opens its fold
            expect(note).to_be_visible()
            charts = page.locator(".chart .js-plotly-plot .main-svg")
            expect(charts.first).to_be_visible(timeout=30_000)
            assert charts.count() >= 4  # validation, 04's capacity, the notebook's, device time
            # the validation chart has bars: the figure was drawn, not only its frame
            expect(page.locator(".chart").first.locator("g.point").first).to_be_attached()
            # nothing wider than the page: tables scroll in their own box
            assert page.evaluate("document.documentElement.scrollWidth") <= 1300
            page.screenshot(
                path=str(REPORT_SCREENSHOT.with_name("report-full.png")), full_page=True
            )
            for p in pages:
                if p.name == "index.html":
                    continue
                nb = browser.new_page(viewport={"width": 1300, "height": 900})
                nb.route("http*://**", lambda route: route.abort())
                _console_errors(nb, errors, p.name)
                nb.goto(p.as_uri())
                expect(nb.locator(".js-plotly-plot .main-svg").first).to_be_visible(timeout=30_000)
                nb.wait_for_timeout(500)  # late errors (a script that fails after load)
                nb.close()
        finally:
            browser.close()
    assert not errors, errors
