"""The notebooks run top to bottom (their code cells, in order, as one fresh Python process)."""
import glob
import json
import os
import subprocess
import sys

import pytest

NOTEBOOKS = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "notebooks", "*.ipynb")))


def notebook_code(path: str) -> str:
    with open(path) as f:
        cells = json.load(f)["cells"]
    return "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs(path, spark_manager, tmp_path):
    spark_manager.stop()  # the notebook starts its own SparkContext in its own process
    script = tmp_path / "notebook.py"
    script.write_text(notebook_code(path))
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "held-out accuracy" in done.stdout
