"""The getting-started notebook in JupyterLab, as a user sees it (issue 41): Debian's Chromium, driven through its
chromedriver by Selenium, opens the notebook from a JupyterLab on loopback and runs it with Run > Run All Cells. The
tests read what the page rendered, press Stop on a long cell and launch again. Papermill cannot see any of this: which
cell a line lands in, what an interrupt prints, what the Stop button leaves running.

A screenshot of each stage goes to $CI_ARTIFACTS_DIR/jupyterlab_browser/ (.ci/run sets CI_ARTIFACTS_DIR), else to
pytest's tmp_path; a wait that times out leaves one too, named after what it waited for. The browser: `apt-get install
chromium chromium-driver` (.ci/run does); JupyterLab: `make setup EXTRAS=jupyter` (`make test` installs every extra).
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import platform
import re
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import psutil
import pytest

from launcher_checks import assert_nothing_left_running, leftover_processes

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = "notebooks/00_getting_started.ipynb"
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
# Run as root, Chromium needs --no-sandbox; in a closed network, without the background services (component updates,
# sync, field trials) it opens no connection but to the page. A fresh profile each run: nothing an earlier run saved.
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--window-size=1400,1000")
WAIT_S = 120  # generous: `make test` runs three test streams on two cores; a wait ends as soon as its condition holds
RUN_ALL_S = 300  # the whole notebook: about 10 s on an idle 2-core machine
# What a rank's lost connection looked like in the failure demo before issue 41 §1: gloo's transport error, its
# source file, c10d's prefix, the "GLHF!" sign-off with an emoji, and the line that quoted it.
RAW_TRANSPORT_ERRORS = ("connection reset by peer", "connection closed by peer", "pair.cc", "gloo/transport", "[c10d]",
                        "glhf", "failed after it")
LONG_CELL = """@distributed(gpus=args.num_gpus)
def sleeps():
    print("ranks are running", flush=True)
    time.sleep(300)


sleeps.distributed()"""
NEXT_LAUNCH = 'print("next launch:", hello.distributed())'
NUMBERED = re.compile(r"\[\d+\]:")  # the prompt of a cell that ran: [3]: (queued or running: [*]:, never run: [ ]:)

# The page, read by JavaScript in one round trip each: the notebook's code cells in order.
JS_CODE_CELLS = "const cells = [...document.querySelectorAll('.jp-NotebookPanel .jp-Notebook .jp-CodeCell')];"
JS_OUTPUTS = JS_CODE_CELLS + """
return cells.map(cell => [...cell.querySelectorAll('.jp-OutputArea-output')].map(
    output => [output.getAttribute('data-mime-type') || '', output.textContent]));"""
JS_PROMPTS = JS_CODE_CELLS + "return cells.map(cell => cell.querySelector('.jp-InputPrompt').textContent.trim());"
JS_KERNEL = """const panel = document.querySelector('.jp-NotebookPanel');
return panel && [panel.querySelector('.jp-Toolbar-kernelName')?.textContent.trim(),
                 panel.querySelector('.jp-Notebook-ExecutionIndicator')?.dataset.status];"""
JS_ACTIVE = JS_CODE_CELLS + """
const active = document.querySelector('.jp-NotebookPanel .jp-Notebook .jp-Cell.jp-mod-active');
const all = [...document.querySelectorAll('.jp-NotebookPanel .jp-Notebook .jp-Cell')];
return [cells.indexOf(active), all.indexOf(active) == all.length - 1,
        active ? [...active.querySelectorAll('.cm-line')].map(line => line.textContent).join('\\n') : null];"""
JS_SCROLL_TO = JS_CODE_CELLS + "cells[arguments[0]].scrollIntoView({block: 'center'});"
JS_DIRTY = "return !!document.querySelector('.lm-TabBar-tab.jp-mod-current.jp-mod-dirty');"


def _needs(ready: bool, what: str) -> None:
    """Skip without it on a developer's machine; in CI (which installs it) a missing piece is a failure."""
    if not ready:
        (pytest.fail if os.environ.get("CI") else pytest.skip)(f"the browser test needs {what}")


def _screenshot_folder(tmp_path_factory) -> Path:
    """$CI_ARTIFACTS_DIR/jupyterlab_browser (emptied: only this run's stages), else a tmp_path."""
    if not os.environ.get("CI_ARTIFACTS_DIR"):
        return tmp_path_factory.mktemp("jupyterlab_browser")
    folder = Path(os.environ["CI_ARTIFACTS_DIR"]) / "jupyterlab_browser"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


@dataclass
class Lab:
    """JupyterLab on loopback with the notebook open in Chromium; code cells are addressed by their index."""
    driver: object
    server: subprocess.Popen
    server_log: Path
    root: Path  # COOKBOOK_ROOT: where the notebook's relative output_dir lands
    shots: Path
    kernel: psutil.Process = None
    sources: list = field(default_factory=list)  # the committed notebook's code cells

    def js(self, script, *args):
        return self.driver.execute_script(script, *args)

    def outputs(self, index=None):
        """[(mime type, text)] of every output of code cell `index` as rendered (all cells' without an index)."""
        outputs = [[tuple(o) for o in cell] for cell in self.js(JS_OUTPUTS)]
        return outputs if index is None else outputs[index]

    def text(self, index) -> str:
        return "\n".join(text for _, text in self.outputs(index))

    def cell(self, needle) -> int:
        """The index of the only committed code cell whose source has `needle`."""
        found = [i for i, source in enumerate(self.sources) if needle in source]
        assert len(found) == 1, f"{needle!r} is in code cells {found} of {NOTEBOOK}"
        return found[0]

    def screenshot(self, name, index=None) -> Path:
        if index is not None:
            self.js(JS_SCROLL_TO, index)
        path = self.shots / f"{name}.png"
        self.driver.save_screenshot(str(path))
        return path

    def wait(self, condition, what, timeout=WAIT_S):
        """condition()'s first true value, polled every 0.2 s; past `timeout` an error with a screenshot, every
        cell's output and the end of the server's log."""
        from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
        from selenium.webdriver.support.ui import WebDriverWait

        try:
            return WebDriverWait(self.driver, timeout, poll_frequency=0.2,
                                 ignored_exceptions=(StaleElementReferenceException,)).until(lambda _: condition())
        except TimeoutException:
            shot = "none (the browser did not answer)"
            with contextlib.suppress(Exception):
                shot = self.screenshot("timeout-" + re.sub(r"\W+", "-", what).strip("-"))
                what += f"; the cells' prompts {self.js(JS_PROMPTS)} and outputs:\n{self.outputs_in_brief()}"
            log = self.server_log.read_text(errors="replace")[-2000:]
            raise AssertionError(f"not within {timeout} s: {what}\nscreenshot: {shot}; server log:\n{log}") from None

    def outputs_in_brief(self, cells=None) -> str:
        """The end of each output of `cells` (every code cell by default), for an error message."""
        outputs = self.outputs()
        return "\n".join(f"cell {i} {mime}: ...{text[-400:]}" for i in (cells or range(len(outputs)))
                         for mime, text in outputs[i])

    def click(self, css):
        from selenium.webdriver.common.by import By

        self.driver.find_element(By.CSS_SELECTOR, css).click()

    def kernel_ready(self) -> bool:
        return self.js(JS_KERNEL) == ["Python 3 (ipykernel)", "idle"]

    def done(self, index) -> bool:
        """Code cell `index` has run and the kernel is idle: its prompt holds a number, not * (queued or running)."""
        return bool(NUMBERED.fullmatch(self.js(JS_PROMPTS)[index])) and self.kernel_ready()

    def run_all_ended(self) -> bool:
        """Run All has ended: at the last cell, or at the first that raised (the cells queued after it go back to
        unrun). Its click marks every cell queued (*) at once, so none left queued and the first one run is the end."""
        prompts = self.js(JS_PROMPTS)
        return bool(NUMBERED.fullmatch(prompts[0])) and "[*]:" not in prompts and self.kernel_ready()

    def run_new_cell(self, code) -> int:
        """Types `code` into a new cell below the last, runs it (Ctrl+Enter: stay on it); returns its index."""
        from selenium.webdriver.common.by import By
        from selenium.webdriver.common.keys import Keys

        count = len(self.js(JS_PROMPTS))
        self.click(".jp-NotebookPanel jp-button[data-command='notebook:insert-cell-below']")
        editor = self.wait(lambda: self.js(JS_ACTIVE) == [count, True, ""] and self.driver.find_elements(
            By.CSS_SELECTOR, ".jp-NotebookPanel .jp-Cell.jp-mod-active .cm-content"),
            "a new empty code cell at the end")[0]
        editor.click()
        # as a paste does: typed key by key, the editor would indent each new line after a colon once more
        self.driver.execute_cdp_cmd("Input.insertText", {"text": code})
        self.wait(lambda: self.js(JS_ACTIVE)[2] == code, "the code typed into the new cell")
        editor.send_keys(Keys.CONTROL, Keys.ENTER)
        return count


def _start_jupyterlab(folder: Path, root: Path, log: Path) -> tuple[subprocess.Popen, dict]:
    """JupyterLab serving `folder` on 127.0.0.1 (a free port), with a token; (its process, its runtime info)."""
    runtime, config = folder / ".runtime", folder / ".config"
    (config / "labconfig").mkdir(parents=True)
    # No "get Jupyter news?" notification over the page (and no fetch of news in a closed network)
    (config / "labconfig" / "page_config.json").write_text(
        json.dumps({"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}))
    env = {**os.environ, "COOKBOOK_ROOT": str(root), "JUPYTER_RUNTIME_DIR": str(runtime),
           "JUPYTER_CONFIG_DIR": str(config), "JUPYTERLAB_WORKSPACES_DIR": str(folder / ".workspaces"),
           "IPYTHONDIR": str(folder / ".ipython")}
    env.pop("MLFLOW_TRACKING_URI", None)  # an earlier test's store, set in this process: the notebook's own is meant
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", "--ServerApp.ip=127.0.0.1",
         "--ServerApp.port=0", f"--IdentityProvider.token={secrets.token_hex(16)}", f"--ServerApp.root_dir={folder}",
         "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
         "--LabApp.extension_manager=readonly"],
        cwd=folder, env=env, stdin=subprocess.DEVNULL, stdout=log.open("wb"), stderr=subprocess.STDOUT,
        start_new_session=True)
    info_file = runtime / f"jpserver-{server.pid}.json"  # written once it listens: its port and token
    deadline = time.monotonic() + WAIT_S
    while not info_file.is_file() and server.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    if not info_file.is_file():
        server.kill()
        server.wait(timeout=30)
        raise AssertionError(f"JupyterLab did not start within {WAIT_S} s (exit code {server.returncode}):\n"
                             f"{log.read_text()[-3000:]}")
    return server, json.loads(info_file.read_text())


def _stop(server: subprocess.Popen, profile: Path) -> None:
    """The server (which shuts its kernels down), then whatever it or Chromium left: by process id, never by name."""
    left = []
    with contextlib.suppress(psutil.Error):
        left = psutil.Process(server.pid).children(recursive=True)  # the kernel, its fork server, ranks
    server.terminate()
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait(timeout=30)
    for p in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error, TypeError):
            if str(profile) in " ".join(p.info["cmdline"]):  # the browser's processes, its crash handler too
                left.append(p)
    _, alive = psutil.wait_procs(left, timeout=10)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    _needs(CHROMIUM.is_file() and CHROMEDRIVER.is_file(), "Debian's Chromium: apt-get install chromium chromium-driver")
    _needs(importlib.util.find_spec("jupyterlab") is not None, "JupyterLab: make setup EXTRAS=jupyter")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    folder = tmp_path_factory.mktemp("jupyterlab")
    (folder / "notebooks").mkdir()
    shutil.copy(REPO / NOTEBOOK, folder / NOTEBOOK)
    root, profile = folder, folder / ".chromium"  # COOKBOOK_ROOT: runs/ lands here, not in the repository
    server, info = _start_jupyterlab(folder, root, folder / "jupyterlab.log")
    driver = None
    try:
        options = webdriver.ChromeOptions()
        options.binary_location = str(CHROMIUM)
        for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
            options.add_argument(flag)
        driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER), log_output=str(folder / "chromedriver.log")),
                                  options=options)
        sources = [c.source for c in nbformat.read(REPO / NOTEBOOK, as_version=4).cells if c.cell_type == "code"]
        page = Lab(driver, server, folder / "jupyterlab.log", root, _screenshot_folder(tmp_path_factory),
                   sources=sources)
        driver.get(f"{info['url']}lab/tree/{NOTEBOOK}?reset&token={info['token']}")
        # the toolbar names the kernel once it is attached: before, Run All would ask which kernel to start
        page.wait(lambda: len(page.js(JS_PROMPTS)) == len(sources) and page.kernel_ready(),
                  "the notebook open with its kernel idle")
        kernels = [p for p in psutil.Process(server.pid).children() if "ipykernel_launcher" in " ".join(p.cmdline())]
        assert len(kernels) == 1, kernels
        page.kernel = kernels[0]
        page.screenshot("00_opened")
        yield page
    finally:
        if driver is not None:
            with contextlib.suppress(Exception):
                driver.quit()
        _stop(server, profile)


@pytest.fixture(scope="module")
def ran_all(lab):
    """The notebook after Run > Run All Cells, every cell run: the page as `lab`."""
    from selenium.webdriver.common.by import By

    lab.driver.find_element(By.XPATH, "//li[contains(@class, 'lm-MenuBar-item')][.//*[text()='Run']]").click()
    lab.wait(lambda: lab.driver.find_elements(By.CSS_SELECTOR, ".lm-Menu-item[data-command='runmenu:run-all']"),
             "the Run menu open")[0].click()  # Run All Cells
    lab.wait(lab.run_all_ended, "Run All to end", timeout=RUN_ALL_S)
    unrun = [i for i, prompt in enumerate(lab.js(JS_PROMPTS)) if not NUMBERED.fullmatch(prompt)]
    if unrun:
        shot = lab.screenshot("01_run_all_stopped", unrun[0] - 1)
        raise AssertionError(f"Run All stopped before code cells {unrun}; screenshot: {shot}; the cell before them "
                             f"shows:\n{lab.outputs_in_brief([unrun[0] - 1])}")
    lab.screenshot("01_run_all", lab.cell("hello.distributed()"))
    return lab


def test_opening_the_notebook_shows_no_unsaved_changes(lab):
    # issue 41 §7: JupyterLab fills in the kernel's metadata on opening; the committed file already has it. Its
    # language_info holds Python's patch version, which is the machine's that last saved it.
    committed = nbformat.read(REPO / NOTEBOOK, as_version=4).metadata.language_info.version
    if committed != platform.python_version():
        pytest.skip(f"the notebook was saved with Python {committed}, this is {platform.python_version()}")
    assert not lab.js(JS_DIRTY), "the notebook shows unsaved changes right after opening"


def test_run_all_shows_each_ranks_lines_in_the_cell_that_launched_them(ran_all):
    lab = ran_all
    hello = lab.cell("hello.distributed()")
    shown = lab.text(hello)
    for line in ("[rank 0] hello from rank 0 of 2", "[rank 1] hello from rank 1 of 2",
                 "results, in rank order: [0, 1]"):
        assert line in shown, f"the hello cell shows:\n{shown}"
    elsewhere = {i: line for i in range(len(lab.sources)) if i != hello
                 for line in lab.text(i).splitlines() if line.startswith("[rank ")}
    assert not elsewhere, f"rank lines in other cells than the one that launched them: {elsewhere}"
    assert "every rank holds 3.0" in lab.text(lab.cell("sum_of_ranks.distributed()"))
    assert "plain call returned 0" in lab.text(lab.cell('print("plain call returned", hello())'))


def test_run_all_writes_under_the_cookbook_root_not_the_repository(ran_all):
    metrics = ran_all.root / "runs" / "getting_started" / "metrics.json"
    assert f"metrics written to {metrics}" in ran_all.text(ran_all.cell("write_metrics(")), ran_all.outputs()
    assert json.loads(metrics.read_text())["ranks_returned"] == [0, 1]


def test_the_failure_demo_names_the_failing_rank_in_words_without_raw_transport_errors(ran_all):
    lab = ran_all
    index = lab.cell("fails_on_last_rank.distributed()")
    lab.screenshot("02_failure_demo", index)
    outputs, shown = lab.outputs(index), lab.text(index)
    assert "rank 1 of 2 failed in fails_on_last_rank(): ValueError: rank 1 cannot find its shard of the data" in shown
    assert "Cell In[" in shown and 'raise ValueError(f"rank {rank} cannot find its shard of the data")' in shown, shown
    raw = [words for words in RAW_TRANSPORT_ERRORS if words in shown.lower()]
    assert not raw, f"the failure demo shows raw transport errors {raw}:\n{shown}"
    assert not [c for c in shown if ord(c) >= 0x1F000], f"a character the page may not draw (emoji):\n{shown}"
    assert [mime for mime, _ in outputs] == ["application/vnd.jupyter.stdout"], (
        f"the caught error is printed: one plain output, no error-coloured one: {outputs}")


def test_stop_on_a_long_cell_says_so_in_one_line_leaves_no_rank_running_and_the_next_launch_works(ran_all):
    lab = ran_all
    long_cell = lab.run_new_cell(LONG_CELL)
    lab.wait(lambda: lab.text(long_cell).count("ranks are running") == 2, "both ranks running in the long cell")
    assert {"[rank 0] ranks are running", "[rank 1] ranks are running"} <= set(lab.text(long_cell).splitlines())
    ranks = leftover_processes(lab.kernel.pid)
    assert len(ranks) >= 2, f"the kernel's processes while both ranks run: {ranks}"
    lab.screenshot("03_long_cell_running", long_cell)

    lab.click(".jp-NotebookPanel jp-button[data-command='notebook:interrupt-kernel']")  # the toolbar's Stop (■)
    lab.wait(lambda: lab.done(long_cell), "the long cell stopped")
    lab.screenshot("04_stopped", long_cell)
    errors = [text.strip() for mime, text in lab.outputs(long_cell) if mime == "application/vnd.jupyter.stderr"]
    assert len(errors) == 1 and re.fullmatch(r"KeyboardInterrupt: stopped 2 ranks of sleeps\(\) after \d+\.\d s",
                                             errors[0]), f"what Stop showed, one line expected: {errors}"
    assert_nothing_left_running(lab.kernel.pid, within=10)
    survivors = [p for p in ranks if _running(p)]  # a rank that escaped its parent (reparented) too
    assert not survivors, f"ranks still running after Stop: {survivors}"

    next_launch = lab.run_new_cell(NEXT_LAUNCH)
    lab.wait(lambda: lab.done(next_launch), "the next launch")
    lab.screenshot("05_next_launch", next_launch)
    shown = lab.text(next_launch)
    for line in ("[rank 0] hello from rank 0 of 2", "[rank 1] hello from rank 1 of 2", "next launch: [0, 1]"):
        assert line in shown, f"the launch after Stop shows:\n{shown}"
    outputs = lab.outputs(next_launch)
    assert [mime for mime, _ in outputs] == ["application/vnd.jupyter.stdout"], f"one plain output: {outputs}"
    assert_nothing_left_running(lab.kernel.pid, within=10)
