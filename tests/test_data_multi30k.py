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


def test_vocab_change_rebuilds_subword_and_bin_only(prepared):
    """Another vocabulary: its own folder (the first left as it was), the text stage linked."""
    root, data = prepared
    before = stamps(data.folder)
    again = multi30k.prepare(vocab_size=4000, root=root)
    assert again.folder != data.folder and stamps(data.folder) == before
    after = stamps(again.folder)
    assert after["text"] == before["text"]
    assert after["subword"] != before["subword"] and after["bin"] != before["bin"]
    assert again.counts == data.counts
