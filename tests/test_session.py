"""lnexp.train.session: one builder from a config to the run, used by training and every benchmark;
the config resolved once; stock fairseq's settings of each precision (scripts/_bench.py)."""

from __future__ import annotations

import csv
import json
import math
import re
import sys

import pytest

from tests.conftest import REPO

TINY = ["dataset.vocab_size=600", "depth.encoder_layers=2", "depth.decoder_layers=2",
        "scale.max_tokens=512", "schedule=inverse_sqrt", "placement=pre_ln", "threads=1"]
ONE_UPDATE = ["max_update=1", "eval.subset=4", "divergence.plateau_epoch=99"]
# what builds a fairseq Trainer: only the adapter (fairseq's class) and the session may
BUILDS = re.compile(r"\b(build_trainer|Trainer|trainer_class)\(")
ALLOWED = {"lnexp/fairseq_adapter.py", "lnexp/train/session.py"}


def test_nothing_but_the_session_builds_a_trainer():
    """Training, figures, benchmarks and GPU scripts all build through Session.build: no other
    module of lnexp/ or scripts/ calls build_trainer(, Trainer( or trainer_class(."""
    files = [*REPO.glob("lnexp/**/*.py"), *REPO.glob("scripts/*.py")]
    assert len(files) > 50
    found = [f"{p.relative_to(REPO)}:{i}: {line.strip()}" for p in files
             for i, line in enumerate(p.read_text().splitlines(), 1)
             if BUILDS.search(line) and str(p.relative_to(REPO)) not in ALLOWED]
    assert not found, "a trainer built outside lnexp/train/session.py:\n" + "\n".join(found)
    session = (REPO / "lnexp/train/session.py").read_text()
    assert "fa.build_trainer(" in session


@pytest.fixture
def tiny_cfg(small_multi30k, monkeypatch):
    from lnexp import config

    monkeypatch.setenv("LNEXP_CACHE", str(small_multi30k.parent / "cache"))
    return lambda *extra: config.compose([f"dataset.dir={small_multi30k}", *TINY, *extra])


@pytest.fixture
def counted(monkeypatch):
    """The calls, in this test, of settings' decisions (``.calls``: resolve, fairseq_flags, the
    precision's resolution, Placement.from_config) and what each call of resolve returned
    (``.resolved``)."""
    from types import SimpleNamespace

    from lnexp import scheme
    from lnexp.train import precision, settings

    seen = SimpleNamespace(calls={"resolve": 0, "flags": 0, "precision": 0, "placement": 0},
                           resolved=[])

    def count(name, f):
        def run(*args, **kwargs):
            seen.calls[name] += 1
            out = f(*args, **kwargs)
            if name == "resolve":
                seen.resolved.append(out)
            return out
        return run

    monkeypatch.setattr(settings, "resolve", count("resolve", settings.resolve))
    monkeypatch.setattr(settings, "fairseq_flags", count("flags", settings.fairseq_flags))
    monkeypatch.setattr(settings, "resolve_precision", count("precision", precision.resolve))
    monkeypatch.setattr(scheme.Placement, "from_config",
                        classmethod(count("placement", scheme.Placement.from_config.__func__)))
    return seen


def test_the_config_is_resolved_once_per_session(tiny_cfg, counted, small_multi30k, tmp_path):
    """Session.build decides device, precision, placement and norm once and derives the fairseq
    flags from them once (the stock command included); ``lnexp train`` decides them once for the
    launch, in its check before Hydra, and its job trains with that decision."""
    from lnexp import scheme
    from lnexp.train.session import Session
    from tests.conftest import lnexp_main

    calls = counted.calls
    cfg = tiny_cfg()  # (composing checks the placement: config.validate)
    scheme.named_placement("pre_ln")  # pre_ln.yaml as written, read once per process
    calls.update(placement=0)
    run = Session.build(cfg, tmp_path / "run")
    # the model gets the very Placement resolved (its --placement-spec read back, not rebuilt)
    assert calls == {"resolve": 1, "flags": 1, "precision": 1, "placement": 1}
    assert run.model.encoder.layers[0].spec.scheme is run.setup.resolved.placement
    assert run.setup.stock_command.startswith("fairseq-train ")
    assert run.setup.resolved.placement.name == "pre_ln" and run.setup.precision.name == "fp32"
    assert run.setup.fairseq.flags["placement_spec"] == run.setup.resolved.placement.to_json()
    # lnexp train's check before Hydra and the job's session: one decision for the launch
    runs = tmp_path / "runs"
    lnexp_main("train", f"dataset.dir={small_multi30k}", *TINY, *ONE_UPDATE, f"runs_root={runs}",
               cache=small_multi30k.parent / "cache")
    assert (calls["resolve"], calls["flags"], calls["precision"]) == (2, 2, 2)
    (status,) = runs.glob("*/status.json")
    assert json.loads(status.read_text())["updates"] == 1  # the job trained


def test_each_job_of_a_sweep_trains_with_what_the_check_resolved(counted, small_multi30k,
                                                                 tmp_path, monkeypatch):
    """``lnexp train -m seed=1,2 lr=3e-4,6e-4``: the check before Hydra composes each value once
    (2 configs of the 4), resolves them, and hands each decision to its job, which does not resolve
    again; the 2 jobs the check did not compose resolve their own."""
    from lnexp.train import loop
    from tests.conftest import lnexp_main

    given = {}  # (seed, lr) of each job -> the decision it was handed

    def record(cfg, run_dir, on_start=None, resolved=None):  # train_run, recording only
        given[(int(cfg.seed), float(cfg.lr))] = resolved
        return {"status": "done"}

    monkeypatch.setattr(loop, "train_run", record)
    lnexp_main("train", "-m", f"dataset.dir={small_multi30k}", *TINY, "seed=1,2", "lr=3e-4,6e-4",
               f"runs_root={tmp_path}", cache=small_multi30k.parent / "cache")
    assert counted.calls["resolve"] == 2 and len(given) == 4
    assert given[(1, 3e-4)] is counted.resolved[0] and given[(2, 6e-4)] is counted.resolved[1]
    assert given[(1, 6e-4)] is None and given[(2, 3e-4)] is None
    for (seed, lr), decided in given.items():  # each job got its own config's decision
        assert decided is None or (decided.flags["seed"], decided.flags["lr"]) == (seed, lr)


def test_the_checks_decisions_stay_in_the_process_that_made_them(small_multi30k, monkeypatch):
    """A launcher that runs the jobs in other processes (joblib, submitit: maybe on another
    machine) gets the check's decisions pickled: they arrive empty, and each job there resolves
    its own config."""
    import pickle

    from lnexp.train.run import _job_key, check_overrides

    monkeypatch.setenv("LNEXP_CACHE", str(small_multi30k.parent / "cache"))
    overrides = [f"dataset.dir={small_multi30k}", *TINY]
    _, launch = check_overrides(overrides)
    assert launch.of_job(_job_key(overrides)).placement.name == "pre_ln"
    assert pickle.loads(pickle.dumps(launch)).of_job(_job_key(overrides)) is None


def test_benchmarks_time_the_updates_lnexp_train_makes(tiny_cfg, small_multi30k, tmp_path,
                                                       monkeypatch):
    """scripts/_bench.Timed steps the session ``lnexp train`` builds: its first updates' losses and
    gradient norms are the ones the run's updates.csv records."""
    from lnexp.train.loop import train_run

    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    import _bench as B

    over = [f"dataset.dir={small_multi30k}", *TINY, "max_update=3", "eval.subset=4",
            "divergence.plateau_epoch=99"]
    train_run(tiny_cfg("max_update=3", "eval.subset=4", "divergence.plateau_epoch=99"),
              tmp_path / "run")
    with open(tmp_path / "run" / "updates.csv") as f:
        logged = [float(r[k]) for r in csv.DictReader(f) for k in ("loss", "gnorm")]
    bench = B.Timed(over)
    stepped = []
    for _ in range(3):
        step = bench.update(bench._next())
        stepped += [step["loss"], step["gnorm"]]
    assert len(logged) == 6
    assert stepped == pytest.approx(logged, rel=1e-6)  # updates.csv keeps 6-7 digits


def test_stock_settings_per_precision_and_where_they_run(tiny_cfg, small_multi30k, monkeypatch):
    """The candidates for stock fairseq's fastest correct setting of each precision; on a CPU the
    fp32 run and the whole-model bf16 casts train with finite losses through the session, fp16 is
    refused with the fix named (its flat fp32 master copy and --amp's scaler are CUDA's)."""
    from lnexp.errors import ConfigError
    from lnexp.train.session import Session

    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    import _bench as B

    assert {k: list(v) for k, v in B.STOCK_SETTINGS.items()} == {
        "fp32": ["fp32"],
        "fp16": ["--fp16", "--fp16 --memory-efficient-fp16", "--amp"],
        "bf16": ["--bf16", "--bf16 --memory-efficient-bf16"]}
    # bf16's whole-model cast on this CPU: the stock flags plus --bf16 (lnexp's bf16 on a CPU is
    # its autocast, which stock fairseq has no equivalent of)
    for label, extra in [("fp32", {}), *((k, {"bf16": True, **v})
                                          for k, v in B.STOCK_SETTINGS["bf16"].items())]:
        # batches of at most 128 tokens: a whole-model bf16 cast is emulated on a CPU, slow
        run = Session.build(tiny_cfg("scale.max_tokens=128"), stock=extra)
        assert run.setup.stock and run.setup.fairseq.flags["arch"] == "transformer"
        assert type(run.model).__name__ == "TransformerModel", label
        itr = run.epoch_itr.next_epoch_itr(shuffle=False)
        run.trainer.begin_epoch(1)
        losses = [run.step(run.trainer, [next(itr)])["loss"] for _ in range(2)]
        assert all(math.isfinite(x) for x in losses), (label, losses)
        assert (run.setup.fairseq.flags.get("memory_efficient_bf16") is True) == ("memory" in label)
    with pytest.raises(ConfigError, match="precision=fp16 needs a GPU"):
        Session.build(tiny_cfg("precision=fp16", "device=cpu"), stock=B.STOCK_SETTINGS["fp16"]["--amp"])
    with pytest.raises(ConfigError, match="no stock fairseq equivalent"):
        Session.build(tiny_cfg("placement=peri_ln"), stock={})
    assert sys.modules["_bench"] is B
