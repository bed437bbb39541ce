"""Bad inputs as a new user types them, over every command: each ends in one line on stderr that
names the fix, exit status 2, no traceback, and nothing lost (every file under the test's folder,
runs included, is byte for byte what it was: no run folder made, no status.json rewritten).

The table below is the list. ``{root}`` is a runs root holding a finished run named ``default``
(what a plain ``lnexp train`` would resume) and another run ``{run}``; ``{bad}`` holds malformed
files; ``{trained}`` is a real trained run; ``{nowhere}`` does not exist. ``lnexp train`` cases
run with ``runs_root={root}`` unless they give their own.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import shlex
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.conftest import REPO, write_gz
from tests.test_figures_fig2_fig4 import fake_run

NOT_UTF8 = b"\xff\xfe bad utf8\n"
LONG_LINE = b"Ein Hund .\n" + b"Ein Mann " * 2000 + b"\n"  # 4,000 pieces: over the 1,024 positions

# (command line, what the one line must say[, bytes on stdin])
CASES = [
    # --- lnexp train: keys inside groups, every type -----------------------------------------
    ("train schedule=step schedule.epochs=abc",
     "schedule.epochs='abc' is not a list of whole numbers: e.g. schedule.epochs=[8]"),
    ("train schedule.epochs=[0]", "schedule.epochs=[0]: each value must be a whole number >= 1"),
    ("train schedule.gamma=0", "schedule.gamma=0 must be a positive number"),
    ("train optimizer.betas=[0.9]", "optimizer.betas=[0.9] needs 2 values: e.g. optimizer.betas=[0.9,0.98]"),
    ("train optimizer.betas=[0.9,1.5]", "each value must be a number in [0, 1)"),
    ("train optimizer.betas=abc", "is not a list of numbers"),
    ("train optimizer.eps=-1", "optimizer.eps=-1 must be a positive number"),
    ("train optimizer.eps=abc", "optimizer.eps='abc' is not a number"),
    ("train optimizer=sgd optimizer.momentum=1", "optimizer.momentum=1 must be a number in [0, 1)"),
    ("train optimizer.weight_decay=-0.1", "must be a number >= 0"),
    ("train optimizer.clip_norm=inf", "must be a number >= 0 (0 = no clipping)"),
    ("train scale.dropout=1.5", "scale.dropout=1.5 must be a number in [0, 1)"),
    ("train scale.label_smoothing=-0.1", "must be a number in [0, 1)"),
    ("train scale.max_tokens=0", "scale.max_tokens=0 must be a whole number of tokens >= 1"),
    ("train scale.max_tokens=abc", "scale.max_tokens='abc' is not a whole number"),
    ("train scale.update_freq=1.5", "is not a whole number"),
    ("train depth.encoder_layers=2.5", "is not a whole number"),
    ("train depth.decoder_layers=1001", "must be a whole number of layers <= 1000"),
    ("train dataset.vocab_size=0", "dataset.vocab_size=0 must be a whole number >= 1"),
    ("train dataset.src=[de]", "dataset.src=['de'] is not text"),
    ("train placement.embed_norm=maybe", "placement.embed_norm='maybe' is not true or false"),
    ("train divergence.stop=2", "divergence.stop=2 is not true or false"),
    ("train divergence.plateau_margin=abc", "is not a number"),
    ("train divergence.plateau_min_updates=-1",
     "divergence.plateau_min_updates=-1 must be a whole number of updates >= 0 (0 = no minimum)"),
    ("train distributed.backend=glo", "distributed.backend='glo' is not one of auto, gloo, nccl"),
    ("train distributed.port=70000", "must be a whole number <= 65535"),
    ("train eval=5", "eval holds keys (beam, lenpen, max_sentences, subset), not a value"),
    ("train eval.lenpen=abc", "eval.lenpen='abc' is not a number"),
    ("train eval.beam=0", "eval.beam=0 must be a whole number >= 1"),
    # --- lnexp train: top-level keys ---------------------------------------------------------
    ("train seed=-1", "seed=-1 must be a whole number >= 0"),
    # (and the run `default` keeps its status; 0 means what configs/train.yaml says)
    ("train threads=-1", "threads=-1 must be a whole number >= 0 (0 = a fair share of the cores)"),
    ("train save_interval_updates=-5", "save_interval_updates=-5 must be a whole number of updates >= 0"),
    ("train residual_scale=inf", "residual_scale=inf must be a positive number"),
    ("train lr=nan", "lr=nan must be a positive number"),
    ("train warmup=2.5", "warmup=2.5 is not a whole number: e.g. warmup=4000"),
    ("train max_epoch=0", "max_epoch=0 must be a whole number >= 1"),
    ("train track_norms=yes", "track_norms='yes' is not true or false: e.g. track_norms=false"),
    ("train norm=batchnorm", "norm=batchnorm is not an option of the norm group: use one of derf, dyt, "),
    # --- lnexp train: keys that do not exist, twice, deleted ---------------------------------
    ("train +foo=1", "foo is not a key of lnexp's training config"),
    ("train +optimizer.bets=[0.9,0.98]", "did you mean optimizer.betas?"),
    ("train eval.beem=3",
     "Could not override 'eval.beem': not a key of lnexp's training config (did you mean eval.beam?"),
    ("train ~eval.subset", "~eval.subset deletes a key lnexp reads: set a value instead, e.g. eval.subset=0"),
    ("train runs_root=", "runs_root is empty: give the folder that holds the runs, e.g. runs_root=runs"),
    ("train warmup=1000000000000", "warmup=1000000000000 must be a whole number of updates <= 100000000"),
    ("train max_epoch=99999999999", "max_epoch=99999999999 must be a whole number <= 100000"),
    ("train max_update=1e12", "max_update=1000000000000.0 must be a whole number <= 100000000"),
    ("train placement=post_ln placement=pre_ln",
     "placement is given twice (placement=post_ln and placement=pre_ln)"),
    # --- lnexp train: groups, sweeps, folders, Hydra's flags ---------------------------------
    ("train depth=1000000", "depth=1000000 is more than 1000 layers a stack"),
    ("train depth=0", "depth=0 must be a whole number of layers >= 1"),
    ("train placement=preln", "use one of admin, b2t, b2t_noinit, deepnorm, fixnorm, hybridnorm, "),
    ("train placement=_base", "placement=_base is what the placement options share, not one of them: "
     "choose one of admin, b2t, "),
    ("train placement=deepnorm placement.residual_weight=alpha",
     "residual_weight='alpha' must be a number or one of deepnorm_alpha"),
    ("train dataset=nope", "dataset=nope is not an option of the dataset group"),
    ("train -m seed=1,-1", "seed=-1 must be a whole number >= 0"),
    ("train -m lr=interval(1e-4,1e-3)", "write e.g. lr=1e-4,5e-4,1e-3"),
    ("train -m --cfg job seed=1,2", "--cfg prints one run's config"),
    ("train dataset.dir={nowhere}", "lacks train.de.gz"),
    ("train runs_root=/proc/forbidden", "runs_root=/proc/forbidden: cannot make folders there"),
    ("train runs_root={bad}/notes.txt", "cannot make folders there"),
    ("train -sc install=nushell", "-sc 'install=nushell': use -sc install=bash"),
    ("train --cfg nope", "argument --cfg/-c: invalid choice: 'nope'"),
    ("train --cfg hydra --resolve", "use --cfg all --resolve, or --cfg hydra alone"),
    ("train --info nope", "argument --info/-i: invalid choice: 'nope'"),
    # --- lnexp results -----------------------------------------------------------------------
    ("results --runs-root {bad}/empty placment=pre_ln",
     "unknown filter key 'placment': did you mean placement?"),
    ("results --runs-root {root} optimizer.bets=1", "did you mean optimizer.betas?"),
    ("results --runs-root {root} status=finished", "status='finished' is not one of done"),
    ("results --runs-root {root} placement", "filter 'placement' is not KEY=VALUE"),
    ("results --runs-root {root} =x", "filter '=x' has no key"),
    ("results --runs-root {nowhere}", "no runs root"),
    ("results --runs-root {bad}/notes.txt", "no runs root"),
    ("results --runs-root {root} --csv /proc/x.csv", "cannot write /proc/x.csv"),
    ("results --runs-root {root} --csv ''", "--csv is empty: give a file name, e.g. --csv runs.csv"),
    ("results --runs-root {root} --csv {bad}", "is a folder: give a file name"),
    ("results --bogus", "unrecognized arguments: --bogus (lnexp results --help)"),
    # --- lnexp evaluate ----------------------------------------------------------------------
    ("evaluate {run} --batch-size 0", "argument --batch-size: must be at least 1, not 0"),
    ("evaluate {run} --beam abc", "argument --beam: not a whole number: 'abc'"),
    ("evaluate {run} --lenpen inf", "argument --lenpen: must be a finite number"),
    ("evaluate {run} --split train", "argument --split: invalid choice: 'train'"),
    ("evaluate {nowhere}", "no such folder"),
    ("evaluate {bad}/empty", "is not a run folder (no run.json)"),
    ("evaluate {bad}/empty_run", "run.json is unreadable or incomplete"),
    ("evaluate {bad}/binary_run", "run.json is unreadable or incomplete"),
    ("evaluate {trained} --src {bad}/x.de", "--src and --ref go together"),
    ("evaluate {trained} --src {bad}/latin1.de --ref {bad}/x.en", "not UTF-8 text"),
    ("evaluate {trained} --src {bad}/empty.de --ref {bad}/empty.en", "is empty"),
    ("evaluate {trained} --checkpoint newest", "is not best, last or avgN"),
    ("evaluate {trained} --name ../x --src {bad}/x.de --ref {bad}/x.en", "must be a plain name"),
    ("evaluate {damaged}", "checkpoint_best.pt is damaged (not a complete checkpoint: File is not a zip "
     "file): use another of the run's checkpoints (last: --checkpoint NAME, or RUN@NAME in lnexp compare)"),
    ("evaluate {damaged} --checkpoint avg2", "checkpoint2.pt is damaged"),
    # --- lnexp compare -----------------------------------------------------------------------
    ("compare {trained}", "the following arguments are required: RUN_B[@CKPT]"),
    ("compare {trained} {nowhere}", "is not a run folder (no run.json)"),
    ("compare {trained} {bad}/empty_run", "run.json is unreadable or incomplete"),
    ("compare {trained}@newest {trained}", "is not a run folder"),
    ("compare {trained}@avg9 {trained}", "needs 9 epoch checkpoints"),
    ("compare {trained} {trained} --ar-n abc", "argument --ar-n: not a whole number: 'abc'"),
    ("compare {trained} {trained} --split train", "argument --split: invalid choice: 'train'"),
    ("compare {trained} {damaged}", "checkpoint_best.pt is damaged"),  # and A's eval files kept
    ("compare {damaged} {trained}", "checkpoint_best.pt is damaged"),
    # --- lnexp translate ---------------------------------------------------------------------
    ("translate {trained}", "stdin line 1 is not UTF-8 text", NOT_UTF8),
    ("translate {trained} --batch-size -1", "argument --batch-size: must be at least 1"),
    ("translate {nowhere}", "no such folder"),
    ("translate {damaged}", "checkpoint_best.pt is damaged", b"Ein Hund .\n"),
    ("translate {trained}", "subword tokens, more than the 1024 the model reads: split it into "
     "sentences, or pass --max-len 1024 to cut longer lines there", LONG_LINE),
    ("translate {trained} --max-len 5000", "--max-len 5000 is more than the 1024 tokens", b""),
    ("translate {bad}/binary_run", "run.json is unreadable or incomplete"),
    # --- lnexp plot --------------------------------------------------------------------------
    ("plot {run} --out /proc/forbidden/x.png", "cannot write /proc/forbidden"),
    ("plot {nowhere} --out {nowhere}/x", "no such folder"),
    ("plot {run} --metric valid_blue --out {nowhere}/x", "no run logged 'valid_blue'"),
    ("plot {run} --metric , --out {nowhere}/x", "--metric is empty"),
    ("plot {run} --x time --out {nowhere}/x", "argument --x: invalid choice: 'time'"),
    ("plot {run}", "the following arguments are required: --out"),
    ("plot {run} --out {nowhere}/p.jpg", "lnexp plot writes FILE.png, FILE.pdf and FILE.csv, not .jpg"),
    ("plot {run} --out ''", "--out is empty: give a file name"),
    ("plot {run} --out {bad}", "is a folder: give a file name"),
    ("plot --runs-root {root} placment=pre_ln --out {nowhere}/x", "unknown filter key 'placment'"),
    # --- lnexp figure ------------------------------------------------------------------------
    ("figure nope", "unknown figure 'nope'"),
    ("figure fig2 --runs-root {bad}/empty --out {nowhere}", "no finished epochs of experiment=fig2_mini"),
    ("figure atlas --runs-root {nowhere} --out {nowhere}", "no runs of experiment=atlas_mini"),
    ("figure fig3 --replot --out {nowhere}", "run `lnexp figure fig3`"),
    ("figure fig3 --seeds 0", "argument --seeds: must be at least 1, not 0"),
    ("figure fig3 --depths 6,abc", "--depths '6,abc': not a whole number: 'abc'"),
    ("figure theory --lemma-layers -1", "argument --lemma-layers: must be at least 1"),
    ("figure report --readme {bad}/x.en --out {nowhere}", "has no claims block"),
    ("figure report --figures {nowhere} --out {nowhere}", "no checks files in"),
    ("figure report --figures {bad}/empty --out {nowhere}", "no checks files in"),
    # --- lnexp atlas: its options and the overrides of every cell, once, before any run ---------
    ("atlas --budget-min -5 --runs-root {nowhere}", "--budget-min -5: give a positive number"),
    ("atlas --budget-min 0 --runs-root {nowhere}", "--budget-min 0: give a positive number"),
    ("atlas --shared-lr nan --runs-root {nowhere}", "--shared-lr nan: give a positive number"),
    ("atlas --runs-root ''", "--runs-root is empty"),
    ("atlas --runs-root {nowhere} placment=pre_ln", "did you mean placement?"),
    ("atlas --runs-root {nowhere} placement=pre_ln", "lnexp atlas sets placement for each cell"),
    ("atlas --runs-root {nowhere} warmup=1000000000000", "lnexp atlas sets warmup for each cell"),
    ("atlas --runs-root {nowhere} max_epoch=0", "max_epoch=0 must be a whole number >= 1"),
    # --- lnexp prepare: malformed corpora, archives, folders ---------------------------------
    ("prepare multi30k --dir {small} --vocab-size 3 --cache {cache}", "pass --vocab-size"),
    ("prepare multi30k --vocab-size 0", "argument --vocab-size: must be at least 1, not 0"),
    ("prepare multi30k --dir {nowhere}", "no such folder"),
    ("prepare multi30k --dir {bad}/empty --cache {cache}", "missing file"),
    ("prepare multi30k --dir {bad}/m30k_empty --cache {cache}",
     "is empty: a corpus needs at least one sentence pair"),
    ("prepare multi30k --dir {bad}/m30k_latin1 --cache {cache}", "not UTF-8 text"),
    ("prepare multi30k --dir {bad}/m30k_truncated --cache {cache}", "damaged gzip file"),
    ("prepare multi30k --dir {bad}/m30k_binary --cache {cache}", "damaged gzip file"),
    ("prepare multi30k --dir {bad}/m30k_uneven --cache {cache}", "must be line-aligned"),
    ("prepare iwslt14 --archive {bad}/empty.tgz --cache {cache}", "not a readable .tgz archive"),
    ("prepare iwslt14 --archive {bad}/binary.tgz --cache {cache}", "not a readable .tgz archive"),
    ("prepare iwslt14 --archive {bad}/truncated.tgz --cache {cache}",
     "not a readable .tgz archive (Compressed file ended"),
    ("prepare iwslt14 --archive {bad}/other.tgz --cache {cache}", "missing de-en/train.tags.de-en.de"),
    ("prepare iwslt14 --archive {nowhere}/de-en.tgz", "no such file or folder"),
    ("prepare iwslt14", "the following arguments are required: --archive"),
    ("prepare wmt14 --dir {nowhere}", "no such folder"),
    ("prepare wmt14 --dir {bad}/empty --cache {cache}", "missing file"),
    ("prepare wmt14 --dir {bad}/empty --max-train-pairs 0", "argument --max-train-pairs: must be at least 1"),
    ("prepare nope", "invalid choice: 'nope'"),
    ("nope", "unknown command 'nope'"),
]


def _case(line: str, needle: str, stdin: bytes | None = None):
    return pytest.param(line, needle, stdin, id=line)


def _files(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, small_multi30k) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("bad_inputs")
    root, bad = tmp / "runs", tmp / "bad"
    fake_run(root, "default", "fig2_mini")
    run = fake_run(root, "lr=0.001,warmup=0", "fig2_mini")
    for d in ("empty", "empty_run", "binary_run", "m30k_empty", "m30k_latin1", "m30k_truncated",
              "m30k_binary", "m30k_uneven"):
        (bad / d).mkdir(parents=True)
    (bad / "empty_run" / "run.json").write_text("")
    (bad / "binary_run" / "run.json").write_bytes(bytes(range(256)))
    (bad / "notes.txt").write_text("a file, not a folder\n")
    (bad / "foreign").mkdir()
    (bad / "foreign" / "notes.txt").write_text("someone else's folder\n")
    (bad / "x.de").write_text("Ein Hund .\n")
    (bad / "x.en").write_text("A dog .\n")
    (bad / "latin1.de").write_bytes("Ein Hund läuft .\n".encode("latin-1"))
    (bad / "empty.de").write_text("")
    (bad / "empty.en").write_text("")
    files = [f"{s}.{lang}.gz" for s in ("train", "val", "test_2016_flickr") for lang in ("de", "en")]
    for f in files:
        write_gz(bad / "m30k_empty" / f, [])
        for d in ("m30k_latin1", "m30k_truncated", "m30k_binary", "m30k_uneven"):
            (bad / d / f).write_bytes((small_multi30k / f).read_bytes())
    with gzip.open(bad / "m30k_latin1" / "train.de.gz", "wb") as fh:
        fh.write("Ein Hund läuft .\n".encode("latin-1"))
    whole = (small_multi30k / "train.de.gz").read_bytes()
    (bad / "m30k_truncated" / "train.de.gz").write_bytes(whole[: len(whole) // 2])
    (bad / "m30k_binary" / "train.de.gz").write_bytes(b"\x00\x01binary, not gzip" * 10)
    write_gz(bad / "m30k_uneven" / "train.en.gz", ["A dog ."])
    (bad / "empty.tgz").write_bytes(b"")
    (bad / "binary.tgz").write_bytes(bytes(range(256)) * 4)
    with tarfile.open(bad / "other.tgz", "w:gz") as tf:
        tf.add(bad / "x.de", arcname="de-en/README")
    with tarfile.open(bad / "whole.tgz", "w:gz") as tf:
        for i in range(20):
            info = tarfile.TarInfo(f"de-en/train.tags.de-en.{i}")
            data = bytes(range(256)) * 64
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    data = (bad / "whole.tgz").read_bytes()
    (bad / "truncated.tgz").write_bytes(data[: len(data) // 2])
    (bad / "whole.tgz").unlink()
    return {"root": root, "run": run, "bad": bad, "tmp": tmp, "nowhere": tmp / "nowhere",
            "small": small_multi30k, "cache": tmp_path_factory.mktemp("bad_inputs_cache")}


@pytest.fixture(scope="module")
def damaged_run(tiny_run, tmp_path_factory) -> Path:
    """A copy of the trained run whose checkpoint_best.pt and newest epoch checkpoint were cut short
    (a copy that stopped, a full disk)."""
    import shutil

    run = tmp_path_factory.mktemp("damaged") / tiny_run.name
    shutil.copytree(tiny_run, run, ignore=shutil.ignore_patterns("eval"))
    for name in ("checkpoint_best.pt", "checkpoint2.pt"):
        path = run / "checkpoints" / name
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 3])
    return run


@pytest.mark.parametrize("line,needle,stdin", [_case(*c) for c in CASES])
def test_bad_input_is_one_line_exit_2_and_nothing_lost(line, needle, stdin, inputs, request,
                                                       capfd, monkeypatch):
    from lnexp.cli import main

    fill = {k: str(v) for k, v in inputs.items()}
    kept = [inputs["tmp"]]  # every file under these stays as it was
    for key, fixture in (("trained", "tiny_run"), ("damaged", "damaged_run")):
        if f"{{{key}}}" in line:
            kept.append(request.getfixturevalue(fixture))
            fill[key] = str(kept[-1])
    argv = [a.format(**fill) for a in shlex.split(line)]
    if argv[0] == "train" and not any(a.startswith("runs_root=") for a in argv):
        argv.append(f"runs_root={inputs['root']}")
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8",
                                                           errors="surrogateescape"))
    before = [_files(d) for d in kept]
    capfd.readouterr()
    rc = main(argv)
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err
    # prepare logs its finished stages ("[12:00:01] ...") before the stage that fails
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("[")]
    assert rc == 2 and len(lines) == 1, f"exit {rc}\n{out}{err}"
    assert needle in lines[0], lines[0]
    assert [_files(d) for d in kept] == before  # no run folder, no rewritten status.json


@pytest.mark.parametrize("line", ["train", "evaluate {trained}", "prepare multi30k --dir {small}",
                                  "prepare multi30k --dir {small} --cache {bad}/notes.txt/sub"])
def test_a_cache_that_is_a_file_is_one_line_naming_the_setting(line, inputs, request):
    """LNEXP_CACHE (or --cache) naming a file, or a folder under one (issue 49: "[Errno 17] File
    exists" and a traceback in error.log): one line naming the setting, exit 2, nothing written."""
    from tests.conftest import lnexp_main

    fill = {k: str(v) for k, v in inputs.items()}
    fill["trained"] = str(request.getfixturevalue("tiny_run"))
    argv = [a.format(**fill) for a in shlex.split(line)]
    if argv[0] == "train":
        argv.append(f"runs_root={inputs['root']}")
    before = [_files(inputs["tmp"]), _files(Path(fill["trained"]))]
    proc = lnexp_main(*argv, cache=inputs["bad"] / "notes.txt", check=False)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith("[")]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    setting = "--cache" if "--cache" in line else "LNEXP_CACHE"
    assert f"{setting}" in lines[0] and f"{inputs['bad']}/notes.txt is a file, not a folder" in lines[0]
    assert [_files(inputs["tmp"]), _files(Path(fill["trained"]))] == before


def test_the_table_covers_every_command():
    commands = {shlex.split(c[0])[0] for c in CASES}
    assert {"train", "results", "evaluate", "compare", "translate", "plot", "figure",
            "prepare"} <= commands
    assert len(CASES) >= 60


def test_train_cfg_hydra_prints_hydras_config(capfd):
    from lnexp.cli import main

    assert main(["train", "--cfg", "hydra"]) == 0
    out = capfd.readouterr().out
    assert out.startswith("hydra:") and "override_dirname" in out


def test_train_info_prints_each_line_once():
    proc = subprocess.run([sys.executable, "-m", "lnexp", "train", "--info"], capture_output=True,
                          text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    assert "Hydra 1.3.2" in lines[0] and len([ln for ln in lines if "Hydra 1.3.2" in ln]) == 1


def test_train_tab_completion_completes_commands_groups_and_options(capfd, monkeypatch):
    from lnexp.cli import main

    assert main(["train", "-sc", "install=bash"]) == 0
    assert "complete -o nospace -o default -F hydra_bash_completion lnexp" in capfd.readouterr().out
    for line, words in (("lnexp tr", "train translate"),
                        ("lnexp train placement=p", "placement=peri_ln placement=post_ln")):
        monkeypatch.setenv("COMP_LINE", line)
        assert main(["-sc", "query=bash"]) == 0
        assert words in capfd.readouterr().out


def _held_by_a_live_process(run_dir: Path) -> subprocess.Popen:
    """A lock file naming a process that runs (as a launch that trains the run writes it)."""
    import json
    import socket
    import time

    from lnexp.rundir import LOCK, process_started

    proc = subprocess.Popen(["sleep", "300"])
    (run_dir / LOCK).write_text(json.dumps({"pid": proc.pid, "host": socket.gethostname(),
                                            "started": process_started(proc.pid),
                                            "since": time.time()}) + "\n")
    return proc


def test_a_skipped_refused_or_foreign_launch_changes_nothing_in_the_folder(inputs):
    """`lnexp train` of a finished run (skipped), of a run another process trains (refused), and
    into a folder of something else (hydra.run.dir=...): no .hydra/ rewritten with the new
    command's values, no log, no status.json: nothing written."""
    from tests.conftest import lnexp_main

    root, foreign = inputs["root"], inputs["bad"] / "foreign"
    before = _files(inputs["tmp"])
    proc = lnexp_main("train", f"runs_root={root}", "max_epoch=2", "eval.beam=3", cache=inputs["cache"])
    assert f"{root / 'default'}: done after 2 epochs" in proc.stdout and "Traceback" not in proc.stderr
    assert _files(inputs["tmp"]) == before and not list(root.glob("*/.hydra-launch-*"))
    proc = lnexp_main("train", f"runs_root={root}", f"hydra.run.dir={foreign}", cache=inputs["cache"],
                      check=False)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith("[")]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert f"{foreign} holds files but no lnexp run (notes.txt)" in lines[0]
    assert _files(inputs["tmp"]) == before and sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]
    holder = _held_by_a_live_process(root / "default")
    try:
        before = _files(inputs["tmp"])
        proc = lnexp_main("train", f"runs_root={root}", "max_epoch=3", "eval.beam=3",
                          cache=inputs["cache"], check=False)
        assert proc.returncode == 2, proc.stderr
        assert f"is already being trained by pid {holder.pid}" in proc.stderr
        assert "Traceback" not in proc.stderr
        assert _files(inputs["tmp"]) == before and not list(root.glob("*/.hydra-launch-*"))
    finally:
        holder.kill()
        holder.wait()
        (root / "default" / ".lnexp-lock.json").unlink()


def test_compare_of_identical_hypotheses_is_no_difference(tiny_run, damaged_run, capfd):
    """A run against itself (its hypotheses decoded once) and against a copy of itself (the same
    hypotheses in another file): p = 1 and "no difference", never sacreBLEU's smallest p, and no
    sacreBLEU command (its paired tests refuse one file twice)."""
    import json

    from lnexp.cli import main

    for b in (f"{tiny_run}@last", f"{damaged_run}@last"):
        capfd.readouterr()
        assert main(["compare", f"{tiny_run}@last", b, "--split", "valid", "--beam", "1", "--bs-n",
                     "100", "--ar-n", "100", "--json"]) == 0
        out = capfd.readouterr().out
        r = json.loads(out.strip().splitlines()[-1])
        assert r["identical"] and r["sacrebleu_commands"] == {}
        assert {m[p] for m in r["metrics"].values() for p in ("p_bs", "p_ar")} == {1.0}
        assert ("BLEU difference +0.00: no difference: the two systems' hypotheses are identical "
                "(p = 1)") in out
        assert "same numbers: sacrebleu" not in out and "significant" not in out


def test_torchs_checkpoint_writer_on_a_full_disk_is_its_oserror(tmp_path):
    """torch.save's zip writer turns a failed write into `unexpected pos ...`; the adapter gives the
    OSError (ENOSPC) that lnexp.rundir reports in one line (/dev/full: every write fails so)."""
    import errno

    import torch

    from lnexp import fairseq_adapter as fa

    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")
    with pytest.raises(OSError) as e:
        fa.save_checkpoint_file({"w": torch.zeros(100_000)}, Path("/dev/full"))
    assert e.value.errno == errno.ENOSPC


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs mounted for the test (root only; skipped where mount is not permitted)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=128m", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_disk_is_one_line_exit_2_and_the_run_resumes(small_disk, tiny_multi30k, tmp_path,
                                                           tiny_prepared_cache):
    """A run on a small file system: a disk without room for the checkpoints the run will hold is
    refused before its first update (issue 49: a 3 MB disk was found full only once the run had
    trained), then a launch on a disk entirely full (the lock file), each one line naming the
    folder and the free space of the run's file system, exit 2, no lock or temporary file left;
    with room again the same command finishes the run and its error.log is gone. (A save that
    does not fit all the same, torch's writer: test_torchs_checkpoint_writer_on_a_full_disk_is_its_oserror
    and tests/test_run_folder.py.)"""
    import shutil

    from tests.conftest import TINY, lnexp_main

    # TINY's model on 200 pairs, BLEU on 4 sentences: the disk, not the score, is under test
    train = ["train", f"dataset.dir={tiny_multi30k}", *TINY, f"runs_root={small_disk}", "threads=1",
             "eval.subset=4"]
    cache = tiny_prepared_cache

    def remount(size: int) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(small_disk)], check=True)

    def one_line(proc, needle: str) -> str:
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith("[")]
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr
        assert needle in lines[0] and "Traceback" not in proc.stderr + proc.stdout, lines[0]
        left = [p.name for p in small_disk.rglob("*")
                if ".tmp" in p.name or p.name.startswith(".lnexp-lock")]
        assert not left, left
        return lines[0]

    one_epoch = [*(a for a in train if a != "max_epoch=2"), "max_epoch=1"]
    remount(3 * 2**20)  # the fuzz's 3 MB disk: a fresh run is refused before its first update
    line = one_line(lnexp_main(*one_epoch, cache=cache, check=False), "no room for this run's checkpoints")
    assert "(6 of ~" in line and "the best and 2 epoch checkpoints), and " in line  # keep_last_epochs=2
    assert " MB are free on " in line
    assert not list(small_disk.glob("*/updates.csv")) and not list(small_disk.glob("*/checkpoints/*"))
    remount(128 * 2**20)
    first = lnexp_main(*one_epoch, cache=cache)
    assert first.returncode == 0, first.stderr
    (run,) = small_disk.iterdir()
    ckpt = (run / "checkpoints" / "checkpoint_last.pt").stat().st_size
    (run / "error.log").write_text("an earlier launch's traceback\n")

    used = shutil.disk_usage(small_disk).used
    remount(used + ckpt // 2)  # room for half of the next checkpoint
    trained = _files(run / "checkpoints"), (run / "updates.csv").read_bytes()
    line = one_line(lnexp_main(*train, cache=cache, check=False),
                    f"no room for this run's checkpoints in {run}/checkpoints: they need ")
    assert f" MB are free on {run}/checkpoints: free some space" in line  # the run's file system
    assert (_files(run / "checkpoints"), (run / "updates.csv").read_bytes()) == trained  # none trained
    with open(small_disk / "filler", "wb", buffering=0) as f:  # the disk entirely full
        try:
            while True:
                f.write(b"\0" * (1 << 20))
        except OSError:
            pass
    before = _files(small_disk)
    line = one_line(lnexp_main(*train, cache=cache, check=False), f"cannot write {small_disk}/.lnexp-")
    assert f"No space left on device (0.0 MB free on {small_disk}): free some space" in line
    assert _files(small_disk) == before  # checked before Hydra writes the launch's files
    from lnexp.rundir import DiskError
    from lnexp.runtime import runlock

    with pytest.raises(DiskError, match=r"\.lnexp-lock\.json: No space left on device \(0\.0 MB free"):
        runlock.acquire(run)  # a lock that cannot be written is not left empty
    assert _files(small_disk) == before
    (small_disk / "filler").unlink()
    remount(used + 5 * ckpt)  # room for the 6 checkpoints the run holds at once, 2 of them there
    done = lnexp_main(*train, cache=cache)
    assert done.returncode == 0, done.stderr
    assert '"done"' in (run / "status.json").read_text() and not (run / "error.log").exists()


def test_atlas_whose_runs_fail_to_start_exits_non_zero(tmp_path, monkeypatch, capsys):
    """Every `lnexp train` of the atlas exits 2 (as a bad override would in each cell): the atlas
    says so in one line at the end and exits 2, not `done` with status 0."""
    from lnexp.atlas import driver, launchers

    log = tmp_path / "launched"  # each cell's process: one line, then exit status 2
    monkeypatch.setattr(launchers.ProcessLauncher, "TRAIN", (
        sys.executable, "-S", "-c", f"open({str(log)!r}, 'a').write('x\\n'); raise SystemExit(2)"))
    monkeypatch.setattr(launchers.ProcessLauncher, "POLL_S", 0.01)
    assert driver.main(["--runs-root", str(tmp_path / "runs"), "--budget-min", "1000"]) == 2
    launched = log.read_text().splitlines()
    err = capsys.readouterr().err.strip().splitlines()
    assert launched and err == [f"lnexp atlas: error: {len(launched)} runs ended with an error (exit "
                                "status 2): their messages are above; fix, then run the same "
                                "command again to resume"]
