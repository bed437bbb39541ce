"""compile=true: the layers under torch.compile, and the fallback to eager that says why."""

from __future__ import annotations

import logging

from tests.test_precision import TINY


def test_compile_failure_falls_back_to_eager_and_says_why(small_multi30k, tmp_path, monkeypatch,
                                                          caplog):
    """inductor fails to build (as on a machine without a C++ compiler): the run trains on with the
    eager layers, the warning names the error, and the update that hit it is done again."""
    import torch._inductor.compile_fx as cfx

    from lnexp.probes import compose_config
    from lnexp.train.loop import train_run

    def no_compiler(*args, **kwargs):
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setattr(cfx, "compile_fx", no_compiler)
    monkeypatch.setenv("LNEXP_CACHE", str(small_multi30k.parent / "cache"))
    cfg = compose_config([f"dataset.dir={small_multi30k}", *TINY, "max_epoch=1", "max_update=2",
                          "eval.subset=5", "compile=true"])
    with caplog.at_level(logging.INFO, logger="lnexp.train"):
        status = train_run(cfg, tmp_path / "run")
    assert status["status"] == "stopped" and status["updates"] == 2
    said = [r.getMessage() for r in caplog.records if r.name == "lnexp.train"]
    assert any(m.startswith("compile=true: 4 layers under torch.compile") for m in said)
    failed = [m for m in said if m.startswith("compile=true failed")]
    assert len(failed) == 1 and "no C++ compiler found" in failed[0]
    assert failed[0].endswith("training with the eager layers")


def test_compile_is_not_part_of_a_runs_name(tmp_path):
    """A run trained eager and resumed compiled (or the other way round) is one run."""
    from omegaconf import OmegaConf

    from lnexp.run_names import run_name
    from tests.conftest import REPO

    exclude = OmegaConf.load(REPO / "configs" / "train.yaml").hydra.job.config.override_dirname
    assert "compile" in exclude.exclude_keys
    assert run_name(["compile=true"], exclude.exclude_keys, str(tmp_path)) == \
        run_name([], exclude.exclude_keys, str(tmp_path))


def test_other_errors_are_not_compile_failures():
    """A bug of lnexp's or fairseq's in a compiled update is raised, not hidden by the fallback
    (the fallback on a real compiler error: the test above)."""
    from lnexp.train.compiling import is_compile_error

    assert not is_compile_error(ValueError("a bug of ours"))
    assert not is_compile_error(RuntimeError("out of memory"))
