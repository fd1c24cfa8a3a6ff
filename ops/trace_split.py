#!/usr/bin/env python3
"""Splits a trace (formats/TRACE.md) into two: operations [0, AT) and [AT, end), each
with the whole vector and ground-truth sections (ground truth is per vector, so both
halves keep it).   python3 ops/trace_split.py TRACE AT FIRST_OUT SECOND_OUT"""
import struct
import sys

SIZES = {1: 9, 2: 13, 3: 9}


def main(path, at, first, second):
    b = open(path, "rb").read()
    assert b[:8] == b"AKERTRC\0", "not a trace"
    dim, = struct.unpack_from("<I", b, 12)
    n_vectors, n_ops = struct.unpack_from("<QQ", b, 24)
    start = 40 + 4 * dim * n_vectors
    offsets, o = [], start
    for _ in range(n_ops):
        offsets.append(o)
        o += SIZES[b[o]]
    end_ops = o
    assert 0 < at < n_ops, f"AT must be inside 1..{n_ops - 1}"
    cut = offsets[at]
    for out, ops, count in ((first, b[start:cut], at), (second, b[cut:end_ops], n_ops - at)):
        header = bytearray(b[:40])
        struct.pack_into("<Q", header, 32, count)
        with open(out, "wb") as f:
            f.write(header + b[40:start] + ops + b[end_ops:])


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4])
