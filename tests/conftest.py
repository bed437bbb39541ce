"""Shared fixtures: tiny real fairseq dictionaries, models and batches (no mocks)."""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# Under `make test` two pytest-xdist workers share the 2 cores: one thread each, so that they never
# oversubscribe them (two processes that each take every core run several times slower each).
# (Forced in a worker: the controller process, which loads this file too, sets the serial default.)
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
os.environ.setdefault("OMP_NUM_THREADS", "2")
# the tests' trainings share the cores among themselves only, not with other lnexp runs of the host
os.environ.setdefault("LNEXP_ACTIVE_DIR", tempfile.mkdtemp(prefix="lnexp-test-active-"))
REPO = Path(__file__).resolve().parents[1]


class TinyTask:
    """Just what fairseq's model builders read from a task: the two dictionaries."""

    def __init__(self, vocab: int = 40) -> None:
        from fairseq.data import Dictionary

        d = Dictionary()
        for i in range(vocab):
            d.add_symbol(f"w{i}")
        self.source_dictionary = self.target_dictionary = d


def tiny_args(arch: str = "transformer", **over) -> argparse.Namespace:
    """The namespace fairseq-train builds for `arch` (its own parser), tiny sizes, then `over`."""
    from fairseq import options

    base = dict(
        encoder_embed_dim=16, decoder_embed_dim=16, encoder_ffn_embed_dim=32,
        decoder_ffn_embed_dim=32, encoder_attention_heads=2, decoder_attention_heads=2,
        encoder_layers=2, decoder_layers=2, dropout=0.0,
    )
    argv = ["/nonexistent", "--arch", arch, "--share-all-embeddings"]
    for k, v in {**base, **over}.items():
        flag = "--" + k.replace("_", "-")
        if isinstance(v, bool):
            argv += [flag] if v else []
        else:
            argv += [flag, str(v)]
    return options.parse_args_and_arch(options.get_training_parser(), argv)


@pytest.fixture(scope="session")
def tiny_task() -> TinyTask:
    import lnexp.model  # noqa: F401  (registers ln_transformer)

    return TinyTask()


@pytest.fixture
def tiny_batch():
    import torch

    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, 40, (3, 7), generator=g)
    src[0, :2] = 1  # left padding, as fairseq batches have
    prev = torch.randint(4, 40, (3, 5), generator=g)
    prev[:, 0] = 2
    lengths = (src != 1).sum(1)
    target = torch.randint(4, 40, (3, 5), generator=g)
    return src, lengths, prev, target


def write_gz(path: Path, lines: list[str]) -> None:
    import gzip

    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))


SMALL_PAIRS = {"train": 600, "val": 60, "test_2016_flickr": 40}  # small_multi30k's pairs
TINY_PAIRS = {"train": 200, "val": 20, "test_2016_flickr": 20}  # tiny_multi30k's pairs


def multi30k_head(raw: Path, pairs: dict[str, int]) -> Path:
    """The first ``pairs`` of each split of the shipped Multi30k, written to ``raw`` in its layout."""
    import gzip

    for stem, n in pairs.items():
        for lang in ("de", "en"):
            with gzip.open(REPO / "data" / "multi30k" / f"{stem}.{lang}.gz", "rt",
                           encoding="utf-8") as f:
                lines = [next(f).rstrip("\n") for _ in range(n)]
            write_gz(raw / f"{stem}.{lang}.gz", lines)
    return raw


def prepared(tmp_path_factory, name: str, raw: Path) -> Path:
    """A cache holding ``raw`` prepared at the tests' vocabulary (600)."""
    cache = tmp_path_factory.mktemp(name)
    lnexp_main("prepare", "multi30k", "--dir", str(raw), "--vocab-size", "600", cache=cache)
    return cache


@pytest.fixture(scope="session")
def small_multi30k(tmp_path_factory) -> Path:
    """The first pairs of the shipped Multi30k, in its raw layout: real text, small enough to train."""
    return multi30k_head(tmp_path_factory.mktemp("multi30k_small"), SMALL_PAIRS)


@pytest.fixture(scope="session")
def prepared_cache(tmp_path_factory, small_multi30k) -> Path:
    """A cache holding small_multi30k prepared at the tests' vocabulary (600), for the trainings
    that only read it: each of them would otherwise prepare it again (1-2 CPU s). A test about
    preparing, or one that damages a cache, keeps a cache of its own."""
    return prepared(tmp_path_factory, "prepared_cache", small_multi30k)


@pytest.fixture(scope="session")
def tiny_multi30k(tmp_path_factory) -> Path:
    """Fewer pairs of the shipped Multi30k than small_multi30k (200 to train, 20 to validate), in
    its raw layout: for the trainings that check a path (what a run writes, how it ends, what it
    says), not what it learns: a third of small_multi30k's updates an epoch."""
    return multi30k_head(tmp_path_factory.mktemp("multi30k_tiny"), TINY_PAIRS)


@pytest.fixture(scope="session")
def tiny_prepared_cache(tmp_path_factory, tiny_multi30k) -> Path:
    """A cache holding tiny_multi30k prepared at the tests' vocabulary (600), as prepared_cache."""
    return prepared(tmp_path_factory, "tiny_prepared_cache", tiny_multi30k)


def lnexp_cmd(*args: str, cache: Path, check: bool = True, timeout: int = 900):
    """Run the installed CLI in a subprocess, as a user would."""
    import subprocess
    import sys

    env = {**os.environ, "LNEXP_CACHE": str(cache), "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, "-m", "lnexp.cli", *args], capture_output=True,
                          text=True, env=env, timeout=timeout, cwd=REPO)
    if check and proc.returncode != 0:
        raise AssertionError(f"lnexp {' '.join(args)} exited {proc.returncode}:\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


@contextlib.contextmanager
def process_state_kept() -> Iterator[None]:
    """What a command or a script run in this process changes for its process, put back when it
    ends: the environment, sys.argv and sys.path, the SIGTERM handler, torch's thread count (where
    torch is imported), Hydra's global state and per-job log handlers."""
    import signal
    import sys

    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    from lnexp.logs import loggers_state, restore_loggers

    env, argv, path = dict(os.environ), sys.argv, list(sys.path)
    term = signal.getsignal(signal.SIGTERM)
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch is not None else None
    hydra_cfg, hydra_up = HydraConfig.instance().cfg, GlobalHydra.instance().is_initialized()
    loggers = loggers_state()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(env)
        sys.argv, sys.path[:] = argv, path
        signal.signal(signal.SIGTERM, term)
        if threads is not None:
            torch.set_num_threads(threads)
        HydraConfig.instance().cfg = hydra_cfg  # later direct calls are not "under Hydra"
        if not hydra_up:
            GlobalHydra.instance().clear()
        restore_loggers(loggers)


def lnexp_main(*args: str, cache: Path, check: bool = True):
    """The CLI's own ``main`` in this process, for tests about what a command does, not about its
    process: the same dispatch and exit status as :func:`lnexp_cmd` without the 3-5 s start (and
    fairseq import) of a fresh interpreter. What a command changes for its process is put back
    afterwards (:func:`process_state_kept`); what it writes to sys.stdout/sys.stderr is returned
    as a CompletedProcess's would be (a launcher's worker processes write to their own streams)."""
    import io
    import subprocess

    from lnexp.cli import main

    out, err = io.StringIO(), io.StringIO()
    with process_state_kept():
        os.environ.update(LNEXP_CACHE=str(cache), PYTHONWARNINGS="ignore")
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(list(args))
            except SystemExit as e:  # argparse's and Hydra's own errors
                rc = e.code if isinstance(e.code, int) else 1
    proc = subprocess.CompletedProcess(["lnexp", *args], rc, out.getvalue(), err.getvalue())
    if check and rc != 0:
        raise AssertionError(f"lnexp {' '.join(args)} exited {rc}:\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


# As tests/test_train.py's SMALL, but 2+2 layers and 6 updates an epoch at a low constant lr:
# 2 epochs in seconds, and a barely trained model whose translations differ from sentence to
# sentence (so that comparing two decoders' outputs means something). The per-epoch BLEU decodes
# all 60 validation sentences (not a multiple of 8), as `lnexp evaluate --split valid` does.
TINY = ["dataset.vocab_size=600", "scale.max_tokens=4000", "depth.encoder_layers=2",
        "depth.decoder_layers=2", "lr=1e-4", "warmup=0", "schedule=constant",
        "divergence.plateau_epoch=99", "max_epoch=2", "checkpoint.keep_last_epochs=2"]


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory, small_multi30k) -> Path:
    """One real trained run (2 epochs), shared by the evaluation and the bad-input tests."""
    tmp = tmp_path_factory.mktemp("evalrun")
    lnexp_main("train", f"dataset.dir={small_multi30k}", *TINY, f"runs_root={tmp / 'runs'}",
               cache=tmp / "cache")  # in-process: the tests read the run, not the process
    (run_dir,) = (tmp / "runs").iterdir()
    return run_dir


# `--dist loadfile` hands each worker a whole file when it is free. pytest-xdist's own order (files
# with most tests first) left the files that are one or two long trainings (gpu_session, the sweep
# and fig2 pipeline tests: a minute or more each) for the end, where one worker ran them alone
# while the other had finished. Longest first instead; then, as xdist would, most tests first.
# (The files known to cost about a minute of one core or more, heaviest first: CPU seconds measured
# 2026-12-02 file by file, where known: distributed 96, gpu_session 74, results 64, evaluate 63.)
HEAVIEST_FILES = ["test_train.py", "test_scripts.py", "test_gpu_session.py", "test_atlas_launchers.py",
                  "test_experiments.py", "test_distributed.py", "test_zoo.py", "test_bad_inputs.py",
                  "test_results.py", "test_atlas_zoo.py", "test_figures_fig2_fig4.py",
                  "test_atlas_driver.py", "test_evaluate.py", "test_speed.py", "test_sweep.py",
                  "test_train_vs_fairseq.py", "test_fig3_theory.py", "test_wheelhouse.py",
                  "test_precision.py", "test_data_multi30k.py", "test_docs.py", "test_run_folder.py"]


# The two CPU kinds that build and test lnexp (issue 49), as /proc/cpuinfo shows them: an Intel
# Xeon with AMX and AVX-512 bf16 units, and an AMD EPYC with AVX2 and FMA only (whose oneDNN has no
# bf16: the self-check fails there). `--fake-cpu=KIND` runs the suite as on that kind, on any
# machine: LNEXP_CPUINFO names a file holding these lines, read instead of /proc/cpuinfo, and
# LNEXP_BF16_SELF_CHECK decides the bf16 self-check (lnexp/train/precision.py), in this process
# and in every subprocess the tests start. `--bf16-self-check=pass|fail` overrides the kind's.
FAKE_CPUS = {
    "intel": ("Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz",
              "fpu sse sse2 avx avx2 fma avx512f avx512bw avx512_vnni avx512_bf16 avx512_fp16 "
              "amx_bf16 amx_tile amx_int8", "pass"),
    "amd": ("AMD EPYC 7B12", "fpu sse sse2 avx avx2 fma", "fail"),
}


def pytest_addoption(parser) -> None:
    parser.addoption("--fake-cpu", choices=sorted(FAKE_CPUS), default=None,
                     help="run as on this CPU kind: its /proc/cpuinfo flags and its bf16 "
                          "self-check result, in subprocesses too (intel: AMX and AVX-512 bf16, "
                          "the check passes; amd: AVX2 only, the check fails)")
    parser.addoption("--bf16-self-check", choices=("pass", "fail"), default=None,
                     help="force lnexp's bf16 self-check (LNEXP_BF16_SELF_CHECK), in subprocesses "
                          "too; default: the --fake-cpu kind's, else the real check")


def fake_cpu(config) -> None:
    """Set the environment that --fake-cpu / --bf16-self-check ask for (each xdist worker too)."""
    kind, check = config.getoption("--fake-cpu"), config.getoption("--bf16-self-check")
    if kind:
        model, flags, check = FAKE_CPUS[kind][0], FAKE_CPUS[kind][1], check or FAKE_CPUS[kind][2]
        path = Path(tempfile.mkdtemp(prefix="lnexp-test-cpuinfo-")) / "cpuinfo"
        path.write_text("".join(f"processor\t: {i}\nmodel name\t: {model}\nflags\t\t: {flags}\n\n"
                                for i in range(2)))
        os.environ["LNEXP_CPUINFO"] = str(path)
    if check:
        os.environ["LNEXP_BF16_SELF_CHECK"] = check


def pytest_report_header(config) -> str | None:
    kind, check = config.getoption("--fake-cpu"), os.environ.get("LNEXP_BF16_SELF_CHECK")
    if kind or check:
        return (f"fake CPU: {kind or 'this one'} (LNEXP_CPUINFO={os.environ.get('LNEXP_CPUINFO')}, "
                f"LNEXP_BF16_SELF_CHECK={check})")
    return None


def pytest_configure(config) -> None:
    fake_cpu(config)
    if CPU_LOG and not os.environ.get("PYTEST_XDIST_WORKER"):
        Path(CPU_LOG).write_text("")  # this session's lines only (the workers start after this)
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist >= 3.6
        config.option.loadscopereorder = False  # keep the order below


# `LNEXP_TEST_CPU=FILE pytest ...` appends a line per test to FILE: its node id, its worker, its
# wall seconds and its CPU seconds (user + system of this process and of the subprocesses it waited
# for), set-up and tear-down included. On a shared machine wall times follow the load, CPU seconds
# hardly do: compare those (docs/development.md#tests). A pytest that a test starts does not write.
CPU_LOG = None if os.environ.get("PYTEST_CURRENT_TEST") else os.environ.get("LNEXP_TEST_CPU")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not CPU_LOG:
        yield
        return
    import json
    import resource
    import time

    def cpu() -> float:
        me, kids = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                         resource.RUSAGE_CHILDREN))
        return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime

    wall, used = time.perf_counter(), cpu()
    yield
    line = json.dumps({"test": item.nodeid, "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
                       "wall": round(time.perf_counter() - wall, 3),
                       "cpu": round(cpu() - used, 3)}) + "\n"
    fd = os.open(CPU_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())  # one write a line: the workers' lines never interleave
    finally:
        os.close(fd)


def pytest_terminal_summary(terminalreporter) -> None:
    """LNEXP_TEST_CPU's lines summed per file (and per worker), most CPU seconds first."""
    if not CPU_LOG or os.environ.get("PYTEST_XDIST_WORKER") or not Path(CPU_LOG).is_file():
        return
    import json
    from collections import defaultdict

    files: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    workers: dict[str, float] = defaultdict(float)
    for line in Path(CPU_LOG).read_text().splitlines():
        row = json.loads(line)
        total = files[row["test"].split("::")[0]]
        total[0], total[1], total[2] = total[0] + row["cpu"], total[1] + row["wall"], total[2] + 1
        workers[row["worker"]] += row["cpu"]
    write = terminalreporter.write_line
    write(f"CPU seconds per file ({CPU_LOG}): cpu_s wall_s tests file")
    for name, (cpu, wall, n) in sorted(files.items(), key=lambda kv: -kv[1][0]):
        write(f"{cpu:8.1f} {wall:8.1f} {n:4d} {name}")
    write(f"{sum(c for c, _, _ in files.values()):8.1f} in all; per worker: "
          + ", ".join(f"{w} {c:.1f}" for w, c in sorted(workers.items())))


def pytest_collection_modifyitems(config, items) -> None:
    from collections import Counter

    per_file = Counter(Path(str(item.fspath)).name for item in items)
    rank = {name: i for i, name in enumerate(HEAVIEST_FILES)}

    def key(item) -> tuple[int, int]:
        name = Path(str(item.fspath)).name
        return rank.get(name, len(rank)), -per_file[name]

    items.sort(key=key)  # stable: a file's tests keep their order
