"""examples/rag_loop.py, and the RAG-style loop in the repository README, run against
akerd and report a hit ratio and latencies."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from akerd_process import Akerd

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "rag_loop.py"
README = Path(__file__).resolve().parents[3] / "README.md"


def test_rag_loop(akerd: Akerd, workdir: Path) -> None:
    for extra in ([], ["--batch", "16"]):
        out = subprocess.run(
            [sys.executable, str(EXAMPLE), "--port", str(akerd.port), "--vectors", str(workdir / "data.npy"),
             "--questions", "120", "--popular", "10", "--reword", "0"] + extra,
            capture_output=True, text=True, timeout=60,
            env={k: v for k, v in os.environ.items() if k != "AKER_SECRET"},
        )
        assert out.returncode == 0, out.stderr
        m = re.search(r"hit ratio: ([0-9.]+)", out.stdout)
        assert m, out.stdout
        # 10 distinct questions asked 120 times: all but the first asks of each could be
        # hits, but admission is asynchronous in akerd (a repeat right after a MISS may
        # miss again), so only most of them are required to be.
        assert float(m.group(1)) >= 0.5, out.stdout
        assert "latency ms: p50" in out.stdout and "last prompt: question 119" in out.stdout


def test_the_readme_loop(akerd: Akerd, workdir: Path) -> None:
    """The README's Python block, with this akerd's port and data, as written there."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) == 1, "the README has one Python example"
    code = blocks[0].replace("7700", str(akerd.port)).replace("questions.npy", str(workdir / "data.npy"))
    assert str(akerd.port) in code and "data.npy" in code
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    m = re.search(r"hit ratio ([0-9.]+), p50 ([0-9.]+) ms", out.stdout)
    assert m, out.stdout
    # 50 distinct questions asked 500 times; admission is asynchronous (see above).
    assert float(m.group(1)) >= 0.5, out.stdout
