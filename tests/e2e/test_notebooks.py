"""The notebooks, run as a user runs them: nbclient drives a real IPython kernel (ipykernel) of this very
interpreter, so each Spark line's environment runs them on its own pyspark. A notebook fails on any error
output (an exception in a cell), and each must show its figures (``image/png`` outputs), the lines the ranks
printed (``[rank N] ...``, relayed by spark_dist) and, where it reports, the driver's ``[spark_dist rank N]``
lines. Afterwards no kernel, JVM or rank the notebook started may be left running.

Each notebook runs on one Spark line: images (06) and text (07) on the default line (4), the quickstart (01),
data (02), Spark ML (03), Horovod (04), the way over from TorchDistributor (05) and tuning (08) on 3.5, whose
suite is the shorter. All of them on both lines would add ~5 minutes to each line, and both lines' suites share
two cores within a 35-minute budget; the API a notebook uses is tested on its other line by the rest of the
suite (03's by tests/spark/test_ml.py, 06 and 07's by tests/spark/test_deep_learning_inputs.py, 08's by
tests/spark/test_tune_runs.py)."""
import json
import os
import re
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Tuple

import psutil
import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOK_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "notebooks")
KERNEL = "spark_dist_test"  # a kernelspec written per test: this interpreter, not whatever "python3" is
MARKER = "SPARK_DIST_NOTEBOOK_RUN"  # in the kernel's environment, so in every process it starts
CELL_TIMEOUT_S = 240


@dataclass(frozen=True)
class Expected:
    figures: int  # image/png outputs
    lines: Tuple[str, ...]  # regexes, each matching at least one line of the notebook's stream output
    progress: bool = False  # the driver's progress bar (a tqdm widget, or tqdm's text without ipywidgets)
    needs: Tuple[str, ...] = field(default=())  # modules without which the notebook is skipped
    spark_lines: Tuple[str, ...] = ("4",)  # the Spark lines it runs on (pyspark version prefixes)


RANK_LINES = (r"^\[rank 0\] ", r"^\[rank 1\] ")
EXPECTED = {
    "01_quickstart.ipynb": Expected(
        figures=1, progress=True, spark_lines=("3.5",),
        lines=(*RANK_LINES, r"^\[spark_dist rank 0\] epoch=11 loss=", r"^held-out accuracy: 0\.9")),
    "02_data.ipynb": Expected(
        figures=1, spark_lines=("3.5",),
        lines=(*RANK_LINES, r"^\[rank 1\] rank 1 of 2: \d+ rows", r"^rows/s")),
    "03_spark_ml.ipynb": Expected(
        figures=2, spark_lines=("3.5",),
        lines=(r"^\[spark_dist rank 0\] epoch=", r"^held-out accuracy: 0\.9", r"^best learningRate",
               r"^loaded model agrees")),
    "04_horovod.ipynb": Expected(
        figures=1, needs=("horovod.torch",), spark_lines=("3.5",),
        lines=(*RANK_LINES, r"^\[rank 0\] horovod rank 0 of 2", r"^\[rank 1\] horovod rank 1 of 2",
               r"^\[spark_dist rank 0\] epoch=", r"^HorovodRunner: held-out accuracy 0\.9")),
    "05_from_torchdistributor.ipynb": Expected(
        figures=2, spark_lines=("3.5",),
        lines=(*RANK_LINES, r"^TrainingFailedError: rank 1 ", r"^\[spark_dist\] run .* after 1 retry",
               r"^same final weights: True", r"^\[spark_dist\]   goodput \d+%: training ",
               r"^ +0 +failed .* 0\.\d+$", r"^ +1 +succeeded ")),
    "06_images.ipynb": Expected(
        figures=2, needs=("PIL",),
        lines=(*RANK_LINES, r"^\[spark_dist rank 0\] epoch=3 loss=", r"^held-out accuracy: (0\.9|1\.0)")),
    "07_text.ipynb": Expected(
        figures=1, needs=("tokenizers", "transformers"),
        lines=(*RANK_LINES, r"^\[spark_dist rank 0\] epoch=3 loss=.* accuracy=", r"^held-out accuracy: (0\.9|1\.0)",
               r"^summer: the sea was very warm", r"^winter: some frost on the glove")),
    "08_tuning.ipynb": Expected(
        figures=1, needs=("optuna",), spark_lines=("3.5",),
        lines=(r"^trial 0 COMPLETE", r"^trial 2 PRUNED: lr=1e-05 .* after 3 epochs",
               r"^trial-epochs saved by pruning: [1-9]", r"^best trial \d+: .* held-out accuracy (0\.9|1\.0)")),
}
NOTEBOOKS = sorted(f for f in os.listdir(NOTEBOOK_DIR) if f.endswith(".ipynb"))


def test_every_notebook_has_expectations_and_is_committed_without_outputs():
    assert NOTEBOOKS == sorted(EXPECTED)
    for name in NOTEBOOKS:
        nb = nbformat.read(os.path.join(NOTEBOOK_DIR, name), as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, f"{name}: clear the outputs"
        assert nb.cells[0].cell_type == "markdown" and "Needs" in nb.cells[0].source, name
        code = "\n".join(cell.source for cell in nb.cells if cell.cell_type == "code")
        for loopback in ('os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"', '.config("spark.driver.host", "127.0.0.1")',
                         '.config("spark.ui.enabled", "false")'):
            assert loopback in code, f"{name}: its session cell must set {loopback}"
        assert nb.cells[-1].source.strip() == "spark.stop()", f"{name} must end by stopping its session"


def _kernelspec(root) -> str:
    """A kernelspec running this interpreter's ipykernel, under ``root`` (JUPYTER_PATH points there)."""
    spec_dir = root / "kernels" / KERNEL
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"spark_dist test ({os.path.basename(sys.prefix)})", "language": "python",
    }))
    return str(root)


def _processes_with(marker: str):
    found = []
    for p in psutil.process_iter(["pid", "status"]):
        if p.pid == os.getpid() or p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            if p.environ().get(MARKER) == marker:
                found.append(p)
        except psutil.Error:  # not ours to read, or gone
            pass
    return found


def _lines(nb):
    """Every line of the notebook's stdout and stderr, cell by cell; a progress bar redraws with carriage
    returns, and each of its states counts as a line."""
    lines = []
    for cell in nb.cells:
        for stream in ("stdout", "stderr"):
            text = "".join(out.text for out in cell.get("outputs", [])
                           if out.output_type == "stream" and out.name == stream)
            lines += [part for line in text.splitlines() for part in line.split("\r")]
    return lines


def _count(nb, mime: str) -> int:
    return sum(mime in out.get("data", {}) for cell in nb.cells if cell.cell_type == "code"
               for out in cell.outputs if out.output_type in ("display_data", "execute_result"))


@pytest.mark.timeout(480)
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_in_a_kernel(name, spark_manager, tmp_path, monkeypatch):
    expected = EXPECTED[name]
    if not any(_pyspark_version().startswith(line + ".") for line in expected.spark_lines):
        pytest.skip(f"{name} runs on the Spark {' and '.join(expected.spark_lines)} line (see this module's docstring)")
    for module in expected.needs:
        pytest.importorskip(module)
    spark_manager.stop()  # the kernel starts its own SparkContext, and local[2] wants both cores
    monkeypatch.setenv("JUPYTER_PATH", _kernelspec(tmp_path / "jupyter"))
    marker = uuid.uuid4().hex
    env = {**os.environ, MARKER: marker, "IPYTHONDIR": str(tmp_path / "ipython"), "PYSPARK_PYTHON": sys.executable,
           "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop("MPLBACKEND", None)  # the kernel's own: inline figures
    nb = nbformat.read(os.path.join(NOTEBOOK_DIR, name), as_version=4)
    client = nbclient.NotebookClient(nb, kernel_name=KERNEL, timeout=CELL_TIMEOUT_S, allow_errors=False,
                                     resources={"metadata": {"path": str(tmp_path)}})
    started = time.monotonic()
    try:
        client.execute(env=env)  # raises CellExecutionError at the first error, naming the cell
    finally:
        seconds = time.monotonic() - started
        print(f"{name}: {seconds:.1f}s on pyspark {_pyspark_version()}")
        nbformat.write(nb, str(tmp_path / name))  # as executed, outputs and all, for a look
        left = _wait_gone(marker)
    errors = [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs
              if out.output_type == "error"]
    assert not errors, "\n".join(f"{e.ename}: {e.evalue}" for e in errors)
    assert not left, f"{name} left processes running (killed now): " + "; ".join(
        " ".join(p.info.get("cmdline") or [])[:200] for p in left)
    assert _count(nb, "image/png") == expected.figures, f"{name}: expected {expected.figures} figures"
    lines = _lines(nb)
    missing = [rx for rx in expected.lines if not any(re.search(rx, line) for line in lines)]
    assert not missing, f"{name}: no output line matches {missing}; the output was:\n" + "\n".join(lines)[-6000:]
    if expected.progress:
        widget = _count(nb, "application/vnd.jupyter.widget-view+json")
        text_bar = any(re.search(r"^epoch \d+: +\d+%\|.*\| \d+/\d+ ", line) for line in lines)
        assert widget or text_bar, f"{name}: no progress bar in the output"


def _pyspark_version() -> str:
    import pyspark

    return pyspark.__version__


def _wait_gone(marker: str, timeout: float = 30.0):
    """What the notebook's kernel started and left running, after ``timeout`` seconds' grace; killed."""
    deadline = time.monotonic() + timeout
    while True:
        left = _processes_with(marker)
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    for p in left:
        try:
            p.info["cmdline"] = p.cmdline()
            p.kill()
        except psutil.Error:
            pass
    return left
