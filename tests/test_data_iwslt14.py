"""IWSLT'14 de-en preparation on miniature releases in the official layout (real sacremoses,
sentencepiece, subword-nmt and fairseq; no IWSLT text)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from lnexp.data import iwslt14, moses
from lnexp.errors import DataError

VOCAB = 120
EVAL_SEGS = {  # set -> [(de, en)]; raw segment text, with the spacing the release has
    "IWSLT14.TED.dev2010": [("Erster Satz .", "First sentence ."), ("Das ist’s gut .", "That’s good .")],
    "IWSLT14.TEDX.dev2012": [("Zweiter Satz .", "Second sentence .")],
    "IWSLT14.TED.tst2010": [("Dritter Satz .", "Third sentence ."), ("Vierter Satz .", "Fourth one .")],
    "IWSLT14.TED.tst2011": [("Fünfter Satz .", "Fifth sentence .")],
    "IWSLT14.TED.tst2012": [("Sechster .", "Sixth ."), ("Siebter .", "Seventh ."), ("Acht .", "Eight .")],
}


def _talk(k: int, n: int, extra: list[tuple[str, str]]) -> tuple[list[str], list[str], list]:
    """Raw lines of one talk on both sides, and the pairs the reference keeps (tokenised, lower)."""
    de = [f"<url>http://www.ted.com/talks/lang/de/talk_{k}.html</url>",
          f"<keywords>talks, Wissenschaft, Thema {k}</keywords>",
          f"<speaker>Redner {k}</speaker>",
          f"<talkid>{k}</talkid>",
          f"<title>Vortrag {k}</title>",
          f"<description>TED Talk Untertitel {k}</description>"]
    en = [f"<url>http://www.ted.com/talks/talk_{k}.html</url>",
          f"<keywords>talks, science, topic {k}</keywords>",
          f"<speaker>Speaker {k}</speaker>",
          f"<talkid>{k}</talkid>",
          f"<title>Talk {k}</title>",
          f"<description>TED Talk Subtitles {k}</description>"]
    kept = [(f"&lt; speaker &gt; redner {k} &lt; / speaker &gt;",
             f"&lt; speaker &gt; speaker {k} &lt; / speaker &gt;"),
            (f"vortrag {k}", f"talk {k}"),
            (f"ted talk untertitel {k}", f"ted talk subtitles {k}")]
    for j in range(1, n + 1):
        de.append(f"Das ist Satz {k} {j} hier.")  # not "{j}.": Moses keeps German ordinals whole
        en.append(f"This is SENTENCE {k} {j} here.")
        kept.append((f"das ist satz {k} {j} hier .", f"this is sentence {k} {j} here ."))
    for d, e, keep in extra:
        de.append(d)
        en.append(e)
        if keep:
            kept.append(keep)
    return de, en, kept


def release_files(extra_train: dict[str, list[str]] | None = None) -> tuple[dict[str, str], list]:
    """{file name: text} of a miniature de-en release, and the cleaned training pairs in order."""
    long175 = " ".join(["wort"] * 174) + " ."
    long176 = " ".join(["wort"] * 175) + " ."
    talks = [
        _talk(1, 20, [("", "Applause.", None),  # empty side: dropped
                      ("Ja.", "Yes, of course.", None)]),  # 2 vs 5 tokens: ratio 2.5, dropped
        _talk(2, 15, [("Danke.", "Thank you.", ("danke .", "thank you .")),  # ratio exactly 1.5
                      (long175, long175.replace("wort", "word"),
                       (long175, long175.replace("wort", "word"))),  # 175 tokens: kept
                      (long176, long176.replace("wort", "word"), None)]),  # 176 tokens: dropped
        _talk(3, 12, []),
    ]
    de = [x for t in talks for x in t[0]] + (extra_train or {}).get("de", [])
    en = [x for t in talks for x in t[1]] + (extra_train or {}).get("en", [])
    kept = [x for t in talks for x in t[2]]
    files = {iwslt14.train_file("de"): "\n".join(de) + "\n",
             iwslt14.train_file("en"): "\n".join(en) + "\n",
             "README": "IWSLT 2014 de-en (miniature)\n"}
    for stem, segs in EVAL_SEGS.items():
        for i, lang in enumerate(("de", "en")):
            tag = "srcset" if lang == "de" else "refset"
            lines = ['<?xml version="1.0" encoding="UTF-8"?>', "<mteval>",
                     f'<{tag} setid="iwslt2014-{stem}" srclang="german" trglang="english">',
                     '<doc docid="535" genre="lectures">',
                     "<url>http://www.ted.com/talks/x.html</url>",
                     "<description>TED Talk Subtitles and Transcript: x</description>",
                     "<keywords>talks, x</keywords>", "<talkid>535</talkid>", "<title>X</title>"]
            lines += [f'<seg id="{n}"> {seg[i]} </seg>' for n, seg in enumerate(segs, 1)]
            lines += ["</doc>", f"</{tag}>", "</mteval>"]
            files[iwslt14.eval_file(stem, lang)] = "\n".join(lines) + "\n"
    return files, kept


def expected_test(lang: str) -> list[str]:
    i = 0 if lang == "de" else 1
    return [" ".join(moses.apply(seg[i].replace("’", "'"), ("tokenize",), lang).split()).lower()
            for stem in iwslt14.EVAL_SETS for seg in EVAL_SEGS[stem]]


def write_tgz(path: Path, files: dict[str, str | bytes], prefix: str = "de-en/") -> Path:
    with tarfile.open(path, "w:gz") as tf:
        if prefix:
            d = tarfile.TarInfo(prefix.rstrip("/"))
            d.type = tarfile.DIRTYPE
            d.mode = 0o755
            tf.addfile(d)
        for name, text in files.items():
            data = text.encode("utf-8") if isinstance(text, str) else text
            info = tarfile.TarInfo(prefix + name)
            info.size = len(data)
            info.mode = 0o644
            tf.addfile(info, io.BytesIO(data))
    return path


def write_dir(path: Path, files: dict[str, str | bytes]) -> Path:
    path.mkdir(parents=True)
    for name, text in files.items():
        (path / name).write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
    return path


def stamps(corpus: Path) -> dict[str, int]:
    return {s: (corpus / s / "stage.json").stat().st_mtime_ns for s in ("text", "subword", "bin")}


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("iwslt")
    files, kept = release_files()
    archive = write_tgz(tmp / "de-en.tgz", files)
    data = iwslt14.prepare(archive, vocab_size=VOCAB, root=tmp / "cache")
    return tmp, archive, data, kept


def test_split_filtering_and_tags_exact(prepared):
    tmp, _, data, kept = prepared
    assert len(kept) == 58  # 23 + 20 + 15 cleaned pairs
    valid = [kept[22], kept[45]]  # pairs 23 and 46
    train = [p for i, p in enumerate(kept, 1) if i % 23]
    text = Path(data.text_dir)
    assert lines(text / "valid.de") == [p[0] for p in valid]
    assert lines(text / "valid.en") == [p[1] for p in valid]
    assert lines(text / "train.de") == [p[0] for p in train]
    assert lines(text / "train.en") == [p[1] for p in train]
    assert data.counts == {"train": 56, "valid": 2, "test": 9}
    assert valid[0] == ("das ist satz 1 20 hier .", "this is sentence 1 20 here .")
    assert valid[1] == ("ted talk untertitel 3", "ted talk subtitles 3")
    body = (text / "train.de").read_text() + (text / "train.en").read_text()
    for gone in ("url", "talkid", "keywords", "wissenschaft", "science", "title>", "applause",
                 "yes , of course", "ja ."):
        assert gone not in body
    assert body == body.lower()


def test_test_set_order_tags_and_quotes(prepared):
    _, _, data, _ = prepared
    text = Path(data.text_dir)
    de, en = lines(text / "test.de"), lines(text / "test.en")
    assert de == expected_test("de") and en == expected_test("en")
    assert de[0] == "erster satz ." and de[1] == "das ist &apos; s gut ." and de[-1] == "acht ."
    assert en[2] == "second sentence ." and "’" not in "".join(de + en)
    assert not any("seg" in x or "<" in x for x in de + en)


def test_binarised_with_joined_dictionary(prepared):
    _, _, data, _ = prepared
    bin_dir = Path(data.bin_dir)
    assert (bin_dir / "dict.de.txt").read_text() == (bin_dir / "dict.en.txt").read_text()
    for split in ("train", "valid", "test"):
        for lang in ("de", "en"):
            assert (bin_dir / f"{split}.de-en.{lang}.bin").is_file()
    assert data.tokenized and data.name == "iwslt14_de_en" and data.subword == "sentencepiece"
    saved = json.loads((Path(data.bin_dir).parent / "prepared.json").read_text())
    assert saved["counts"] == data.counts


def test_second_run_does_nothing_and_folder_layouts_agree(prepared, tmp_path):
    tmp, archive, data, _ = prepared
    corpus = Path(data.bin_dir).parent
    before = stamps(corpus)
    assert iwslt14.prepare(archive, vocab_size=VOCAB, root=tmp / "cache") == data
    assert stamps(corpus) == before
    # the unpacked folder (de-en/ inside, or the files at the top) gives the same text
    files, _ = release_files()
    for folder in (write_dir(tmp_path / "unpacked" / "de-en", files).parent,
                   write_dir(tmp_path / "flat", files)):
        again = iwslt14.prepare(folder, vocab_size=VOCAB, root=tmp_path / "cache")
        for split in ("train", "valid", "test"):
            for lang in ("de", "en"):
                name = f"{split}.{lang}"
                assert lines(Path(again.text_dir) / name) == lines(Path(data.text_dir) / name)


def test_changes_rebuild_only_what_depends_on_them(tmp_path):
    """Another vocabulary or other corpus files: another key, another folder, the first one left
    as it was; a stage built the same way already (same inputs and settings) is linked from it."""
    files, _ = release_files()
    archive = write_tgz(tmp_path / "de-en.tgz", files)
    root = tmp_path / "cache"
    data = iwslt14.prepare(archive, vocab_size=VOCAB, root=root)
    first = stamps(data.folder)
    other = iwslt14.prepare(archive, vocab_size=VOCAB - 10, root=root)  # a setting of the subword stage
    assert other.key != data.key and other.folder != data.folder
    assert other.folder.name == f"iwslt14_de_en-{other.key}" and other.vocab_size == VOCAB - 10
    assert stamps(data.folder) == first
    second = stamps(other.folder)
    assert second["text"] == first["text"]  # linked, not rebuilt
    assert ((other.folder / "text" / "train.de").stat().st_ino
            == (data.folder / "text" / "train.de").stat().st_ino)
    assert second["subword"] != first["subword"] and second["bin"] != first["bin"]
    files["README"] = "changed, but the text it gives is the same\n"
    write_tgz(archive, files)
    third = iwslt14.prepare(archive, vocab_size=VOCAB - 10, root=root)
    assert third.key not in (data.key, other.key)
    assert stamps(third.folder)["text"] != second["text"]  # its input changed ...
    assert {s: stamps(third.folder)[s] for s in ("subword", "bin")} == {  # ... not its output
        s: second[s] for s in ("subword", "bin")}
    assert stamps(other.folder) == second


def test_subword_nmt_merges(tmp_path):
    files, _ = release_files()
    archive = write_tgz(tmp_path / "de-en.tgz", files)
    data = iwslt14.prepare(archive, subword="subword_nmt", vocab_size=40, root=tmp_path / "cache")
    codes = Path(data.subword_model).read_text(encoding="utf-8").splitlines()
    assert 1 < len(codes) <= 41  # the version header and at most 40 merges
    sub = Path(data.bin_dir).parent / "subword"
    decode = data.decoder()
    assert [decode(x) for x in lines(sub / "test.en")] == lines(Path(data.text_dir) / "test.en")


def test_vocab_too_large_says_what_to_do(tmp_path):
    files, _ = release_files()
    archive = write_tgz(tmp_path / "de-en.tgz", files)
    with pytest.raises(DataError, match=r"at most (\d+)\): pass --vocab-size \1 or less$"):
        iwslt14.prepare(archive, vocab_size=10000, root=tmp_path / "cache")
    assert not list((tmp_path / "cache").glob("*/subword"))


def _bad(tmp_path: Path, **edit) -> tuple[Path, dict[str, str | bytes]]:
    files, _ = release_files()
    files.update(edit)
    return tmp_path / "de-en.tgz", files


@pytest.mark.parametrize("case, pattern", [
    ("missing_member", r"de-en\.tgz: missing de-en/IWSLT14\.TED\.tst2011\.de-en\.en\.xml"),
    ("misaligned", r"de-en/train\.tags\.de-en\.de has 61 sentence lines but .*train\.tags\.de-en\.en "
                   r"has 62"),
    ("not_utf8", r"de-en\.tgz:de-en/train\.tags\.de-en\.en:3: not UTF-8"),
    ("empty", r"de-en/train\.tags\.de-en\.de: no sentence lines"),
    ("no_segs", r"IWSLT14\.TED\.tst2012\.de-en\.de\.xml: no <seg"),
    ("eval_misaligned", r"IWSLT14\.TED\.dev2010\.de-en\.de\.xml has 2 <seg> lines but .*has 3"),
])
def test_bad_archives_fail_cleanly(tmp_path, case, pattern):
    files, _ = release_files()
    en = files[iwslt14.train_file("en")]
    if case == "missing_member":
        del files[iwslt14.eval_file("IWSLT14.TED.tst2011", "en")]
    elif case == "misaligned":
        files[iwslt14.train_file("en")] = en + "One sentence too many.\n"
    elif case == "not_utf8":
        raw = en.encode().split(b"\n")
        raw[2] = "<speaker>Speaker 1 caf\u00e9</speaker>".encode("latin-1")
        files[iwslt14.train_file("en")] = b"\n".join(raw)
    elif case == "empty":
        files[iwslt14.train_file("de")] = ""
    elif case == "no_segs":
        files[iwslt14.eval_file("IWSLT14.TED.tst2012", "de")] = "<mteval>\n</mteval>\n"
    elif case == "eval_misaligned":
        name = iwslt14.eval_file("IWSLT14.TED.dev2010", "en")
        files[name] = files[name].replace("</doc>", '<seg id="3"> Extra . </seg>\n</doc>')
    archive = write_tgz(tmp_path / "de-en.tgz", files)
    with pytest.raises(DataError, match=pattern) as err:
        iwslt14.prepare(archive, vocab_size=VOCAB, root=tmp_path / "cache")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.*"))


def test_not_an_archive_and_missing_paths(tmp_path):
    (tmp_path / "de-en.tgz").write_text("not a tar file\n")
    with pytest.raises(DataError, match="not a readable .tgz archive"):
        iwslt14.prepare(tmp_path / "de-en.tgz", root=tmp_path / "cache")
    files, _ = release_files()
    whole = write_tgz(tmp_path / "whole.tgz", files).read_bytes()
    (tmp_path / "cut.tgz").write_bytes(whole[: len(whole) // 2])  # an interrupted download
    with pytest.raises(DataError, match="cut.tgz: not a readable .tgz archive"):
        iwslt14.prepare(tmp_path / "cut.tgz", root=tmp_path / "cache")
    with pytest.raises(DataError, match="no such file or folder"):
        iwslt14.prepare(tmp_path / "nowhere.tgz", root=tmp_path / "cache")
    files, _ = release_files()
    del files[iwslt14.train_file("de")]
    folder = write_dir(tmp_path / "de-en", files)
    with pytest.raises(DataError, match=r"missing file .*de-en/train\.tags\.de-en\.de"):
        iwslt14.prepare(folder, root=tmp_path / "cache")


def test_clean_corpus_semantics():
    pairs = [("a b", "c d e"),  # ratio 1.5: kept
             ("a", "b c"),  # ratio 2: dropped
             ("", "x"),  # empty side: dropped
             ("  a |  b ", "c\td"),  # | removed, whitespace squeezed
             (" ".join("w" * 1 for _ in range(176)), "x " * 175)]  # 176 tokens: dropped
    out = list(moses.clean_corpus([p[0] for p in pairs], [p[1] for p in pairs], 1, 175, 1.5))
    assert out == [("a b", "c d e"), ("a b", "c d")]


def test_flat_archive_and_fewer_than_23_pairs(tmp_path):
    """Files at the top of the archive are accepted; under 23 pairs, valid is simply empty."""
    files, _ = release_files()
    de = [f"Das ist Satz {j} hier." for j in range(5)]
    en = [f"This is sentence {j} here." for j in range(5)]
    files[iwslt14.train_file("de")] = "<url>http://x</url>\n" + "\n".join(de) + "\n"
    files[iwslt14.train_file("en")] = "<url>http://x</url>\n" + "\n".join(en) + "\n"
    archive = write_tgz(tmp_path / "de-en.tgz", files, prefix="")
    data = iwslt14.prepare(archive, vocab_size=60, root=tmp_path / "cache")
    assert data.counts == {"train": 5, "valid": 0, "test": 9}
    assert lines(Path(data.text_dir) / "train.en")[0] == "this is sentence 0 here ."
