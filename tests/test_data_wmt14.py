"""WMT'14 en-de preparation on a miniature folder in the official layout (no WMT text)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lnexp.data import wmt14
from lnexp.errors import ConfigError, DataError

VOCAB = 100
LONG250 = " ".join(["word"] * 249) + " ."
LONG251 = " ".join(["word"] * 250) + " ."

EUROPARL = [  # (en, de, kept as (en, de) after normalisation + tokenisation -a + cleaning)
    ("Resumption of the session", "Wiederaufnahme der Sitzungsperiode",
     ("Resumption of the session", "Wiederaufnahme der Sitzungsperiode")),
    ("He sent an e-mail.", "Er schickte eine E-Mail.",
     ("He sent an e @-@ mail .", "Er schickte eine E @-@ Mail .")),
    ("He said “yes”", "Er sagte „ja“",
     ("He said &quot; yes &quot;", "Er sagte &quot; ja &quot;")),
    ("Zero\u200bwidth here", "Null\u200bbreite hier", ("Zero width here", "Null breite hier")),
    ("Yes.", "Ja, das ist sicher richtig.", None),  # 2 vs 6 tokens: ratio 3
    (LONG250, LONG250.replace("word", "wort"), (LONG250, LONG250.replace("word", "wort"))),
    (LONG251, LONG251.replace("word", "wort"), None),  # 251 tokens
]
COMMONCRAWL = [("Hotel in Berlin", "Hotel in Berlin", ("Hotel in Berlin", "Hotel in Berlin")),
               ("", "Leer", None)]
NEWS = [("A (small) test", "Ein ( kleiner ) Test", ("A ( small ) test", "Ein ( kleiner ) Test"))]
NEWSTEST = {"2013": [("It’s late.", "Es ist spät."), ("Good night", "Gute Nacht")],
            "2014": [("One", "Eins"), ("Two", "Zwei"), ("Three 3-4", "Drei 3-4")]}


def _sgm(setid: str, kind: str, lang: str, segs: list[str]) -> str:
    tag = "srcset" if kind == "src" else "refset"
    out = [f'<{tag} setid="{setid}" srclang="any" trglang="{lang}">',
           '<doc sysid="ref" docid="1" genre="news" origlang="en">', "<p>"]
    out += [f'<seg id="{i}"> {s} </seg>' for i, s in enumerate(segs, 1)]
    out += ["</p>", "</doc>", f"</{tag}>"]
    return "\n".join(out) + "\n"


def make_wmt(root: Path, plain_newstest: bool = False) -> Path:
    def put(rel: str, text: str | bytes) -> None:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(text.encode("utf-8") if isinstance(text, str) else text)

    for rel, rows in (("training/europarl-v7.de-en", EUROPARL), ("commoncrawl.de-en", COMMONCRAWL),
                      ("training/news-commentary-v9.de-en", NEWS)):
        put(f"{rel}.en", "".join(r[0] + "\n" for r in rows))
        put(f"{rel}.de", "".join(r[1] + "\n" for r in rows))
    for year, segs in NEWSTEST.items():
        for i, lang in enumerate(("en", "de")):
            texts = [s[i] for s in segs]
            kind = "src" if lang == "en" else "ref"
            if plain_newstest:
                put(f"dev/newstest{year}.{lang}", "".join(t + "\n" for t in texts))
            elif year == "2013":
                put(f"dev/newstest2013-{kind}.{lang}.sgm", _sgm("newstest2013", kind, lang, texts))
            else:
                put(f"test-full/newstest2014-deen-{kind}.{lang}.sgm",
                    _sgm("newstest2014", kind, lang, texts))
    return root


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def expected_train() -> list[tuple[str, str]]:
    return [r[2] for rows in (EUROPARL, COMMONCRAWL, NEWS) for r in rows if r[2] is not None]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wmt")
    folder = make_wmt(tmp / "wmt14")
    return tmp, folder, wmt14.prepare(folder, vocab_size=VOCAB, root=tmp / "cache")


def test_train_normalised_tokenised_cleaned_not_lowercased(prepared):
    _, _, data = prepared
    text = Path(data.text_dir)
    kept = expected_train()
    assert lines(text / "train.en") == [k[0] for k in kept]
    assert lines(text / "train.de") == [k[1] for k in kept]
    assert data.counts == {"train": len(kept), "valid": 2, "test": 3}
    assert data.src == "en" and data.tgt == "de" and data.name == "wmt14_en_de" and data.tokenized


def test_newstest_sgm(prepared):
    _, _, data = prepared
    text = Path(data.text_dir)
    assert lines(text / "valid.en") == ["It &apos;s late .", "Good night"]
    assert lines(text / "valid.de") == ["Es ist spät .", "Gute Nacht"]
    assert lines(text / "test.en") == ["One", "Two", "Three 3 @-@ 4"]
    assert lines(text / "test.de") == ["Eins", "Zwei", "Drei 3 @-@ 4"]
    bin_dir = Path(data.bin_dir)
    assert (bin_dir / "dict.en.txt").read_text() == (bin_dir / "dict.de.txt").read_text()
    assert (bin_dir / "test.en-de.de.bin").is_file()


def test_plain_newstest_and_second_run(prepared, tmp_path):
    tmp, folder, data = prepared
    corpus = Path(data.bin_dir).parent
    before = {s: (corpus / s / "stage.json").stat().st_mtime_ns for s in ("text", "subword", "bin")}
    assert wmt14.prepare(folder, vocab_size=VOCAB, root=tmp / "cache") == data
    assert before == {s: (corpus / s / "stage.json").stat().st_mtime_ns
                      for s in ("text", "subword", "bin")}
    plain = wmt14.prepare(make_wmt(tmp_path / "plain", plain_newstest=True), vocab_size=VOCAB,
                          root=tmp_path / "cache")
    for name in ("valid.en", "valid.de", "test.en", "test.de"):
        assert lines(Path(plain.text_dir) / name) == lines(Path(data.text_dir) / name)


def test_max_train_pairs(tmp_path):
    data = wmt14.prepare(make_wmt(tmp_path / "wmt14"), max_train_pairs=3, vocab_size=VOCAB,
                         root=tmp_path / "cache")
    assert lines(Path(data.text_dir) / "train.en") == [r[2][0] for r in EUROPARL[:3]]
    with pytest.raises(ConfigError):
        wmt14.prepare(tmp_path / "wmt14", max_train_pairs=0, root=tmp_path / "cache")


@pytest.mark.parametrize("case, pattern", [
    ("misaligned", r"commoncrawl\.de-en\.en has 2 lines but .*commoncrawl\.de-en\.de has 3:"),
    ("missing", r"missing file newstest2014-deen-ref\.de\.sgm or .* under "),
    ("not_utf8", r"news-commentary-v9\.de-en\.de:1: not UTF-8"),
    ("no_segs", r"newstest2013-src\.en\.sgm: no segments"),
    ("empty", r"the training corpora are empty"),
])
def test_bad_inputs(tmp_path, case, pattern):
    root = make_wmt(tmp_path / "wmt14")
    if case == "misaligned":
        with open(root / "commoncrawl.de-en.de", "a", encoding="utf-8") as f:
            f.write("Eine Zeile zu viel\n")
    elif case == "missing":
        (root / "test-full" / "newstest2014-deen-ref.de.sgm").unlink()
    elif case == "not_utf8":
        (root / "training" / "news-commentary-v9.de-en.de").write_bytes("Größe\n".encode("latin-1"))
    elif case == "no_segs":
        (root / "dev" / "newstest2013-src.en.sgm").write_text("<srcset>\n</srcset>\n")
    elif case == "empty":
        for f in root.rglob("*.de-en.*"):
            f.write_text("")
    with pytest.raises(DataError, match=pattern) as err:
        wmt14.prepare(root, vocab_size=VOCAB, root=tmp_path / "cache")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "cache").exists()
