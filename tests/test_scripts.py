"""The benchmark scripts run (quick/tiny modes) and print their tables. No timing assertions.
Most run in this process (``run_here``: the tables are what is tested, not the process); the
runs and children they start are processes of their own, as they are for a user."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, process_state_kept

pytestmark = pytest.mark.slow
SCRIPTS = REPO / "scripts"


@pytest.fixture(scope="module")
def bench_env(tmp_path_factory) -> dict[str, str]:
    cache = tmp_path_factory.mktemp("bench_cache")
    return {**os.environ, "LNEXP_CACHE": str(cache), "PYTHONWARNINGS": "ignore",
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}


def run_script(name: str, *args: str, env: dict[str, str], timeout: int = 300) -> str:
    """The script in a fresh interpreter, as a user runs it; its stdout."""
    proc = subprocess.run([sys.executable, str(SCRIPTS / name), *args], capture_output=True,
                          text=True, env=env, cwd=REPO, timeout=timeout)
    assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return proc.stdout


def run_here(name: str, *args: str, env: dict[str, str]) -> str:
    """The script run as ``__main__`` in this process, for the tests that read its tables, not its
    process: the same code without the ~6 CPU s of a fresh interpreter that imports torch, fairseq
    and hydra and builds its first trainer. Its environment is ``env`` while it runs; what it
    changes for the process is put back afterwards (tests.conftest.process_state_kept). The
    subprocesses a script starts itself (training runs, children) are still their own. Its stdout."""
    import contextlib
    import io
    import runpy

    out, rc = io.StringIO(), 0
    with process_state_kept():
        os.environ.clear()
        os.environ.update(env)
        sys.argv = [str(SCRIPTS / name), *args]
        with contextlib.chdir(REPO), contextlib.redirect_stdout(out):
            try:
                runpy.run_path(str(SCRIPTS / name), run_name="__main__")
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    assert rc == 0, f"{name} exited {rc}:\n{out.getvalue()}"
    return out.getvalue()


def table_rows(out: str, *columns: str) -> list[list[str]]:
    """The rows (cells split on 2+ spaces) of the table whose header begins with ``columns``."""
    import re

    lines = out.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.split()[:len(columns)] == list(columns))
    rows = []
    for ln in lines[start + 2:]:
        if not ln.strip() or ln.startswith("#"):
            break
        rows.append(re.split(r"\s{2,}", ln.strip()))
    return rows


def number(cell: str) -> float:
    return float(cell.replace(",", "").rstrip("%"))


def positive(cell: str) -> bool:
    x = number(cell)
    return math.isfinite(x) and x > 0


def data_args(small_multi30k: Path) -> list[str]:
    return ["--dataset-dir", str(small_multi30k), "--vocab-size", "600"]


def test_bench_train_quick_prints_throughput_ratio_and_stock_command(small_multi30k, bench_env):
    out = run_here("bench_train.py", "--quick", "--models", "mini", "--placements", "post_ln",
                     *data_args(small_multi30k), env=bench_env)
    assert "load avg" in out and "GFLOP/s" in out
    rows = table_rows(out, "model", "placement")
    assert [(r[0], r[1], r[2]) for r in rows] == [("mini", "post_ln", "stock"),
                                                  ("mini", "post_ln", "lnexp")]
    for r in rows:
        tok_s, mflop_tok, of_peak = r[4], r[8], r[10]
        assert positive(tok_s) and positive(mflop_tok) and positive(of_peak)
    (ratio,) = table_rows(out, "model", "ratio")
    assert ratio[1] == "lnexp/stock post_ln" and positive(ratio[2])
    stock = [ln for ln in out.splitlines() if ln.strip().startswith("[mini post_ln] fairseq-train")]
    assert len(stock) == 1 and "--arch transformer" in stock[0]
    assert "--encoder-normalize-before" not in stock[0] and "--disable-validation" in stock[0]


def test_bench_train_interleaved_compile_prints_compiled_over_eager(small_multi30k, bench_env):
    # a fresh interpreter: torch.compile's caches and compile workers stay out of this process
    out = run_script("bench_train.py", "--quick", "--interleaved", "--compile", "--models", "mini",
                     "--placements", "post_ln", *data_args(small_multi30k), env=bench_env)
    rows = table_rows(out, "model", "placement")
    assert [r[2] for r in rows] == ["stock", "lnexp", "compiled"]
    assert all(positive(r[4]) for r in rows)
    ratios = {r[1]: r for r in table_rows(out, "model", "ratio")}
    assert positive(ratios["compiled/eager post_ln"][2]) and positive(ratios["lnexp/stock post_ln"][2])


def test_bench_eval_quick_prints_validation_share(small_multi30k, bench_env):
    out = run_here("bench_eval.py", "--quick", *data_args(small_multi30k), env=bench_env)
    rows = table_rows(out, "BLEU", "setting")
    assert len(rows) == 2
    assert rows[0][0].startswith("beam 1, batch 256") and rows[1][0].startswith("beam 5, batch 64")
    for r in rows:
        bleu_s, share = r[1], r[4]
        assert positive(bleu_s) and 0 < number(share) < 1
    assert "updates/epoch" in out and "extrapolated" in out


def test_bench_startup_quick(bench_env):
    out = run_here("bench_startup.py", "--quick", env=bench_env)
    rows = {r[0]: r for r in table_rows(out, "command")}
    assert set(rows) >= {"lnexp --help", "lnexp train --cfg job"}
    assert all(positive(r[1]) for r in rows.values())
    assert "`lnexp --help` among torch, fairseq, hydra, numpy: none" in out


def test_profile_step_quick_splits_update_time_and_reports_matmul_ceiling(small_multi30k, bench_env):
    out = run_here("profile_step.py", "--quick", *data_args(small_multi30k), env=bench_env)
    cats = {r[0]: r for r in table_rows(out, "category", "of")}
    assert "matrix multiply (mm, addmm, bmm)" in cats and "dropout masks (bernoulli_)" in cats
    shares = [number(r[2]) for name, r in cats.items() if not name.startswith("(")]
    assert abs(sum(shares) - 1) < 0.01 and all(0 <= s <= 1 for s in shares)
    assert number(cats["matrix multiply (mm, addmm, bmm)"][2]) > 0
    eff = {r[0].split(" (")[0]: r for r in table_rows(out, "efficiency")}
    kernels = eff["matmul kernels inside the model"]
    assert positive(kernels[1]) and positive(kernels[2])
    assert "ceiling set by this model's matmul shapes" in out


def test_profile_step_syncs_lists_the_host_reads_by_line_and_the_calls_by_phase(small_multi30k,
                                                                                bench_env):
    """With the default speed.syncs=fewer fairseq's meters are not read back (meters.py); the
    Trainer's finiteness check before the step is (trainer.py), and fused Adam is 4 calls."""
    out = run_here("profile_step.py", "--quick", "--syncs", "--override", "speed.adam=fused",
                     *data_args(small_multi30k), env=bench_env)
    reads = {r[1].split(":")[0]: r for r in table_rows(out, "per", "update", "where")}
    assert "fairseq/trainer.py" in reads and reads["fairseq/trainer.py"][2] == "GPU sync"
    assert "fairseq/logging/meters.py" not in reads
    calls = {" ".join(r[:-1]): number(r[-1]) for r in table_rows(out, "phase", "aten")}
    assert calls["optimizer step"] == 4 and calls["backward"] > calls["forward + loss"] > 0


def test_bench_sharing_quick_prints_the_table_and_the_threads_taken(small_multi30k, bench_env,
                                                                   tmp_path):
    """One tiny run (each run is a process with lnexp's start-up, ~20 s: `--runs 1,2` would take
    four); the side-by-side rows are the same code with N processes started together."""
    env = {**bench_env, "LNEXP_ACTIVE_DIR": str(tmp_path / "active")}  # this test's runs only
    out = run_here("bench_sharing.py", "--quick", "--runs", "1", *data_args(small_multi30k),
                     env=env)
    assert "OMP_NUM_THREADS=unset" in out  # lnexp's defaults are what is measured
    (row,) = table_rows(out, "runs", "apart_s")
    assert row[0] == "1" and positive(row[1]) and positive(row[3]) and number(row[5]) == 1.0
    cores = len(os.sched_getaffinity(0))  # alone, with OMP_NUM_THREADS unset: every core
    assert row[6] == f"{cores} (all {cores} cores, no other lnexp training on this host)"


@pytest.fixture(scope="module")
def bf16_cpu():
    """Explicit precision=bf16 stops where this CPU fails lnexp's bf16 self-check (an AMD EPYC
    without bf16, or --fake-cpu=amd): skip there."""
    from lnexp.train.precision import self_check

    why = self_check()
    if why is not None:
        pytest.skip(f"bf16 self-check fails on this CPU: {why}")


@pytest.fixture(scope="module")
def bf16_numbers(bf16_cpu):
    """bf16's numbers, not only its path: the self-check passes on this CPU itself, not only as
    --fake-cpu=intel fakes it (a CPU without bf16 would emulate it: slow, and not what is meant)."""
    from lnexp.train.precision import measured_self_check

    why = measured_self_check()
    if why is not None:
        pytest.skip(f"bf16 self-check passes only as faked; this CPU's own fails: {why}")


def test_bench_train_fast_paths_print_updates_per_second_against_fp32(small_multi30k, bench_env,
                                                                     bf16_cpu):
    out = run_here("bench_train.py", "--quick", "--interleaved", "--no-stock", "--fast", "bf16",
                     "--models", "mini", "--placements", "post_ln", *data_args(small_multi30k),
                     env=bench_env)
    assert [r[2] for r in table_rows(out, "model", "placement")] == ["lnexp", "bf16"]
    (row,) = table_rows(out, "model", "placement", "path")
    assert row[:3] == ["mini", "post_ln", "bf16"] and row[-1] == ">= 2.0"
    assert positive(row[3]) and positive(row[4]) and positive(row[5])


def test_profile_step_cell_splits_a_cell_by_phase(small_multi30k, bench_env):
    out = run_here("profile_step.py", "--quick", "--cell", "--precision", "auto",
                     *data_args(small_multi30k), env=bench_env)
    assert "# precision: bf16 autocast on CPU (precision=auto" in out or "# precision: fp32 (" in out
    rows = {r[0]: r for r in table_rows(out, "phase")}
    for phase in ("start-up (imports, config, data, model, trainer)", "forward + loss", "backward",
                  "optimizer (clip + step)", "validation loss (whole valid set)"):
        assert positive(rows[phase][2]), phase
    shares = [number(r[3]) for name, r in rows.items() if name != "cell (extrapolated)"]
    assert sum(shares) == pytest.approx(1.0, abs=0.01)


def test_precision_check_quick_compares_fp32_and_bf16(small_multi30k, bench_env, bf16_numbers):
    out = run_here("precision_check.py", "--quick", *data_args(small_multi30k), env=bench_env)
    grads = table_rows(out, "placement", "seed")
    assert [r[0] for r in grads] == ["post_ln", "pre_ln", "peri_ln"]
    assert all(0 <= number(r[4]) < 0.2 for r in grads)  # bf16 gradient norms near fp32's
    cells = table_rows(out, "cell", "precision")
    assert [r[1] for r in cells] == ["fp32", "bf16"] and all(r[3] == "4" for r in cells)


def test_order_effect_prints_both_runs_on_the_same_batches(small_multi30k, bench_env):
    out = run_here("order_effect.py", "--updates", "2", *data_args(small_multi30k), env=bench_env)
    rows = table_rows(out, "run", "aten::mm")
    assert [r[0] for r in rows] == ["first", "second"]
    assert all(positive(r[1]) and positive(r[2]) for r in rows)
    assert rows[0][3] == rows[1][3]  # the same batches, the same model: the same loss
