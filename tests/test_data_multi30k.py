"""The shipped Multi30k through the shared pipeline: counts, caching, selective rebuilds."""

from __future__ import annotations

from pathlib import Path

import pytest

from lnexp.cli import main
from lnexp.data import multi30k

STAGES = ("text", "subword", "bin")


def stamps(corpus: Path) -> dict[str, int]:
    return {s: (corpus / s / "stage.json").stat().st_mtime_ns for s in STAGES}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("m30k") / "cache"
    data = multi30k.prepare(root=root)
    return root, data


def test_counts_and_layout(prepared):
    _, data = prepared
    assert data.counts == {"train": 29000, "valid": 1014, "test": 1000}
    assert data.name == "multi30k_de_en" and not data.tokenized
    bin_dir = Path(data.bin_dir)
    assert (bin_dir / "dict.de.txt").read_text() == (bin_dir / "dict.en.txt").read_text()
    assert (bin_dir / "train.de-en.de.bin").is_file()


def test_second_prepare_rebuilds_nothing(prepared, capsys):
    root, data = prepared
    corpus = Path(data.bin_dir).parent
    before = stamps(corpus)
    assert multi30k.prepare(root=root) == data
    assert stamps(corpus) == before
    assert main(["prepare", "multi30k", "--cache", str(root)]) == 0
    out = capsys.readouterr().out
    assert "multi30k_de_en: train 29,000 / valid 1,014 / test 1,000 sentence pairs" in out
    assert "up to date, nothing to do" in out
    assert stamps(corpus) == before


def test_vocab_change_rebuilds_subword_and_bin_only(small_multi30k, tmp_path):
    """Another vocabulary: its own folder (the first left as it was), the text stage linked.
    (On the first 600 pairs, vocabularies 600 then 500: what a stage rebuilds does not depend on
    the corpus's size; the whole one's second vocabulary cost ~7 CPU s.)"""
    root = tmp_path / "cache"
    data = multi30k.prepare(small_multi30k, vocab_size=600, root=root)
    before = stamps(data.folder)
    again = multi30k.prepare(small_multi30k, vocab_size=500, root=root)
    assert again.folder != data.folder and stamps(data.folder) == before
    after = stamps(again.folder)
    assert after["text"] == before["text"]
    assert after["subword"] != before["subword"] and after["bin"] != before["bin"]
    assert again.counts == data.counts


@pytest.mark.parametrize("vocab, fix", [("3", "train with dataset.vocab_size=75 or more"),
                                        ("100000", "train with dataset.vocab_size=12546 or less")])
def test_training_names_its_own_vocabulary_override(small_multi30k, tmp_path, vocab, fix):
    """A vocabulary the training text cannot give, asked by `lnexp train`: one line naming
    dataset.vocab_size= with the sizes that work (issue 49: it named `lnexp prepare`'s
    --vocab-size)."""
    from tests.conftest import lnexp_main

    proc = lnexp_main("train", f"dataset.dir={small_multi30k}", f"dataset.vocab_size={vocab}",
                      f"runs_root={tmp_path / 'runs'}", cache=tmp_path / "cache", check=False)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith("[")]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].endswith(fix) and "--vocab-size" not in lines[0]
