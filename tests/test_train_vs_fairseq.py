"""lnexp train follows stock fairseq-train update for update (Post-LN and Pre-LN)."""

from __future__ import annotations

import csv
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import lnexp_main

pytestmark = pytest.mark.slow
UPDATES = 20


def stock_losses(cmd: str, save_dir: Path) -> list[dict]:
    argv = shlex.split(cmd)[1:] + ["--max-update", str(UPDATES), "--log-format", "json",
                                   "--log-interval", "1", "--save-dir", str(save_dir),
                                   "--no-save"]
    fairseq_train = Path(sys.executable).with_name("fairseq-train")
    proc = subprocess.run([str(fairseq_train), *argv], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = []
    for line in (proc.stdout + proc.stderr).splitlines():
        if "| train_inner |" in line:
            rows.append(json.loads(line.split("| train_inner |", 1)[1]))
    return rows


@pytest.mark.parametrize("placement", ["post_ln", "pre_ln"])
def test_first_updates_equal_stock_fairseq_train(tmp_path, small_multi30k, prepared_cache, placement):
    runs = tmp_path / "runs"
    # in this process (the run's files are compared, not its process), 2+2 layers: the same
    # arithmetic as 6+6 on both sides, a third of the CPU time
    lnexp_main("train", f"placement={placement}", "schedule=inverse_sqrt",
               f"dataset.dir={small_multi30k}", "dataset.vocab_size=600", "scale.max_tokens=600",
               "depth.encoder_layers=2", "depth.decoder_layers=2", "warmup=8", "lr=2e-3",
               f"max_update={UPDATES}", "eval.subset=10", f"runs_root={runs}",
               cache=prepared_cache)
    (run_dir,) = runs.iterdir()
    cmd = json.loads((run_dir / "run.json").read_text())["stock_fairseq_train"]
    assert "--arch transformer" in cmd and "--encoder-layers 2 --decoder-layers 2" in cmd
    assert ("--encoder-normalize-before" in cmd) == (placement == "pre_ln")
    with open(run_dir / "updates.csv") as f:
        ours = list(csv.DictReader(f))
    stock = stock_losses(cmd, tmp_path / "stock")
    assert len(ours) == len(stock) == UPDATES
    for mine, theirs in zip(ours, stock, strict=True):
        # fairseq prints 3 decimals; the same arithmetic gives the same rounded numbers
        assert round(float(mine["loss"]), 3) == pytest.approx(float(theirs["loss"]), abs=1e-3)
        assert round(float(mine["gnorm"]), 3) == pytest.approx(float(theirs["gnorm"]), abs=1e-3)
        assert float(mine["ntokens"]) == float(theirs["wpb"])
    # the run moved: the loss at update 20 is well below the first one
    assert float(ours[-1]["loss"]) < float(ours[0]["loss"]) - 0.5
