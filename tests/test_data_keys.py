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
import shutil
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
