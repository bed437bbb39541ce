"""Translating a split and scoring it: beam search in fairseq-generate's batches (``generate``),
the text level back to plain text (``detokenizer``) and sacreBLEU (``BleuScorer``).

Training's per-epoch BLEU (lnexp.train.rank0) and ``lnexp evaluate`` / ``lnexp translate``
(lnexp.evaluation) both decode through here, so that the same beam, length penalty and batch size
give the same hypotheses. BLEU is computed on detokenised text with sacreBLEU's default 13a
tokenisation. For corpora kept Moses-tokenised and lowercased (IWSLT14/WMT14), the community's
tokenised BLEU is reported as well (``bleu_tok``: sacreBLEU with ``tokenize='none'`` on the
tokenised text, i.e. multi-bleu).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from lnexp import fairseq_adapter as fa
from lnexp.data.corpus import PreparedData
from lnexp.errors import UserError
from lnexp.plural import count
from lnexp.rundir import write_text


@dataclass
class Validation:
    loss: float  # label-smoothed cross-entropy, bits per target token
    nll_loss: float  # plain cross-entropy, bits per target token
    bleu: float | None = None
    bleu_tok: float | None = None
    signature: str | None = None

    @property
    def ppl(self) -> float:
        return 2 ** self.nll_loss if self.nll_loss < 64 else math.inf


class BleuScorer:
    """Generates translations of the validation set and scores them with sacreBLEU."""

    def __init__(self, task, data: PreparedData, beam: int, lenpen: float,
                 max_sentences: int, subset: int = 0, split: str = "valid") -> None:
        self.task, self.data, self.split = task, data, split
        self.beam, self.lenpen, self.max_sentences = beam, lenpen, max_sentences
        refs = data.references(split)
        self.n = min(subset, len(refs)) if subset else len(refs)
        self.refs_tok = refs[: self.n]
        self.decode = data.decoder()
        self._detok = detokenizer(data)
        self.refs = [self.detok(r) for r in self.refs_tok]

    def detok(self, text: str) -> str:
        return self._detok(text)

    def translate(self, model, device: str) -> list[str]:
        """Hypotheses of the first ``n`` sentences, batched as fairseq-generate batches them (so
        that ``lnexp evaluate --split valid`` with the same beam, lenpen and batch size gives
        this BLEU)."""
        return generate(self.task, model, self.split, device, self.beam, self.lenpen,
                        self.max_sentences, self.decode, range(self.n))

    def score(self, model, device: str, hyps_path: Path | None = None) -> Validation:
        v, hyps = self.score_translations(self.translate(model, device))
        if hyps_path is not None:
            write_text(hyps_path, "".join(h + "\n" for h in hyps))
        return v

    def score_translations(self, hyps_tok: list[str]) -> tuple[Validation, list[str]]:
        """BLEU (and bleu_tok) of translations at the text level; returns them detokenised too."""
        import sacrebleu

        if len(hyps_tok) != len(self.refs):
            raise MissingHypotheses(f"{count(len(hyps_tok), 'hypothesis', 'hypotheses')} for "
                                    f"{count(len(self.refs), f'{self.split} reference')}: no BLEU is "
                                    "reported")
        hyps = [self.detok(h) for h in hyps_tok]
        bleu = sacrebleu.metrics.BLEU()
        result = bleu.corpus_score(hyps, [self.refs])
        v = Validation(math.nan, math.nan, result.score, signature=str(bleu.get_signature()))
        if self.data.tokenized:
            v.bleu_tok = sacrebleu.corpus_bleu(hyps_tok, [self.refs_tok], tokenize="none").score
        return v, hyps


class MissingHypotheses(UserError):
    """Fewer hypotheses than source sentences: a score over them would be silently wrong."""


def generate(task, model, split: str, device: str, beam: int, lenpen: float, max_sentences: int,
             decode, ids, batches=None) -> list[str]:
    """Beam-search translations of the examples ``ids`` of a split, in that order, decoded from
    subword pieces by ``decode``. ``batches``: how to group them (default: fairseq-generate's
    batches of ``max_sentences``, :func:`lnexp.fairseq_adapter.generate_batches`). Raises
    :class:`MissingHypotheses` unless every example got exactly one hypothesis."""
    model.eval()
    generator = fa.sequence_generator(task, model, beam, lenpen)
    tgt_dict = task.target_dictionary
    ids = list(ids)
    if batches is None:
        batches = fa.generate_batches(task, split, model, max_sentences, ids)
    hyps: dict[int, str] = {}
    with torch.no_grad():
        for sample in batches:
            sample = fa.move_to(sample, device)
            for sid, out in zip(sample["id"].tolist(), task.inference_step(
                    generator, [model], sample), strict=True):
                pieces = tgt_dict.string(out[0]["tokens"].int().cpu())
                hyps[sid] = decode(pieces)
    check_complete(split, ids, hyps)
    return [hyps[i] for i in ids]


def check_complete(split: str, ids: list[int], hyps: dict[int, str]) -> None:
    """Every source sentence has its hypothesis, and nothing else was decoded."""
    missing = [i for i in ids if i not in hyps]
    if missing or len(hyps) != len(ids):
        shown = ", ".join(map(str, missing[:5])) + (", ..." if len(missing) > 5 else "")
        raise MissingHypotheses(
            f"{len(missing)} of the {count(len(ids), f'{split} sentence')} got no hypothesis "
            f"(ids {shown or 'none'}; {len(hyps)} decoded): no BLEU is reported. The batches "
            "lost sentences: decode with lnexp.fairseq_adapter.generate_batches "
            "(fairseq-generate needs --required-batch-size-multiple 1)")


def detokenizer(data: PreparedData) -> Callable[[str], str]:
    """The text level of ``text_dir`` -> plain text: Moses detokenisation for tokenised corpora."""
    if not data.tokenized:
        return lambda text: text
    from sacremoses import MosesDetokenizer

    md = MosesDetokenizer(lang=data.tgt)
    return lambda text: md.detokenize(text.split())
