"""bench/report.py prints BENCHMARKS.md from bench/results/: every results file shows, with its date."""
import importlib.util
import json
import os
import shutil
import subprocess
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "bench", "results")


@pytest.fixture(scope="module")
def report():
    spec = importlib.util.spec_from_file_location("bench_report", os.path.join(ROOT, "bench", "report.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def page_of(report, capsys, *argv):
    assert report.main(list(argv)) == 0
    return capsys.readouterr().out


def date_of(path):
    """What the page must say: the date the file records, else its last commit's (its mtime while uncommitted)."""
    if path.endswith(".json"):
        with open(path) as f:
            data = json.load(f)
        recorded = isinstance(data, dict) and (data.get("when") or data.get("date"))
        if recorded:
            return str(recorded)[:10]
    git = dict(cwd=ROOT, capture_output=True, text=True, timeout=30)
    if not subprocess.run(["git", "status", "--porcelain", "--", path], **git).stdout.strip():
        committed = subprocess.run(["git", "log", "-1", "--format=%cs", "--", path], **git).stdout.strip()
        if committed:
            return committed
    return time.strftime("%Y-%m-%d", time.localtime(os.path.getmtime(path)))


def test_every_results_file_is_listed_with_its_date(report, capsys):
    lines = page_of(report, capsys).splitlines()
    names = sorted(n for n in os.listdir(RESULTS) if not n.startswith("."))
    assert names
    for name in names:
        listed = [line for line in lines if line.startswith(f"- `bench/results/{name}`:")]
        assert listed, f"{name} is not listed"
        assert date_of(os.path.join(RESULTS, name)) in listed[0], listed[0]


def test_every_figure_of_the_committed_results_is_found(report, capsys):
    page = page_of(report, capsys)
    assert "n/a" not in page  # a key the results no longer hold would print n/a
    assert page.startswith("# Benchmarks\n") and "make bench" in page and "## Goals at a glance" in page


def test_out_writes_the_page_it_prints(report, capsys, tmp_path):
    printed = page_of(report, capsys)
    out = tmp_path / "BENCHMARKS.md"
    assert page_of(report, capsys, "--out", str(out)) == ""
    assert out.read_text() == printed


def test_a_results_file_no_section_reads_is_still_listed(report, capsys, tmp_path):
    shutil.copy(os.path.join(RESULTS, "recovery-spark4.json"), tmp_path)
    (tmp_path / "newbench-spark4.json").write_text(json.dumps({"date": "2030-01-02", "seconds": 1.0}))
    page = page_of(report, capsys, "--results", str(tmp_path))
    assert "## Failure detection and recovery" in page and "## Other results files" in page
    assert any("newbench-spark4.json" in line and "2030-01-02" in line for line in page.splitlines())


def test_the_images_section_and_its_goals_read_bench_images_results(report, capsys, tmp_path):
    shutil.copy(os.path.join(RESULTS, "images-spark4.json"), tmp_path)
    page = page_of(report, capsys, "--results", str(tmp_path))
    section = page.split("## Images and text", 1)[1].split("\n## ", 1)[0]
    assert "n/a" not in section and "spark_dist / ceiling" in section
    goals = [line for line in page.splitlines() if line.startswith("| Images (")]
    assert len(goals) == 1 and "of the same fn in a plain process pool" in goals[0]
    assert "met" in goals[0] or "missed" in goals[0]
    # Petastorm's and Mosaic's ratios are information: in the section, not among the goals
    assert "Petastorm" in section and not any(line.startswith("| Images: spark_dist loader / ")
                                              for line in page.splitlines())
