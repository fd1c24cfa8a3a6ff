#!/usr/bin/env python3
"""A RAG-style retrieval loop through aker, without an embedding model.

The questions' embeddings come from a ``.npy`` file (``(n, dim)`` float32: what an
embedding model would have produced). Users ask popular questions again and again, often
reworded (a little noise on the vector); each question retrieves the ``k`` nearest
documents through akerd, and a prompt would be built from them. At the end: the cache's
hit ratio and the retrieval latency.

    python examples/rag_loop.py --vectors questions.npy --port 7700 --questions 500
    python examples/rag_loop.py --vectors questions.npy --batch 32      # search_batch
    python examples/rag_loop.py --vectors q.npy --secret-file /etc/aker/secret
    AKER_SECRET=... python examples/rag_loop.py --vectors q.npy   # as aker-cli reads it

Without ``--vectors`` it writes a small random file first (``--dim`` must then be the
server's).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

import aker


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=7700)
    p.add_argument("--vectors", type=Path, help=".npy of question embeddings (n, dim)")
    p.add_argument("--dim", type=int, default=0, help="without --vectors: the dimension (default: the server's)")
    p.add_argument("--questions", type=int, default=300, help="questions asked")
    p.add_argument("--k", type=int, default=5, help="documents retrieved per question")
    p.add_argument("--popular", type=int, default=40, help="distinct questions users keep asking")
    p.add_argument("--reword", type=float, default=0.3, help="fraction asked reworded (noisy vector)")
    p.add_argument("--noise", type=float, default=1e-3, help="size of a rewording")
    p.add_argument("--batch", type=int, default=0, help="questions per search_batch (0: one search each)")
    p.add_argument("--secret-file", type=Path, default=None, help="else $AKER_SECRET, if set")
    p.add_argument("--seed", type=int, default=1)
    return p.parse_args(argv)


def load_questions(args: argparse.Namespace, dim: int) -> npt.NDArray[np.float32]:
    path = args.vectors
    if path is None:
        path = Path(tempfile.mkdtemp()) / "questions.npy"
        rng = np.random.default_rng(args.seed)
        np.save(path, rng.standard_normal((max(args.popular, 1), dim)).astype(np.float32))
    vectors = np.load(path, allow_pickle=False)
    if vectors.ndim != 2 or vectors.shape[1] != dim:
        raise SystemExit(f"{path} has shape {vectors.shape}; the server's dimension is {dim}")
    out: npt.NDArray[np.float32] = np.ascontiguousarray(vectors, dtype=np.float32)
    return out


def stream(vectors: npt.NDArray[np.float32], args: argparse.Namespace) -> npt.NDArray[np.float32]:
    """The questions users ask: a Zipf-like popularity over the first ``popular`` rows,
    some reworded."""
    rng = np.random.default_rng(args.seed)
    n_pop = max(1, min(args.popular, len(vectors)))
    weights = 1.0 / np.arange(1, n_pop + 1)
    picks = rng.choice(n_pop, size=args.questions, p=weights / weights.sum())
    asked: npt.NDArray[np.float32] = vectors[picks].copy()
    reworded = rng.random(args.questions) < args.reword
    asked[reworded] += rng.normal(0.0, args.noise, size=(int(reworded.sum()), vectors.shape[1])).astype(np.float32)
    return asked


def prompt(question: int, doc_ids: npt.NDArray[np.uint64]) -> str:
    """Where a RAG application would fetch the documents and call its model."""
    return f"question {question}, context: documents {', '.join(str(int(i)) for i in doc_ids)}"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    secret = None if args.secret_file is not None else os.environ.get("AKER_SECRET")
    with aker.Client(args.host, args.port, secret=secret, secret_file=args.secret_file) as client:
        info = client.info
        questions = stream(load_questions(args, args.dim or info.dim), args)
        k = min(args.k, info.k_max)
        latencies: list[float] = []
        kinds: list[aker.HitKind] = []
        last = ""
        t_start = time.perf_counter()
        if args.batch > 0:
            for start in range(0, len(questions), args.batch):
                rows = questions[start : start + args.batch]
                t0 = time.perf_counter()
                b = client.search_batch(rows, k)
                per = (time.perf_counter() - t0) / max(len(rows), 1)
                latencies.extend([per] * len(rows))
                kinds.extend(b.kinds)
                last = prompt(start + len(rows) - 1, b[len(rows) - 1].ids)
        else:
            for i, q in enumerate(questions):
                t0 = time.perf_counter()
                r = client.search(q, k)
                latencies.append(time.perf_counter() - t0)
                kinds.append(r.kind)
                last = prompt(i, r.ids)
        wall = time.perf_counter() - t_start
    lat_ms = np.array(latencies) * 1e3
    hits = sum(1 for x in kinds if x != aker.HitKind.MISS)
    by_kind = ", ".join(f"{h.name.lower()} {sum(1 for x in kinds if x == h)}" for h in aker.HitKind)
    print(f"server: dim {info.dim}, {info.metric.name}, k_max {info.k_max}, protocol v{info.version}")
    how = f"search_batch({args.batch})" if args.batch else "search"
    print(f"questions: {len(kinds)}, k {k}, {how}")
    print(f"hit ratio: {hits / max(len(kinds), 1):.3f} ({by_kind})")
    print(
        f"latency ms: p50 {np.percentile(lat_ms, 50):.3f}  p99 {np.percentile(lat_ms, 99):.3f}  "
        f"max {lat_ms.max():.3f}  ({len(kinds) / max(wall, 1e-9):.0f} questions/s)"
    )
    print(f"last prompt: {last}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
