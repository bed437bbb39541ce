"""Prepared data addressed by content (issue 42): what ``evaluate``, ``translate`` and ``compare``
of a run read and score is the run's own data, whatever is prepared after it; a run folder made
before the keyed layout is checked against what it recorded, never guessed.

One tiny run (2 updates on 600 Multi30k pairs, vocabulary 600, 10 test pairs) is trained once;
the preparations after it are what a run with another ``dataset.dir`` or ``dataset.vocab_size``
prepares first (``lnexp prepare multi30k`` and such a run share ``multi30k.prepare``).
"""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, TINY, lnexp_main, write_gz

LEGACY_FIELDS = ("name", "src", "tgt", "bin_dir", "text_dir", "subword", "subword_model",
                 "tokenized", "counts")  # run.json's `data` before the keyed layout


SIZES = {"train": 600, "val": 20, "test_2016_flickr": 10}  # the test split: 10 pairs, quick to decode


def multi30k_like(raw: Path, foreign: bool = False) -> Path:
    """The first pairs of the shipped Multi30k in its raw layout; ``foreign``: the same training
    text (so the same subword model and dictionary) with the next validation and test sentences,
    a foreign test set that the run's model reads without complaint."""
    raw.mkdir(parents=True)
    for stem, n in SIZES.items():
        for lang in ("de", "en"):
            with gzip.open(REPO / "data" / "multi30k" / f"{stem}.{lang}.gz", "rt", encoding="utf-8") as f:
                lines = [next(f).rstrip("\n") for _ in range(2 * n)]
            write_gz(raw / f"{stem}.{lang}.gz", lines[n:] if foreign and stem != "train" else lines[:n])
    return raw


def decoded(run: Path, cache: Path, monkeypatch=None, sentences: list[str] = ()) -> dict:
    """What evaluate (and, given ``monkeypatch``, translate and compare) make of ``run`` with
    LNEXP_CACHE=cache."""
    ev = lnexp_main("evaluate", str(run), "--beam", "1", "--json", cache=cache)
    record = json.loads(ev.stdout.strip().splitlines()[-1])
    out = {"n": record["n"], "bleu": record["bleu"], "hyps": Path(record["hyps"]).read_text(),
           "refs": Path(record["refs"]).read_text()}
    if monkeypatch is None:
        return out
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(s + "\n" for s in sentences)))
    tr = lnexp_main("translate", str(run), "--beam", "1", cache=cache)
    cmp = lnexp_main("compare", str(run), str(run), "--beam", "1", "--bs-n", "10",
                     "--ar-n", "10", "--json", cache=cache)
    compared = json.loads(cmp.stdout.strip().splitlines()[-1])
    return {**out, "translations": tr.stdout,
            "compare": (compared["n"], compared["a"]["bleu"], compared["b"]["bleu"])}


def evaluated(before: dict) -> dict:
    return {k: before[k] for k in ("n", "bleu", "hyps", "refs")}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(tmp, run folder, its cache, its raw files, test sentences, what evaluate/translate/compare
    make of the run right after training)."""
    from lnexp.data.text import read_lines

    tmp = tmp_path_factory.mktemp("keys")
    cache = tmp / "cache"
    raw = multi30k_like(tmp / "raw")
    multi30k_like(tmp / "foreign", foreign=True)
    tiny = [o for o in TINY if not o.startswith(("max_epoch=", "checkpoint.keep_last_epochs="))]
    lnexp_main("train", f"dataset.dir={raw}", *tiny, "max_epoch=1", "max_update=2",
               "eval.subset=8", f"runs_root={tmp / 'runs'}", cache=cache)
    (run,) = (tmp / "runs").iterdir()
    sentences = read_lines(raw / "test_2016_flickr.de.gz")[:4]
    with pytest.MonkeyPatch.context() as mp:
        before = decoded(run, cache, mp, sentences)
    return tmp, run, cache, raw, sentences, before


def prepared_folder(run: Path) -> Path:
    return Path(json.loads((run / "run.json").read_text())["data"]["bin_dir"]).parent


@pytest.mark.parametrize("other", ["vocabulary", "same_vocabulary_foreign_corpus"])
def test_a_later_preparation_changes_nothing_of_an_earlier_run(trained, other, monkeypatch):
    tmp, run, cache, raw, sentences, before = trained
    data = json.loads((run / "run.json").read_text())["data"]
    if other == "vocabulary":  # as a run with dataset.vocab_size=500 prepares it
        lnexp_main("prepare", "multi30k", "--dir", str(raw), "--vocab-size", "500", cache=cache)
    else:  # another dataset.dir of the same split sizes, the same vocabulary size
        out = lnexp_main("prepare", "multi30k", "--dir", str(tmp / "foreign"), "--vocab-size", "600",
                         cache=cache).stdout
        theirs = Path(out.split("binarised data: ")[1].splitlines()[0])
        # the same dictionary: the run's model reads their test set without complaint
        assert (theirs / "dict.en.txt").read_text() == (Path(data["bin_dir"]) / "dict.en.txt").read_text()
    after = decoded(run, cache, monkeypatch, sentences)
    assert after == before
    assert after["n"] == SIZES["test_2016_flickr"]
    found = [json.loads(f.read_text()) for f in cache.glob("*/prepared.json")]
    assert len({d["key"] for d in found}) == len(found) >= 2  # one folder per preparation
    assert data["key"] in {d["key"] for d in found}
    assert prepared_folder(run).name.endswith(data["key"])


def old_layout(run: Path, prepared: Path, tmp: Path, raw: Path) -> tuple[Path, Path]:
    """A copy of ``run`` as lnexp wrote it before the keyed layout: run.json's `data` without a key,
    pointing into ``<cache>/multi30k_de_en/`` (a copy of the ``prepared`` folder, its prepared.json
    as it was), its config's dataset.dir ``raw``. Returns (run copy, that cache)."""
    cache = tmp / "cache"
    legacy = cache / "multi30k_de_en"
    shutil.copytree(prepared, legacy)
    meta = json.loads((prepared / "prepared.json").read_text())
    old = {k: meta[k] for k in LEGACY_FIELDS}
    for k in ("bin_dir", "text_dir", "subword_model"):
        old[k] = str(legacy / Path(meta[k]).relative_to(prepared))
    (legacy / "prepared.json").write_text(json.dumps(old, indent=1))
    copy = tmp / "runs" / run.name
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("eval"))
    info = json.loads((copy / "run.json").read_text())
    info["data"] = {**old, "counts": info["data"]["counts"]}
    info["config"]["dataset"]["dir"] = str(raw)
    (copy / "run.json").write_text(json.dumps(info))
    return copy, cache


def test_an_old_layout_run_still_evaluates(trained, tmp_path):
    _, run, _, raw, _, before = trained
    old, cache = old_layout(run, prepared_folder(run), tmp_path, raw)
    assert decoded(old, cache) == evaluated(before)
    # another vocabulary prepared into that cache afterwards leaves the old run's data alone
    lnexp_main("prepare", "multi30k", "--dir", str(raw), "--vocab-size", "500", cache=cache)
    assert decoded(old, cache) == evaluated(before)


def test_an_old_layout_folder_rebuilt_from_other_text_is_refused_or_the_runs_own_rebuilt(
        trained, tmp_path):
    """The old cache folder now holds another corpus of the same sizes and vocabulary (what an
    older lnexp left after a run with another dataset.dir): never scored as the run's test set.
    With the run's raw files gone: one line naming the fix; with them there: its own data, rebuilt."""
    from lnexp.data import multi30k

    tmp, run, _, raw, _, before = trained
    theirs = multi30k.prepare(tmp / "foreign", vocab_size=600, root=tmp_path / "elsewhere")
    theirs = Path(theirs.bin_dir).parent
    gone, cache = old_layout(run, theirs, tmp_path / "gone", tmp_path / "deleted_raw")
    proc = lnexp_main("evaluate", str(gone), "--beam", "1", cache=cache, check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "multi30k_de_en" in lines[0] and "deleted_raw" in lines[0]
    assert not (gone / "eval").exists()  # nothing scored
    there, cache = old_layout(run, theirs, tmp_path / "there", raw)
    assert decoded(there, cache) == evaluated(before)


def test_results_leave_out_a_record_that_scored_another_test_set(trained, tmp_path):
    """A record an older lnexp wrote after scoring a foreign test set (100 sentences where the run
    has 10, no data key) is not the run's test BLEU; nor is a record of another data key."""
    from lnexp.results import load_run

    _, run, _, _, _, _ = trained
    copy = tmp_path / run.name
    shutil.copytree(run, copy)
    own = load_run(copy).test
    assert own is not None and own["n"] == SIZES["test_2016_flickr"]
    for name, extra in (("foreign", {"n": 100}), ("other_key", {"data_key": "0" * 16})):
        stale = {**own, **extra, "bleu": 6.84, "time": "2099-01-01T00:00:00"}
        (copy / "eval" / f"test.{name}").mkdir()
        (copy / "eval" / f"test.{name}" / "record.json").write_text(json.dumps(stale))
    assert load_run(copy).test["bleu"] == own["bleu"]


def cut(path: Path) -> None:
    """``path`` cut to half its size, as a full disk or a copy that stopped leaves it."""
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def moved(run: Path, tmp: Path) -> tuple[Path, Path]:
    """A copy of ``run`` and of its prepared folder, in a cache of its own that its run.json names
    (damaged by a test without touching the module's run). Returns (run copy, that cache)."""
    prepared = prepared_folder(run)
    cache = tmp / "cache"
    shutil.copytree(prepared, cache / prepared.name)
    copy = tmp / "runs" / run.name
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("eval"))
    info = json.loads((copy / "run.json").read_text())
    for k in ("bin_dir", "text_dir", "subword_model"):
        info["data"][k] = str(cache / prepared.name / Path(info["data"][k]).relative_to(prepared))
    (copy / "run.json").write_text(json.dumps(info))
    return copy, cache


@pytest.mark.parametrize("part", ["bin/test.de-en.de.bin", "bin/test.de-en.en.idx", "text/test.en"])
def test_damaged_prepared_data_is_rebuilt_from_the_raw_files_or_named(trained, tmp_path, part):
    """A file of the run's prepared data cut short since its stage made it (issue 49: evaluate
    printed numpy's traceback, or scored short references): with the raw files gone, one line
    names the file and the fix and nothing is scored; with them, the stage is rebuilt and the run
    scores as it did."""
    _, run, _, raw, _, before = trained
    copy, cache = moved(run, tmp_path)
    damaged = prepared_folder(copy) / part
    cut(damaged)
    info = json.loads((copy / "run.json").read_text())
    info["config"]["dataset"]["dir"] = str(tmp_path / "deleted_raw")
    (copy / "run.json").write_text(json.dumps(info))
    proc = lnexp_main("evaluate", str(copy), "--beam", "1", cache=cache, check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{damaged} is {damaged.stat().st_size:,} bytes, not the" in lines[0]
    assert "put its raw files back in" in lines[0] and "deleted_raw" in lines[0]
    assert not (copy / "eval").exists()
    info["config"]["dataset"]["dir"] = str(raw)
    (copy / "run.json").write_text(json.dumps(info))
    assert decoded(copy, cache) == evaluated(before)
    assert damaged.stat().st_size == (prepared_folder(run) / part).stat().st_size  # rebuilt


def test_train_rebuilds_a_damaged_stage_of_its_data(trained, tmp_path):
    """lnexp train on a prepared corpus whose training .bin was cut short (issue 49: "bin: up to
    date, nothing to do", then "offset must be non-negative"): the stage is built again, the run
    trains."""
    _, run, cache, raw, _, _ = trained
    prepared = prepared_folder(run)
    shutil.copytree(prepared, tmp_path / "cache" / prepared.name)
    damaged = tmp_path / "cache" / prepared.name / "bin" / "train.de-en.de.bin"
    cut(damaged)
    tiny = [o for o in TINY if not o.startswith(("max_epoch=", "checkpoint.keep_last_epochs="))]
    proc = lnexp_main("train", f"dataset.dir={raw}", *tiny, "max_epoch=1", "max_update=1",
                      "eval.subset=2", f"runs_root={tmp_path / 'runs'}", cache=tmp_path / "cache")
    assert proc.returncode == 0
    (new,) = (tmp_path / "runs").iterdir()
    said = (new / "lnexp.log").read_text()
    assert f"{damaged} is " in said and "recorded: building the stage again" in said, said
    assert "bin: up to date" not in said
    assert damaged.stat().st_size == (prepared / "bin" / "train.de-en.de.bin").stat().st_size
    assert json.loads((new / "status.json").read_text())["updates"] == 1


@pytest.fixture
def read_only(tmp_path):
    """``(folder, seal)``: a folder to fill, then ``seal()`` makes it read-only as a read-only file
    system does, for root too (a tmpfs remounted read-only; skipped where mount is not permitted);
    for another user, without its write permission."""
    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() != 0:
        yield folder, lambda: subprocess.run(["chmod", "-R", "a-w", str(folder)], check=True)
        subprocess.run(["chmod", "-R", "u+w", str(folder)], check=False)
        return
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(folder)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield folder, lambda: subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def test_a_read_only_cache_that_holds_the_data_is_used_and_one_without_it_named(
        trained, tmp_path, read_only):
    """LNEXP_CACHE on a read-only file system (issue 49): where it holds the prepared corpus, a run
    trains on it and evaluates (nothing written there, no lock); where it does not, one line names
    LNEXP_CACHE, not runs_root= or a checkpoint."""
    _, run, _, raw, _, _ = trained
    cache, seal = read_only
    prepared = prepared_folder(run)
    shutil.copytree(prepared, cache / prepared.name)
    (cache / "empty").mkdir()
    seal()
    with pytest.raises(OSError):
        (cache / "probe").write_text("")
    tiny = [o for o in TINY if not o.startswith(("max_epoch=", "checkpoint.keep_last_epochs="))]
    train = ["train", f"dataset.dir={raw}", *tiny, "max_epoch=1", "max_update=1", "eval.subset=2"]
    lnexp_main(*train, f"runs_root={tmp_path / 'runs'}", cache=cache)
    (again,) = (tmp_path / "runs").iterdir()
    assert prepared_folder(again) == cache / prepared.name
    assert decoded(again, cache)["n"] == SIZES["test_2016_flickr"]
    assert sorted(p.name for p in cache.iterdir()) == ["empty", prepared.name]
    proc = lnexp_main(*train, f"runs_root={tmp_path / 'runs2'}", cache=cache / "empty", check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert f"cannot write {cache / 'empty'}/" in lines[0] and "LNEXP_CACHE" in lines[0]
    assert "runs_root" not in lines[0] and "checkpoint" not in lines[0]


def test_compare_refuses_runs_on_different_data_before_decoding_either(trained, tmp_path):
    """Two runs whose test references differ (another corpus of the same sizes and vocabulary):
    one line, and nothing decoded (issue 49: both test sets were decoded, then refused)."""
    tmp, run, cache, _, _, _ = trained
    copy, own = moved(run, tmp_path)
    out = lnexp_main("prepare", "multi30k", "--dir", str(tmp / "foreign"), "--vocab-size", "600",
                     cache=own).stdout
    theirs = Path(out.split("binarised data: ")[1].splitlines()[0]).parent
    info = json.loads((copy / "run.json").read_text())
    info["data"] = {**json.loads((theirs / "prepared.json").read_text()),
                    "counts": info["data"]["counts"]}
    info["config"]["dataset"]["dir"] = str(tmp / "foreign")
    (copy / "run.json").write_text(json.dumps(info))
    before = sorted(p.name for p in (run / "eval").iterdir())
    proc = lnexp_main("compare", str(run), str(copy), "--beam", "1", cache=own, check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "were trained on different data" in lines[0] and "test references differ" in lines[0]
    assert "decoding" not in proc.stderr and not (copy / "eval").exists()
    assert sorted(p.name for p in (run / "eval").iterdir()) == before
