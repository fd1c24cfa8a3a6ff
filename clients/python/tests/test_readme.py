"""Every code block of README.md, run as written.

The line before each fenced block is an HTML comment (invisible once rendered):
``<!-- test: NAME -->`` (run here by ``test_readme_NAME``, dashes as underscores) or
``<!-- illustrative: why -->`` (not run: say why; keep these few). Each runner takes its
block from the README, replaces only what must differ here (the port, the host names of
a real deployment, file paths; each replacement must find its text), runs it in a fresh
interpreter (``sys.executable``: in CI the installed wheel) from a directory of its own,
and checks what it printed. Python blocks run against a real akerd started by conftest
(TLS and mutual TLS too), the Clusters block against fake nodes (fake_server.FakeCluster).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from akerd_process import Akerd
from conftest import DIM, K_MAX, SECRET
from fake_server import FakeCluster

HERE = Path(__file__).resolve().parent.parent
README = HERE / "README.md"
#: The most blocks that may be illustrative only.
ILLUSTRATIVE_MAX = 3

FENCE = re.compile(r"^```(\w*)\n(.*?)^```[ \t]*$", re.S | re.M)
MARK = re.compile(r"<!-- (test|illustrative): (.+?) -->")


@dataclass(frozen=True)
class Block:
    kind: str  # "test" or "illustrative"
    label: str  # the runner's name, or why it is not run
    lang: str
    code: str
    line: int


def readme_blocks() -> list[Block]:
    text = README.read_text(encoding="utf-8")
    blocks = []
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = MARK.fullmatch(before.strip())
        assert mark, (
            f"README.md line {line}: a ```{m.group(1)} block without <!-- test: NAME --> or "
            "<!-- illustrative: why --> on the line before it"
        )
        blocks.append(Block(mark.group(1), mark.group(2).strip(), m.group(1), m.group(2), line))
    return blocks


def block(name: str) -> Block:
    found = [b for b in readme_blocks() if b.kind == "test" and b.label == name]
    assert len(found) == 1, f"README.md has {len(found)} blocks marked <!-- test: {name} -->"
    return found[0]


def replaced(b: Block, subs: dict[str, str]) -> str:
    code = b.code
    for old, new in subs.items():
        assert old in code, f"README.md's {b.label} block (line {b.line}) no longer has {old!r}"
        code = code.replace(old, new)
    return code


def environment() -> dict[str, str]:
    """This process's environment (the blocks import the aker this process imports)
    without what would change how a block runs."""
    return {k: v for k, v in os.environ.items() if k not in ("AKER_SECRET", "PYTHONSTARTUP")}


def run_python(name: str, tmp_path: Path, subs: dict[str, str], timeout: float = 60.0) -> str:
    """Runs the Python block ``name`` with ``subs`` made; its stdout."""
    b = block(name)
    assert b.lang == "python", f"the {name} block is ```{b.lang}"
    code = replaced(b, subs)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                         cwd=str(tmp_path), env=environment())
    assert out.returncode == 0, f"README.md's {name} block (line {b.line}) failed:\n{code}\n---\n{out.stderr}"
    return out.stdout


def port(server: Akerd) -> dict[str, str]:
    assert server.host == "127.0.0.1"
    return {"7700": str(server.port)}


# ---------------------------------------------------------------------------- the marks


def runners() -> set[str]:
    return {n[len("test_readme_"):].replace("_", "-") for n in globals() if n.startswith("test_readme_")}


def test_every_block_is_run_or_says_why() -> None:
    blocks = readme_blocks()
    tested = [b.label for b in blocks if b.kind == "test"]
    assert len(tested) == len(set(tested)), f"a runner named twice: {sorted(tested)}"
    assert set(tested) == runners(), (
        f"blocks without a runner: {sorted(set(tested) - runners())}; "
        f"runners without a block: {sorted(runners() - set(tested))}"
    )
    illustrative = [b for b in blocks if b.kind == "illustrative"]
    assert len(illustrative) <= ILLUSTRATIVE_MAX, [f"line {b.line}: {b.label}" for b in illustrative]
    assert all(b.lang in ("python", "sh") for b in blocks), [(b.line, b.lang) for b in blocks]


def test_both_readmes_say_the_two_akers_cannot_live_side_by_side() -> None:
    """The client README's Install section and the repository's README say the same
    sentence about PyPI's unrelated `aker`."""
    note = (
        "The Python client is distributed as `aker-client` and imported as `aker`; PyPI's "
        "unrelated `aker` (an SSH gateway) also provides an `aker` import package, so the "
        "two cannot be installed side by side."
    )
    text = " ".join(README.read_text(encoding="utf-8").split())
    install = text[text.index("## Install"):text.index("## Connect")]
    assert note in install and "pip install aker-client" in install
    root = HERE.parent.parent / "README.md"
    if root.is_file():  # the sdist has no repository README
        assert note in " ".join(root.read_text(encoding="utf-8").split())


# ---------------------------------------------------------------------------- the blocks


def test_readme_connect(akerd: Akerd, tmp_path: Path) -> None:
    out = run_python("connect", tmp_path, port(akerd))
    first, second = out.splitlines()
    version, dim, metric, k_max, _max_batch = first.split()
    assert (int(version) >= 5, int(dim), metric, int(k_max)) == (True, DIM, "L2SQ", K_MAX)
    assert second.endswith(" ms")


def test_readme_pool(akerd: Akerd, tmp_path: Path) -> None:
    assert run_python("pool", tmp_path, port(akerd)).split() == ["64", "(5,)"]


def test_readme_search(akerd: Akerd, tmp_path: Path) -> None:
    lines = run_python("search", tmp_path, port(akerd)).splitlines()
    assert lines[0] == "MISS uint64 float32 10"  # a random query: never asked before
    assert len(lines) == 1 + 10 + 1 + 1 + 1 + 1
    assert lines[11] in ("MISS", "EXACT") and lines[12] == "[1000000]" and lines[13] == "MISS"
    assert lines[14] == "5 True b'x'"


def test_readme_batch(akerd: Akerd, tmp_path: Path) -> None:
    lines = run_python("batch", tmp_path, port(akerd)).splitlines()
    assert lines[0] == "(100, 5) (100, 5) 100" and lines[1].endswith("MISS 0.0")
    # Rows late past 5 ms, if any, are named (an unloaded akerd answers in time).
    assert all(re.fullmatch(r"row \d+ (DEADLINE_EXCEEDED|was late)", x) for x in lines[2:]), lines


def test_readme_asyncio(akerd: Akerd, tmp_path: Path) -> None:
    lines = run_python("asyncio", tmp_path, port(akerd)).splitlines()
    assert lines[0] == "32 (32, 10)" and lines[1] in ("MISS", "EXACT")
    shape, dim, connections = lines[2].split()
    assert (shape, int(dim), 1 <= int(connections) <= 4) == ("(5,)", DIM, True)


def test_readme_auth(akerd_auth: Akerd, workdir: Path, tmp_path: Path) -> None:
    assert (workdir / "secret").read_bytes().strip() == SECRET
    subs = {"/etc/aker/secret": str(workdir / "secret"), **port(akerd_auth)}
    assert run_python("auth", tmp_path, subs).splitlines() == ["True", "AuthRequired True"]


def test_readme_tls(akerd_tls: Akerd, akerd_mtls: Akerd, pki: Path, tmp_path: Path) -> None:
    # The certificate is for localhost and 127.0.0.1 (conftest's pki).
    subs = {"ca.crt": str(pki / "ca.crt"), "aker.internal": "localhost"}
    # The commented line, for mutual TLS: what an akerd with tls.client_ca_file needs.
    client_cert = f'ctx.load_cert_chain("{pki / "client.crt"}", "{pki / "client.key"}")'
    mutual = {'# ctx.load_cert_chain("client.crt", "client.key")': client_cert}
    for server, extra in ((akerd_tls, {}), (akerd_mtls, mutual)):
        lines = run_python("tls", tmp_path, {**subs, **extra, **port(server)}).splitlines()
        assert re.fullmatch(r"\d True", lines[0]) and lines[1:] == ["(3,)", "(3,)"], lines


def test_readme_positions(akerd: Akerd, tmp_path: Path) -> None:
    assert run_python("positions", tmp_path, port(akerd)).splitlines() == ["True False"]


def test_readme_cluster(tmp_path: Path) -> None:
    with FakeCluster(3) as fake:
        seeds = ", ".join(f'"{s}"' for s in fake.seeds)
        out = run_python("cluster", tmp_path, {'"10.0.0.1:7700", "10.0.0.2:7700"': seeds})
    lines = out.splitlines()
    assert lines[0].startswith("fake-cluster [(") and lines[0].count("True") == 3
    assert lines[1].endswith(" True") and lines[2].startswith("(100, 5) ClusterCounters(requests={")


def test_readme_cluster_async(tmp_path: Path) -> None:
    with FakeCluster(3) as fake:
        seeds = ", ".join(f'"{s}"' for s in fake.seeds)
        out = run_python("cluster-async", tmp_path, {'"10.0.0.1:7700", "10.0.0.2:7700"': seeds})
    assert out.splitlines() == ["64 (64, 10) 0"]


def test_readme_errors(akerd: Akerd, tmp_path: Path) -> None:
    assert run_python("errors", tmp_path, port(akerd)).splitlines() == [
        "DIM_MISMATCH 8 True",
        "BadK True",
        "UNKNOWN_COLLECTION False 0",
        "True",
    ]


def test_readme_rag_loop(akerd: Akerd, workdir: Path, tmp_path: Path) -> None:
    b = block("rag-loop")
    assert b.lang == "sh"
    commands = [line for line in b.code.splitlines() if line.strip()]
    assert commands and all(c.startswith("python examples/rag_loop.py ") for c in commands)
    for command in commands:
        line = replaced(Block(b.kind, b.label, b.lang, command, b.line),
                        {"--port 7700": f"--port {akerd.port}", "questions.npy": str(workdir / "data.npy")})
        argv = shlex.split(line)
        argv[:2] = [sys.executable, str(HERE / "examples" / "rag_loop.py")]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=str(tmp_path), env=environment())
        assert out.returncode == 0, f"{command}\n---\n{out.stderr}"
        assert re.search(r"hit ratio: [0-9.]+", out.stdout) and "latency ms: p50" in out.stdout, out.stdout
