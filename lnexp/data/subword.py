"""Joint subword vocabularies: sentencepiece BPE (default) or subword-nmt (the reference tool)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from lnexp.data.cache import cached_stage
from lnexp.data.text import SPLITS, progress, read_lines, split_files, write_lines
from lnexp.errors import DataError

SUBWORDS = ("sentencepiece", "subword_nmt")
SPM_MODEL = "spm.model"
BPE_CODES = "bpe.codes"


def subword_stage(
    name: str, out: Path, text_dir: Path, src: str, tgt: str, kind: str, vocab_size: int,
    reuse: Iterable[Path] = (),
) -> tuple[Path, Path]:
    """Learn a joint model on train (both sides) and encode every split (or link the same stage of
    another preparation, one of ``reuse``)."""
    if kind not in SUBWORDS:
        from lnexp.errors import ConfigError

        raise ConfigError(f"unknown subword {kind!r}: use subword=sentencepiece or subword_nmt")
    inputs = split_files(text_dir, src, tgt)

    def build(tmp: Path) -> None:
        train = [text_dir / f"train.{src}", text_dir / f"train.{tgt}"]
        encode = (_train_spm if kind == "sentencepiece" else _train_bpe)(train, tmp, vocab_size)
        for split in SPLITS:
            for lang in (src, tgt):
                lines = read_lines(text_dir / f"{split}.{lang}")
                write_lines(tmp / f"{split}.{lang}", [
                    encode(line) for line in progress(lines, f"{name}/subword: {split}.{lang}")])

    out, _ = cached_stage(f"{name}/subword", out, inputs, settings(kind, vocab_size), build,
                          reuse=reuse)
    return out, out / (SPM_MODEL if kind == "sentencepiece" else BPE_CODES)


def settings(kind: str, vocab_size: int) -> dict:
    """The subword stage's settings, as its stage.json records them."""
    return {"kind": kind, "vocab": vocab_size}


class VocabularySize(DataError):
    """A vocabulary size the training text cannot give: ``say(how)`` names the setting to change,
    ``lnexp prepare``'s ``--vocab-size`` (the message) or training's ``dataset.vocab_size=``."""

    def __init__(self, problem: str, sizes: str) -> None:
        self.problem, self.sizes = problem, sizes
        super().__init__(self.say("pass --vocab-size "))

    def say(self, how: str) -> str:
        return f"{self.problem}: {how}{self.sizes}"


def _train_spm(train: list[Path], out: Path, vocab_size: int) -> Callable[[str], str]:
    import re

    import sentencepiece as spm

    # Above input_sentence_size lines, sentencepiece trains on a sample: it must be a random one
    # (seeded), or a large corpus (WMT14: 4.5M lines a side) would be learned on its first side only.
    spm.set_random_generator_seed(1)
    try:
        spm.SentencePieceTrainer.train(
            input=",".join(str(p) for p in train), model_prefix=str(out / "spm"), model_type="bpe",
            vocab_size=vocab_size, character_coverage=1.0, input_sentence_size=2_000_000,
            shuffle_input_sentence=True, num_threads=2,
            bos_id=-1, eos_id=-1, pad_id=-1, unk_id=0, minloglevel=2,
        )
    except RuntimeError as e:
        most = re.search(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)",
                         str(e))
        least = re.search(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)",
                          str(e))
        if most is not None:
            raise VocabularySize(f"{train[0].parent}: the training text is too small for a "
                                 f"{vocab_size}-piece sentencepiece vocabulary (at most "
                                 f"{most.group(2)})", f"{most.group(2)} or less") from None
        if least is not None:
            raise VocabularySize(f"a {vocab_size}-piece vocabulary cannot hold the {least.group(2)} "
                                 f"characters of {train[0].parent}",
                                 f"{int(least.group(2)) + 1} or more") from None
        raise
    return piece_encoder("sentencepiece", out / SPM_MODEL)


def _train_bpe(train: list[Path], out: Path, merges: int) -> Callable[[str], str]:
    """subword-nmt learn_bpe on the concatenated sides, as prepare-iwslt14.sh does."""
    from subword_nmt.learn_bpe import learn_bpe

    joint = [line for p in train for line in read_lines(p)]
    with open(out / BPE_CODES, "w", encoding="utf-8") as codes:
        learn_bpe(joint, codes, merges, min_frequency=2)
    return piece_encoder("subword_nmt", out / BPE_CODES)


def piece_encoder(kind: str, model: Path) -> Callable[[str], str]:
    """Text at the level of ``text/`` -> a line of subword pieces (the model learned on train)."""
    if kind == "sentencepiece":
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_file=str(model))
        return lambda line: " ".join(sp.encode(line, out_type=str))
    from subword_nmt.apply_bpe import BPE

    with open(model, encoding="utf-8") as codes:
        bpe = BPE(codes)
    return lambda line: bpe.process_line(line).strip()


def piece_decoder(kind: str, model: Path) -> Callable[[str], str]:
    """Turn a line of subword pieces back into text at the level the corpus's references are."""
    if kind == "sentencepiece":
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_file=str(model))
        return lambda line: sp.decode(line.split())
    return lambda line: (line + " ").replace("@@ ", "").rstrip()
