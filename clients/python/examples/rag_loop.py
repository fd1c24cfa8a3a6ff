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
from pathlib import Path
from typing import List, Optional, Sequence

import numpy as np

import aker


def parse(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
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


def load_questions(args: argparse.Namespace, dim: int) -> np.ndarray:
    path = args.vectors
    if path is None:
        path = Path(tempfile.mkdtemp()) / "questions.npy"
        rng = np.random.default_rng(args.seed)
        np.save(path, rng.standard_normal((max(args.popular, 1), dim)).astype(np.float32))
    vectors = np.load(path, allow_pickle=False)
    if vectors.ndim != 2 or vectors.shape[1] != dim:
        raise SystemExit("%s has shape %s; the server's dimension is %d" % (path, vectors.shape, dim))
    out: np.ndarray = np.ascontiguousarray(vectors, dtype=np.float32)
    return out


def stream(vectors: np.ndarray, args: argparse.Namespace) -> np.ndarray:
    """The questions users ask: a Zipf-like popularity over the first ``popular`` rows,
    some reworded."""
    rng = np.random.default_rng(args.seed)
    n_pop = max(1, min(args.popular, len(vectors)))
    weights = 1.0 / np.arange(1, n_pop + 1)
    picks = rng.choice(n_pop, size=args.questions, p=weights / weights.sum())
    asked: np.ndarray = vectors[picks].copy()
    reworded = rng.random(args.questions) < args.reword
    asked[reworded] += rng.normal(0.0, args.noise, size=(int(reworded.sum()), vectors.shape[1])).astype(np.float32)
    return asked


def prompt(question: int, doc_ids: np.ndarray) -> str:
    """Where a RAG application would fetch the documents and call its model."""
    return "question %d, context: documents %s" % (question, ", ".join(str(int(i)) for i in doc_ids))


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse(argv)
    secret = None if args.secret_file is not None else os.environ.get("AKER_SECRET")
    with aker.Client(args.host, args.port, secret=secret, secret_file=args.secret_file) as client:
        info = client.info
        questions = stream(load_questions(args, args.dim or info.dim), args)
        k = min(args.k, info.k_max)
        latencies: List[float] = []
        kinds: List[aker.HitKind] = []
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
    by_kind = ", ".join("%s %d" % (h.name.lower(), sum(1 for x in kinds if x == h)) for h in aker.HitKind)
    print("server: dim %d, %s, k_max %d, protocol v%d" % (info.dim, info.metric.name, info.k_max, info.version))
    print("questions: %d, k %d, %s" % (len(kinds), k, "search_batch(%d)" % args.batch if args.batch else "search"))
    print("hit ratio: %.3f (%s)" % (hits / max(len(kinds), 1), by_kind))
    print(
        "latency ms: p50 %.3f  p99 %.3f  max %.3f  (%.0f questions/s)"
        % (np.percentile(lat_ms, 50), np.percentile(lat_ms, 99), lat_ms.max(), len(kinds) / max(wall, 1e-9))
    )
    print("last prompt: %s" % last)
    return 0


if __name__ == "__main__":
    sys.exit(main())
