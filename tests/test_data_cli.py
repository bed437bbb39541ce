"""``lnexp prepare``: counts and "nothing to do" on stdout, one-line errors with exit status 2."""

from __future__ import annotations

import gzip
import os
import re
import subprocess
import sys
from pathlib import Path

from lnexp.cli import main
from lnexp.data import iwslt14
from tests.test_data_iwslt14 import VOCAB, release_files, write_dir, write_tgz
from tests.test_data_wmt14 import make_wmt

REPO = Path(__file__).resolve().parents[1]


def prepare(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["prepare", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def no_partial_output(cache: Path) -> bool:
    """Nothing but finished stages (each with its stage.json) and no temporary folder."""
    if not cache.exists():
        return True
    leftovers = [p for p in cache.rglob("*") if p.name.endswith((".tmp", ".old"))]
    stages = [p for p in cache.glob("*/*") if p.is_dir()]
    return not leftovers and all((s / "stage.json").is_file() for s in stages)


def test_iwslt14_twice_second_does_nothing(tmp_path, capsys):
    files, _ = release_files()
    archive = write_tgz(tmp_path / "de-en.tgz", files)
    cache = tmp_path / "cache"
    args = ("iwslt14", "--archive", str(archive), "--vocab-size", str(VOCAB), "--cache", str(cache))
    rc, out, err = prepare(capsys, *args)
    assert rc == 0, err
    assert "iwslt14_de_en: train 56 / valid 2 / test 9 sentence pairs" in out
    assert "rebuilt: text, subword, bin" in out
    assert re.search(f"binarised data: {cache}/iwslt14_de_en-[0-9a-f]{{16}}/bin\n", out), out
    assert "building" in err  # progress goes to stderr
    rc, out, err = prepare(capsys, *args)
    assert rc == 0
    assert "train 56 / valid 2 / test 9" in out
    assert "up to date, nothing to do" in out and "rebuilt" not in out
    assert err.count("up to date") == 3 and "building" not in err
    rc, out, _ = prepare(capsys, *args[:-4], "--vocab-size", str(VOCAB - 20), "--cache", str(cache))
    assert rc == 0 and "rebuilt: subword, bin" in out  # the text stage: linked from the first
    assert len(list(cache.glob("iwslt14_de_en-*/prepared.json"))) == 2


def test_training_finds_the_preparation_of_its_vocabulary(tmp_path, capsys, monkeypatch, caplog):
    """dataset=iwslt14_de_en: the preparation of the config's subword and vocabulary, among
    several; none: one line naming the overrides and the command; an older lnexp's unkeyed folder
    is taken in where its stages check out; several of one vocabulary: the largest, said so."""
    import json
    import logging
    import shutil

    import pytest

    from lnexp.config import compose
    from lnexp.data import registry
    from lnexp.errors import DataError

    files, _ = release_files()
    archive = write_tgz(tmp_path / "de-en.tgz", files)
    cache = tmp_path / "cache"
    for vocab in (VOCAB, VOCAB - 20):
        assert prepare(capsys, "iwslt14", "--archive", str(archive), "--vocab-size", str(vocab),
                       "--cache", str(cache))[0] == 0
    monkeypatch.setenv("LNEXP_CACHE", str(cache))

    def dataset(*over: str):
        return compose(["dataset=iwslt14_de_en", *over], check=False).dataset

    data = registry.load_for_training(dataset(f"dataset.vocab_size={VOCAB - 20}"))
    assert data.vocab_size == VOCAB - 20 and data.folder.name == f"iwslt14_de_en-{data.key}"
    assert registry.load_for_training(dataset(f"dataset.vocab_size={VOCAB}")).vocab_size == VOCAB
    with pytest.raises(DataError, match=r"not sentencepiece 10000: train with dataset.subword="
                       r"sentencepiece dataset.vocab_size=\d+, or run `lnexp prepare iwslt14 "
                       r"--archive PATH/de-en.tgz --subword sentencepiece --vocab-size 10000`"):
        registry.load_for_training(dataset())
    # an older lnexp's folder (no key): checked, then linked as the keyed folder of its key
    old = tmp_path / "old"
    shutil.copytree(data.folder, old / "iwslt14_de_en")
    meta = json.loads((data.folder / "prepared.json").read_text())
    legacy = {k: v for k, v in meta.items() if k not in ("key", "vocab_size", "command")}
    (old / "iwslt14_de_en" / "prepared.json").write_text(json.dumps(legacy))
    monkeypatch.setenv("LNEXP_CACHE", str(old))
    adopted = registry.load_for_training(dataset(f"dataset.vocab_size={VOCAB - 20}"))
    assert adopted.key == data.key and adopted.folder == old / f"iwslt14_de_en-{data.key}"
    # other corpus files of the same vocabulary: two match, the one with more training pairs wins
    monkeypatch.setenv("LNEXP_CACHE", str(cache))
    files, _ = release_files({"de": ["Noch ein Satz ."], "en": ["One more sentence ."]})
    write_tgz(archive, files)
    assert prepare(capsys, "iwslt14", "--archive", str(archive), "--vocab-size", str(VOCAB),
                   "--cache", str(cache))[0] == 0
    with caplog.at_level(logging.WARNING, logger="lnexp.data"):
        more = registry.load_for_training(dataset(f"dataset.vocab_size={VOCAB}"))
    assert more.counts["train"] == 57 and "2 preparations of iwslt14_de_en match" in caplog.text


def test_a_runs_iwslt14_data_found_by_key_else_one_line_naming_the_command(tmp_path, capsys,
                                                                          monkeypatch):
    """A run's recorded data (run.json `data`) is found by its key in today's cache when its own
    folder moved; where no cache holds it, one line names the `lnexp prepare` that makes it."""
    import shutil
    from dataclasses import asdict

    import pytest

    from lnexp.data import registry
    from lnexp.errors import DataError

    files, _ = release_files()
    archive = write_tgz(tmp_path / "de-en.tgz", files)
    data = iwslt14.prepare(archive, vocab_size=VOCAB, root=tmp_path / "cache")
    recorded = asdict(data)
    dataset = {"corpus": "iwslt14", "src": "de", "tgt": "en", "subword": "sentencepiece",
               "vocab_size": 10000}
    shutil.move(tmp_path / "cache", tmp_path / "moved")
    monkeypatch.setenv("LNEXP_CACHE", str(tmp_path / "moved"))
    found = registry.for_run(recorded, dataset, lambda d: "not called for a keyed run", "runs/x")
    assert found.key == data.key and found.bin_dir == str(tmp_path / "moved" / data.folder.name / "bin")
    monkeypatch.setenv("LNEXP_CACHE", str(tmp_path / "empty"))
    with pytest.raises(DataError) as e:
        registry.for_run(recorded, dataset, lambda d: None, "runs/x")
    assert str(e.value) == (
        f"runs/x trained on iwslt14_de_en (key {data.key}), which is not in {tmp_path / 'empty'}: "
        f"run `lnexp prepare iwslt14 --archive {archive} --subword sentencepiece --vocab-size "
        f"{VOCAB}` (the same files), or set LNEXP_CACHE to the cache it trained with")


def test_a_damaged_iwslt14_preparation_is_one_line_naming_the_command_that_rebuilds_it(
        tmp_path, capsys, monkeypatch):
    """A corpus lnexp cannot prepare on its own (its raw files are an archive `lnexp prepare` was
    given): a file of its preparation cut short is refused, by training and by a run's evaluation,
    in one line naming the file and the command; that command rebuilds the damaged stage only."""
    import pytest

    from lnexp.config import compose
    from lnexp.data import registry
    from lnexp.errors import DataError

    files, _ = release_files()
    archive = write_tgz(tmp_path / "de-en.tgz", files)
    cache = tmp_path / "cache"
    args = ("iwslt14", "--archive", str(archive), "--vocab-size", str(VOCAB), "--cache", str(cache))
    assert prepare(capsys, *args)[0] == 0
    monkeypatch.setenv("LNEXP_CACHE", str(cache))
    data = registry.load_for_training(compose(["dataset=iwslt14_de_en",
                                               f"dataset.vocab_size={VOCAB}"], check=False).dataset)
    damaged = Path(data.bin_dir) / "test.de-en.en.idx"
    damaged.write_bytes(damaged.read_bytes()[:-8])
    command = (f"`lnexp prepare iwslt14 --archive {archive} --subword sentencepiece --vocab-size "
               f"{VOCAB}`")
    with pytest.raises(DataError) as e:
        registry.load_for_training(compose(["dataset=iwslt14_de_en", f"dataset.vocab_size={VOCAB}"],
                                           check=False).dataset)
    assert str(e.value).startswith(f"{damaged} is {damaged.stat().st_size:,} bytes, not the ")
    assert str(e.value).endswith(f"prepare it again, {command} (its damaged stages are rebuilt)")
    dataset = {"corpus": "iwslt14", "src": "de", "tgt": "en", "subword": "sentencepiece",
               "vocab_size": VOCAB}
    from dataclasses import asdict

    with pytest.raises(DataError) as e:
        registry.for_run(asdict(data), dataset, lambda d: None, "runs/x")
    assert f"runs/x's prepared iwslt14_de_en (key {data.key}) is damaged ({damaged} is " in str(e.value)
    assert f"run {command} (the same files)" in str(e.value) and "\n" not in str(e.value)
    rc, out, err = prepare(capsys, *args)
    assert rc == 0 and "rebuilt: bin" in out and f"{damaged} is " in err
    assert registry.for_run(asdict(data), dataset, lambda d: None, "runs/x").key == data.key


def test_env_cache_is_the_default(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LNEXP_CACHE", str(tmp_path / "envcache"))
    files, _ = release_files()
    folder = write_dir(tmp_path / "de-en", files)
    rc, out, err = prepare(capsys, "iwslt14", "--archive", str(folder), "--vocab-size", str(VOCAB))
    assert rc == 0, err
    assert len(list((tmp_path / "envcache").glob("iwslt14_de_en-*/prepared.json"))) == 1


def _one_line_error(capsys, cache: Path, *args: str, match: str) -> None:
    rc, out, err = prepare(capsys, *args, "--cache", str(cache))
    assert rc == 2
    assert len(err.splitlines()) == 1, err
    assert err.startswith("lnexp prepare: error: ") and match in err, err
    assert no_partial_output(cache)


def test_iwslt14_bad_inputs_one_line_exit_2(tmp_path, capsys):
    cache = tmp_path / "cache"
    _one_line_error(capsys, cache, "iwslt14", "--archive", str(tmp_path / "nope.tgz"),
                    match="nope.tgz")
    files, _ = release_files()
    del files[iwslt14.eval_file("IWSLT14.TED.tst2010", "de")]
    bad = write_tgz(tmp_path / "missing.tgz", files)
    _one_line_error(capsys, cache, "iwslt14", "--archive", str(bad),
                    match="missing de-en/IWSLT14.TED.tst2010.de-en.de.xml")
    files, _ = release_files()
    files[iwslt14.train_file("de")] += "Noch ein Satz.\n"
    bad = write_tgz(tmp_path / "misaligned.tgz", files)
    _one_line_error(capsys, cache, "iwslt14", "--archive", str(bad), match="line-aligned")
    files, _ = release_files()
    files[iwslt14.train_file("de")] = files[iwslt14.train_file("de")].encode("utf-16")
    bad = write_tgz(tmp_path / "utf16.tgz", files)
    _one_line_error(capsys, cache, "iwslt14", "--archive", str(bad),
                    match="utf16.tgz:de-en/train.tags.de-en.de:1: not UTF-8")
    files, _ = release_files()
    files[iwslt14.train_file("en")] = "<url>http://x</url>\n"
    bad = write_tgz(tmp_path / "empty.tgz", files)
    _one_line_error(capsys, cache, "iwslt14", "--archive", str(bad), match="no sentence lines")
    (tmp_path / "plain.txt").write_text("hello\n")
    _one_line_error(capsys, cache, "iwslt14", "--archive", str(tmp_path / "plain.txt"),
                    match="not a readable .tgz archive")
    assert not cache.exists()


def test_wmt14_and_multi30k_bad_inputs_one_line_exit_2(tmp_path, capsys):
    cache = tmp_path / "cache"
    _one_line_error(capsys, cache, "wmt14", "--dir", str(tmp_path / "nowhere"), match="nowhere")
    root = make_wmt(tmp_path / "wmt14")
    (root / "training" / "europarl-v7.de-en.en").write_text("only one line\n")
    _one_line_error(capsys, cache, "wmt14", "--dir", str(root), match="europarl-v7.de-en.en has 1 line but")
    m30k = tmp_path / "m30k"
    m30k.mkdir()
    for stem in ("train", "val", "test_2016_flickr"):
        for lang, n in (("de", 3), ("en", 3 if stem != "val" else 2)):
            with gzip.open(m30k / f"{stem}.{lang}.gz", "wt", encoding="utf-8") as f:
                f.write("".join(f"line {i}\n" for i in range(n)))
    _one_line_error(capsys, cache, "multi30k", "--dir", str(m30k), match="val.de.gz has 3 lines")
    (m30k / "test_2016_flickr.en.gz").unlink()
    (m30k / "val.en.gz").write_bytes(gzip.compress(b"line 0\nline 1\nline 2\n"))
    _one_line_error(capsys, cache, "multi30k", "--dir", str(m30k),
                    match="missing file " + str(m30k / "test_2016_flickr.en.gz"))
    (m30k / "test_2016_flickr.en.gz").write_bytes(b"not gzip")
    _one_line_error(capsys, cache, "multi30k", "--dir", str(m30k), match="damaged gzip file")
    assert not cache.exists()


def test_wmt14_cli_counts(tmp_path, capsys):
    root = make_wmt(tmp_path / "wmt14")
    rc, out, err = prepare(capsys, "wmt14", "--dir", str(root), "--max-train-pairs", "4",
                           "--vocab-size", str(VOCAB), "--cache", str(tmp_path / "cache"))
    assert rc == 0, err
    assert "wmt14_en_de: train 4 / valid 2 / test 3 sentence pairs" in out


def test_argument_errors_exit_2(capsys):
    assert main(["prepare", "iwslt14"]) == 2  # --archive is required
    assert "required: --archive (lnexp prepare iwslt14 --help)" in capsys.readouterr().err
    assert main(["prepare", "wmt14", "--dir", "x", "--max-train-pairs", "0"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--max-train-pairs" in err


def test_subprocess_one_line(tmp_path):
    env = {**os.environ, "LNEXP_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "lnexp.cli", "prepare", "iwslt14", "--archive",
                           str(tmp_path / "missing.tgz")], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"lnexp prepare: error: no such file or folder: {tmp_path / 'missing.tgz'} (pass the "
        "downloaded de-en.tgz or the folder it unpacks to)"]
    assert not (tmp_path / "cache").exists()


def test_a_corpus_is_its_module_and_its_yaml(tmp_path, monkeypatch, capsys):
    """A dataset YAML naming corpus `toy` and a module lnexp.data.toy with a CORPUS: `lnexp
    prepare toy` exists, with its options, its YAML's vocabulary size and its help line; a YAML
    whose corpus has no registration is a one-line error naming the fix."""
    import shutil
    import types

    from lnexp import config
    from lnexp.data import cli, registry
    from lnexp.data.corpus import Corpus, Option, PreparedData

    configs = tmp_path / "configs"
    shutil.copytree(config.CONFIG_DIR / "dataset", configs / "dataset")
    (configs / "dataset" / "toy_xx_yy.yaml").write_text("name: toy_xx_yy\ncorpus: toy\nvocab_size: 123\n")
    calls = []

    def toy_prepare(size, subword, vocab_size, root):
        calls.append((size, subword, vocab_size, root))
        return PreparedData("toy_xx_yy", "xx", "yy", "b", "t", subword, "m", False,
                            {"train": size, "valid": 1, "test": 1})

    toy = types.ModuleType("lnexp.data.toy")
    toy.CORPUS = Corpus(
        help="a toy corpus", prepare=toy_prepare, eval_text=lambda lines, lang: lines,
        options=(Option("--size", "size", "pairs", type=int, required=True),))
    monkeypatch.setitem(sys.modules, "lnexp.data.toy", toy)
    monkeypatch.setattr(config, "CONFIG_DIR", configs)
    registry.datasets.cache_clear()
    registry.corpora.cache_clear()
    try:
        assert "toy                 a toy corpus" in cli.parser().format_help()
        rc, out, _ = prepare(capsys, "toy", "--size", "5", "--cache", str(tmp_path / "cache"))
        assert rc == 0 and calls == [(5, "sentencepiece", 123, tmp_path / "cache")]
        assert "toy_xx_yy: train 5 / valid 1 / test 1 sentence pairs" in out
        (configs / "dataset" / "nope.yaml").write_text("name: nope\ncorpus: nope\nvocab_size: 1\n")
        registry.datasets.cache_clear()
        registry.corpora.cache_clear()
        rc, _, err = prepare(capsys, "toy", "--size", "5")
        assert rc == 2 and err.strip().splitlines() == [
            "lnexp prepare: error: configs/dataset names corpus 'nope', but lnexp/data/nope.py does not "
            "register it: give that module a CORPUS = Corpus(...)"]
    finally:
        registry.datasets.cache_clear()
        registry.corpora.cache_clear()

