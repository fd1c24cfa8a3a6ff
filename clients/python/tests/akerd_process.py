"""Starting a real akerd for the tests: the binary at $AKERD (built beforehand, never
here), a config of our own on 127.0.0.1 (port 0: the kernel picks a free one, read back
from akerd's "ready" log line), a small collection written as a .npy, bounded waits."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_AKERD = HERE.parent.parent.parent / "target" / "debug" / "akerd"

READY = re.compile(r"ready listen=(127\.0\.0\.1):(\d+)")


def akerd_binary() -> Path:
    return Path(os.environ.get("AKERD", str(DEFAULT_AKERD))).resolve()


def config_text(kind: str, data_file: str, secret_file: str | None = None, k_max: int = 32, delta: int = 3,
                max_inflight: int = 8, max_frame_bytes: int = 65536, max_batch: int | None = None,
                tls: str | None = None) -> str:
    """An akerd config: one executor (the CI machine has 2 cores), an exact store over
    ``data_file`` (or cache-aside with it as the routing sample), only exact cache hits
    (proximity policy with threshold 0: answers are checkable against numpy).
    ``max_batch``: the server's (protocol v4), left to its default when ``None``.
    ``tls``: the lines of a ``[tls]`` table."""
    recall = "recall_floor = 0.0\n"
    backend = (
        'kind = "embedded"\nindex = "exact"\nthreads = 1\n'
        if kind == "embedded"
        else 'kind = "cache_aside"\nthreads = 1\n'
    )
    auth = f'[auth]\nsecret_file = "{secret_file}"\n' if secret_file else ""
    batch = f"batch_max = {max_batch}\n" if max_batch is not None else ""
    tls_table = "\n[tls]\n" + tls if tls else ""
    return (
        "[server]\n"
        'listen = "127.0.0.1:0"\n'
        "executors = 1\n"
        f"inflight_max = {max_inflight}\n"
        f"frame_bytes_max = {max_frame_bytes}\n"
        f"{batch}"
        "request_timeout_ms = 5000\n"
        "idle_timeout_ms = 120000\n"
        "shutdown_poll_ms = 10\n"
        "shutdown_grace_ms = 1000\n"
        "auth_timeout_ms = 10000\n"
        "\n[cache]\n"
        f"k_max = {k_max}\n"
        f"delta = {delta}\n"
        "capacity_objects = 20000\n"
        'filter = { kind = "brute_force" }\n'
        'policy = { kind = "proximity", threshold = 0.0 }\n'
        f"{recall}"
        "\n[sharding]\n"
        "shards = 2\n"
        "centroids = 8\n"
        "rebalance_ms = 0\n"
        "\n[backend]\n"
        f"{backend}"
        f'data = {{ kind = "file", path = "{data_file}" }}\n'
        "\n[admin]\n"
        "enabled = false\n"
        "\n"
        f"{auth}"
        f"{tls_table}"
    )


class Akerd:
    """One akerd process; ``port`` once started."""

    def __init__(self, workdir: Path, config: str) -> None:
        self.workdir = workdir
        self.config_path = workdir / "akerd.toml"
        self.config_path.write_text(config)
        self.log_path = workdir / "akerd.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.host = "127.0.0.1"
        self.port = 0

    def start(self, ready_timeout: float = 30.0) -> Akerd:
        binary = akerd_binary()
        if not binary.is_file():
            raise RuntimeError(
                f"no akerd binary at {binary}: build it first (cargo build --bin akerd) or set AKERD"
            )
        env = dict(os.environ)
        env["RUST_LOG"] = "info"
        env.setdefault("MIMALLOC_ALLOW_THP", "0")
        log = open(self.log_path, "wb")
        try:
            self.proc = subprocess.Popen(
                [str(binary), "--config", str(self.config_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=str(self.workdir),
                env=env,
            )
        finally:
            log.close()
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline:
            m = READY.search(self.log_path.read_text(errors="replace"))
            if m:
                self.port = int(m.group(2))
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"akerd exited with {self.proc.returncode}:\n{self.log()}")
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"akerd not ready within {ready_timeout} s:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def stop(self, timeout: float = 10.0) -> int | None:
        p = self.proc
        if p is None:
            return None
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        self.proc = None
        return p.returncode
