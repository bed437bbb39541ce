"""``lnexp train``: Hydra entry point for one run or a sweep (``-m``).

Overrides are composed and checked before Hydra starts, so a mistake gives one line naming the fix
and exit status 2 instead of a traceback, and no run directory is created for it.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from lnexp.errors import ConfigError, UserError

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
log = logging.getLogger("lnexp.train")
# Each run that does not finish appends "kind<TAB>message" to this file (in runs_root, which a
# cluster shares): a parallel launcher's jobs (joblib, submitit) run in other processes.
FAILURES_ENV = "LNEXP_FAILURES_FILE"


def _register_resolvers() -> None:
    if not OmegaConf.has_resolver("run_name"):
        # The run directory is named by the overrides, so one configuration has one place.
        OmegaConf.register_new_resolver("run_name", lambda s: s.replace("/", "_") or "default")


def _task_overrides(argv: list[str]) -> list[str]:
    """Drop Hydra's own flags (and their values) and hydra.* / hydra/ overrides."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a.startswith("-"):
            skip = a in ("--cfg", "-c", "--package", "-p", "--config-name", "-cn",
                         "--config-path", "-cp", "--config-dir", "-cd", "--info", "-i")
            continue
        if a.startswith(("hydra.", "hydra/", "+hydra", "~hydra")):
            continue
        out.append(a)
    return out


def check_overrides(argv: list[str]) -> Path:
    """Compose every value of every swept key once, and validate the result; returns runs_root."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from lnexp.data.registry import check_available
    from lnexp.train.settings import fairseq_flags, resolve_device, validate

    overrides = _task_overrides(argv)
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as e:
        raise ConfigError(f"{_first_line(e)} (syntax: key=value, group=option)") from None
    choices = []
    for o in parsed:
        values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [
            o.get_value_element_as_str()]
        choices.append([f"{o.get_key_element()}={v}" for v in values])
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.1"):
            # every value at least once, without the full cross product
            for combo in _cover(choices):
                try:
                    cfg = compose("train", overrides=combo)
                    OmegaConf.resolve(cfg)
                except (HydraException, OmegaConfBaseException) as e:
                    raise ConfigError(f"{_first_line(e)} (lnexp train --help lists the options)") \
                        from None
                validate(cfg)
                check_available(cfg.dataset)
                fairseq_flags(cfg, 1, resolve_device(cfg))  # precision/device fit this machine
    finally:
        GlobalHydra.instance().clear()
    return Path(cfg.runs_root)


def _cover(choices: list[list[str]]):
    width = max((len(c) for c in choices), default=1)
    for i in range(width):
        yield [c[min(i, len(c) - 1)] for c in choices]


def _first_line(e: Exception) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__


def _job(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    from lnexp.train.loop import train_run

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        status = train_run(cfg, run_dir)
        print(f"{run_dir}: {status['status']} after {status.get('epoch')} epochs")
        _print_summary(run_dir)
    except UserError as e:
        from lnexp.train.runlog import read_json, write_json
        from lnexp.train.settings import run_paths

        status_path = run_paths(run_dir)["status"]  # keep the epochs/updates already recorded
        write_json(status_path, {**(read_json(status_path, {}) or {}), "status": "failed", "error": str(e)})
        _record_failure("user", str(e))
        print(f"lnexp train: error: {e}", file=sys.stderr)
    except Exception as e:  # one failed run must not stop a sweep
        from lnexp.train.runlog import write_json
        from lnexp.train.settings import run_paths

        (run_dir / "error.log").write_text(traceback.format_exc())
        write_json(run_paths(run_dir)["status"], {"status": "failed", "error": _first_line(e)})
        _record_failure("crash", _first_line(e))
        print(f"lnexp train: {run_dir} failed: {_first_line(e)} (see {run_dir}/error.log)",
              file=sys.stderr)


def _record_failure(kind: str, message: str) -> None:
    path = Path(os.environ[FAILURES_ENV])  # set by main() before any job starts
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(f"{kind}\t{message.splitlines()[0] if message else ''}\n")


def _failure_kinds(path: Path | None) -> set[str]:
    """Kinds of the runs that failed ("user", "crash"); removes the file."""
    if path is None or not path.exists():
        return set()
    kinds = {ln.split("\t", 1)[0] for ln in path.read_text().splitlines() if ln}
    path.unlink()
    return kinds


def _print_summary(run_dir: Path) -> None:
    from lnexp.train.runlog import read_metrics

    rows = read_metrics(run_dir / "metrics.jsonl")
    if not rows:
        return
    print(f"{'epoch':>5} {'updates':>7} {'lr':>9} {'train':>7} {'valid':>7} {'BLEU':>6} {'wall_s':>7}")
    for r in rows:
        print(f"{r['epoch']:>5} {r['updates']:>7} {r['lr']:>9.3g} {r['train_loss']:>7.3f} "
              f"{r['valid_loss']:>7.3f} {r['valid_bleu']:>6.2f} {r['wall_s']:>7.0f}")
    print("(losses in bits/token, BLEU: sacreBLEU; metrics.jsonl has every field)")


def main(argv: list[str]) -> int:
    import hydra

    _register_resolvers()
    failures = None  # --help and friends run no job
    if not any(a in ("--help", "-h", "--hydra-help", "--info", "-i") for a in argv):
        failures = check_overrides(argv).resolve() / f".lnexp-failures-{os.getpid()}"
        failures.unlink(missing_ok=True)
        os.environ[FAILURES_ENV] = str(failures)  # inherited by launcher workers
    import warnings

    for category in (UserWarning, FutureWarning, DeprecationWarning):
        warnings.filterwarnings("ignore", category=category)  # third-party deprecation noise
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    hydra_main = hydra.main(config_path=str(CONFIG_DIR), config_name="train",
                            version_base="1.1")(_job)
    old = sys.argv
    sys.argv = ["lnexp train", *argv]
    try:
        hydra_main()
    finally:
        sys.argv = old
        os.environ.pop(FAILURES_ENV, None)
        kinds = _failure_kinds(failures)
    if "user" in kinds:
        return 2
    return 1 if kinds else 0


