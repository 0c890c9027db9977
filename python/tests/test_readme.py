"""README's Python tour runs as written, on the tree its command-line tour generates."""

import os
import subprocess
import sys

import pytest

from conftest import ROOT, run


def readme_block(heading, lang):
    """The code of the first fenced block of kind ``lang`` after README's heading."""
    text = (ROOT / "README.md").read_text()
    at = text.index(f"\n{heading}\n")
    start = text.index(f"```{lang}\n", at) + len(lang) + 4
    return text[start:text.index("```", start)]


def test_the_python_tour_runs_as_written(tmp_path):
    pytest.importorskip("torch")
    tour = readme_block("## A tour of Python", "python")
    assert "granary.IterableDataset(" in tour and "granary.Writer(" in tour
    # The dataset the command-line tour makes first (its first two commands, run the same way).
    run("bench", "gen", tmp_path / "photos", "--files", "2000", "--classes", "10",
        "--sizes", "imagenet")
    run("pack", tmp_path / "photos", "-o", tmp_path / "photos.granary")
    out = subprocess.run([sys.executable, "-c", tour], cwd=tmp_path, capture_output=True,
                         text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert out.returncode == 0, f"README's Python tour failed:\n{out.stdout}\n{out.stderr}"
    # Its last line prints the label written with the first sample of photos.granary.
    label = subprocess.run(
        [sys.executable, "-c", "import granary; print(granary.Dataset('photos.granary')[0][1])"],
        cwd=tmp_path, capture_output=True, text=True, check=True).stdout.strip()
    assert out.stdout.strip().splitlines()[-1] == label
    assert (tmp_path / "tier").is_dir()
