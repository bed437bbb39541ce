"""``lnexp train``: Hydra entry point for one run or a sweep (``-m``).

Overrides are composed and checked before Hydra starts, so a mistake gives one line naming the fix
and exit status 2 instead of a traceback, and no run directory is created for it.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import DictConfig

from lnexp import logs
from lnexp import overrides as override
from lnexp.config import first_line as _first_line
from lnexp.errors import ConfigError, UserError
from lnexp.exit_status import Exit
from lnexp.plural import count

if TYPE_CHECKING:
    from lnexp.train.settings import LaunchResolved

log = logging.getLogger("lnexp.train")
# Each run that does not finish appends "status<TAB>message" to this file (in runs_root, which a
# cluster shares): a parallel launcher's jobs (joblib, submitit) run in other processes.
FAILURES_ENV = "LNEXP_FAILURES_FILE"
HYDRA_FLAGS_WITH_VALUE = ("--cfg", "-c", "--package", "-p", "--config-name", "-cn", "--config-path",
                          "-cp", "--config-dir", "-cd", "--info", "-i")


def _is_task_override(argv: list[str]) -> list[bool]:
    """For each argument: is it an override of the training config (not one of Hydra's own flags,
    a flag's value, or a hydra.* / hydra/ override)?"""
    out, skip = [], False
    for a in argv:
        flag = skip or a.startswith("-") or override.is_hydra(a)
        skip = not skip and a in HYDRA_FLAGS_WITH_VALUE  # the flag's value follows it
        out.append(not flag)
    return out


def _task_overrides(argv: list[str]) -> list[str]:
    """Drop Hydra's own flags (and their values) and hydra.* / hydra/ overrides."""
    return [a for a, task in zip(argv, _is_task_override(argv), strict=True) if task]


def check_overrides(argv: list[str]) -> tuple[Path, LaunchResolved]:
    """Compose every value of every swept key once, and validate the result; returns runs_root and
    the configs resolved on the way, for the jobs that run them."""
    from lnexp import config
    from lnexp.data.registry import check_available
    from lnexp.train import settings

    overrides = config.normalise(_task_overrides(argv))
    config.given_once(overrides)
    choices, resolved = [override.choices(o) for o in override.parse_all(overrides)], {}
    with config.composer() as compose:
        for combo in covering_jobs(choices):  # every value at least once, without the cross product
            cfg = compose(combo)
            config.validate(cfg)
            check_available(cfg.dataset)
            # device, precision (bf16's CPU self-check), placement and norm fit this machine
            resolved[_job_key(combo)] = settings.resolve(cfg)
    return Path(cfg.runs_root), settings.LaunchResolved(resolved)


def _job_key(overrides) -> tuple[str, ...]:
    """A job's task overrides as the check and the job both write them (Hydra's parser)."""
    parsed = override.parse_all(list(overrides))
    return tuple(sorted(f"{o.get_key_element()}={o.get_value_element_as_str()}" for o in parsed))


def covering_jobs(choices: list[list[str]]):
    """Jobs that hold every value of every key at least once: job i takes each key's i-th value
    (its last, where a key has fewer), as many jobs as the longest list."""
    width = max((len(c) for c in choices), default=1)
    for i in range(width):
        yield [c[min(i, len(c) - 1)] for c in choices]


def _job(cfg: DictConfig, launch: LaunchResolved | None = None) -> None:
    from hydra.core.hydra_config import HydraConfig

    from lnexp import rundir
    from lnexp.runtime.runlock import RunLocked
    from lnexp.train import staging
    from lnexp.train.loop import train_run

    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    staged = run_dir / str(hc.output_subdir) if hc.output_subdir else None
    try:
        with staging.log_paused(run_dir):
            staging.refuse_foreign(run_dir)
            resolved = None if launch is None else launch.of_job(_job_key(hc.overrides.task))
            status = train_run(cfg, run_dir, on_start=lambda: staging.publish(staged, run_dir),
                               resolved=resolved)
        if int(os.environ.get("RANK", "0")) == 0:  # under torchrun every rank runs this job
            print(f"{run_dir}: {status['status']} after {count(status.get('epoch') or 0, 'epoch')}")
            _print_summary(run_dir)
    except (RunLocked, staging.ForeignFolder) as e:  # another process's run, or no run: not ours to touch
        _record_failure(Exit.BAD_INPUT, str(e))
        print(f"lnexp train: error: {e}", file=sys.stderr)
    except (UserError, OSError) as e:
        error = e if isinstance(e, UserError) else rundir.as_disk_error(
            e, rundir.run_paths(run_dir)["status"])
        if error is None:
            _crashed(run_dir, e)
            return
        rundir.record_failure(run_dir, str(error))  # keeps the epochs/updates already recorded
        _record_failure(Exit.BAD_INPUT, str(error))
        print(f"lnexp train: error: {error}", file=sys.stderr)
    except Exception as e:  # one failed run must not stop a sweep
        _crashed(run_dir, e)
    finally:
        staging.undo(staged, run_dir)  # a launch that did not train the run leaves it as it was


def _crashed(run_dir: Path, e: Exception) -> None:
    """A run that ended in an error lnexp did not foresee: the traceback goes to error.log."""
    from lnexp import rundir

    error_log = rundir.run_paths(run_dir)["error_log"]
    try:
        error_log.write_text(traceback.format_exc())
    except OSError:
        pass
    rundir.record_failure(run_dir, _first_line(e))
    _record_failure(Exit.CRASH, _first_line(e))
    print(f"lnexp train: {run_dir} failed: {_first_line(e)} (see {error_log})", file=sys.stderr)


_FAILED_HERE: set[Exit] = set()  # the failures of this process's jobs, also where the file cannot grow


def _record_failure(status: Exit, message: str) -> None:
    _FAILED_HERE.add(status)
    path = Path(os.environ[FAILURES_ENV])  # set by main() before any job starts
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.write(f"{int(status)}\t{message.splitlines()[0] if message else ''}\n")
    except OSError:  # a full disk: the run's own error is what the user must see, not this one
        pass


def _failures(path: Path | None) -> set[int]:
    """The exit statuses of the runs that failed (BAD_INPUT, CRASH); removes the file."""
    failed: set[int] = set(_FAILED_HERE)
    _FAILED_HERE.clear()
    if path is None or not path.exists():
        return failed
    failed |= {int(ln.split("\t", 1)[0]) for ln in path.read_text().splitlines() if ln}
    path.unlink()
    return failed


def _print_summary(run_dir: Path) -> None:
    from lnexp.rundir import METRICS, read_metrics, run_paths

    rows = read_metrics(run_paths(run_dir)["metrics"])
    if not rows:
        return
    print(f"{'epoch':>5} {'updates':>7} {'lr':>9} {'train':>7} {'valid':>7} {'BLEU':>6} {'wall_s':>7}")
    for r in rows:
        print(f"{r['epoch']:>5} {r['updates']:>7} {r['lr']:>9.3g} {r['train_loss']:>7.3f} "
              f"{r['valid_loss']:>7.3f} {r['valid_bleu']:>6.2f} {r['wall_s']:>7.0f}")
    print(f"(losses in bits/token, BLEU: sacreBLEU; {METRICS} has every field)")


def _hydra_argv(argv: list[str]) -> list[str]:
    """argv with the task overrides normalised (``depth=12`` -> ``depth='12'``) and ``--cfg job|all``
    printing the resolved config."""
    from lnexp import config

    out = []
    for a, task in zip(argv, _is_task_override(argv), strict=True):
        out += config.normalise([a]) if task else [a]
    cfg = next((b for a, b in zip(out, [*out[1:], ""], strict=True) if a in ("--cfg", "-c")), None)
    if cfg in ("job", "all") and "--resolve" not in out:  # hydra alone cannot resolve ${runs_root}
        out.append("--resolve")
    return out


def _check_hydra_flags(argv: list[str]) -> None:
    """Hydra's own flags (``--cfg job``, ``--info plugins``, ...) read by Hydra's parser, a mistake
    one line instead of its usage block."""
    from hydra._internal.utils import get_args_parser

    def error(message: str) -> None:
        raise ConfigError(f"{message} (lnexp train --hydra-help lists Hydra's flags)")

    parser = get_args_parser()
    parser.error = error  # type: ignore[method-assign]
    args = parser.parse_args(argv)
    if args.cfg == "hydra" and args.resolve:
        raise ConfigError("--cfg hydra --resolve: Hydra's config reads the run's (${runs_root}); "
                          "use --cfg all --resolve, or --cfg hydra alone")


PROBE_BYTES = 64 * 1024  # more than Hydra writes of a launch (its three config files) before the job


def _check_writable(runs_root: Path) -> None:
    """The runs root exists (made now), takes new folders and has room for Hydra's files of the
    launch, before Hydra makes the run's (its own error on a full disk is a chained traceback)."""
    from lnexp import rundir

    probe = runs_root / f".lnexp-write-test-{os.getpid()}"
    try:
        runs_root.mkdir(parents=True, exist_ok=True)
        probe.mkdir()
        probe.rmdir()
    except OSError as e:
        raise ConfigError(f"runs_root={runs_root}: cannot make folders there ({e.strerror}): pass a "
                          "folder you can write, e.g. runs_root=runs") from None
    try:
        with open(probe, "wb", buffering=0) as f:
            f.write(b"\0" * PROBE_BYTES)
    except OSError as e:
        raise (rundir.as_disk_error(e, probe) or e) from None
    finally:
        probe.unlink(missing_ok=True)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def shell_completion(argv: list[str]) -> int:
    """Hydra's tab completion of the groups, options and keys: ``-sc install=bash`` prints the script
    that completes the ``lnexp`` command; the script asks ``lnexp -sc query=bash`` with the line typed
    so far (lnexp.cli hands it here without its first word, ``lnexp``)."""
    import re

    import hydra

    from lnexp import config, run_names
    from lnexp.train import staging

    i = max(argv.index(f) for f in ("-sc", "--shell-completion") if f in argv)
    value = argv[i + 1] if i + 1 < len(argv) else ""
    if not re.fullmatch(r"(install|uninstall|query)=(bash|zsh|fish)", value):
        raise ConfigError(f"-sc {value!r}: use -sc install=bash (zsh: install=bash under "
                          "bashcompinit; fish: install=fish), or uninstall=bash")
    run_names.register_resolver()
    staging.register_resolver()
    old = sys.argv
    sys.argv = ["lnexp", "-sc", value]  # Hydra's script completes the command named argv[0]
    try:
        hydra.main(config_path=str(config.CONFIG_DIR), config_name="train", version_base="1.1")(_job)()
    finally:
        sys.argv = old
    return Exit.OK


def main(argv: list[str]) -> int:
    import hydra

    from lnexp import config, run_names
    from lnexp.runtime.sharing import passive_wait_if_shared
    from lnexp.train import staging

    if {"--help", "-h"} & set(argv):  # Hydra's help drops the YAML comments that explain the keys
        from lnexp.config_help import train_help

        print(train_help())
        return Exit.OK
    run_names.register_resolver()
    staging.register_resolver()
    passive_wait_if_shared(argv)  # before torch is imported: OpenMP reads it once
    if {"-m", "--multirun"} & set(argv) and {"--cfg", "-c"} & set(argv):
        raise ConfigError("--cfg prints one run's config: drop -m, or give one value per key")
    if {"-sc", "--shell-completion"} & set(argv):
        return shell_completion(argv)
    _check_hydra_flags(argv)
    failures = launch = None  # --help, --cfg and friends run no job
    info = any(a in ("--help", "-h", "--hydra-help", "--info", "-i") for a in argv)
    if not info:
        runs_root, launch = check_overrides(argv)
        argv = _hydra_argv(argv)
        if not any(a in ("--cfg", "-c") for a in argv):
            _check_writable(runs_root)
            failures = runs_root.resolve() / f".lnexp-failures-{os.getpid()}"
            failures.unlink(missing_ok=True)
            os.environ[FAILURES_ENV] = str(failures)  # inherited by launcher workers
    import warnings

    for category in (UserWarning, FutureWarning, DeprecationWarning):
        warnings.filterwarnings("ignore", category=category)  # third-party deprecation noise
    # ... in a parallel launcher's worker processes too (they read it when they start)
    os.environ.setdefault("PYTHONWARNINGS", "ignore::UserWarning,ignore::FutureWarning,"
                                            "ignore::DeprecationWarning")
    if not info:  # Hydra logs --info itself: a root handler would print each line twice
        logs.to_stderr(logging.INFO, "%(asctime)s %(name)s: %(message)s", "%H:%M:%S")
    signal.signal(signal.SIGTERM, _interrupt)  # a scheduler's kill: record it as Ctrl-C would
    # the job, handed what the check resolved (Hydra reads the wrapped _job for its module)
    job = functools.update_wrapper(functools.partial(_job, launch=launch), _job)
    hydra_main = hydra.main(config_path=str(config.CONFIG_DIR), config_name="train",
                            version_base="1.1")(job)
    old = sys.argv
    sys.argv = ["lnexp train", *argv]
    try:
        hydra_main()
    finally:
        sys.argv = old
        os.environ.pop(FAILURES_ENV, None)
        failed = _failures(failures)
    return Exit.worst(failed)


