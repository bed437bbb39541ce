"""Per-epoch validation: label-smoothed loss (bits/token, fairseq's unit) and sacreBLEU.

BLEU is computed on detokenised text with sacreBLEU's default 13a tokenisation. For corpora kept
Moses-tokenised and lowercased (IWSLT14/WMT14), the community's tokenised BLEU is reported as
well (``bleu_tok``: sacreBLEU with ``tokenize='none'`` on the tokenised text, i.e. multi-bleu).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from lnexp import fairseq_adapter as fa
from lnexp.data.corpus import PreparedData
from lnexp.data.text import write_lines


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


def validation_loss(task, trainer, split: str = "valid", max_tokens: int = 8192) -> Validation:
    model, criterion = trainer.get_model(), trainer.criterion  # unwrapped: no DDP collectives
    model.eval()
    loss = nll = ntokens = sample_size = 0.0
    with torch.no_grad():
        for sample in fa.batch_iterator(task, split, max_tokens=max_tokens):
            sample = fa.move_to(sample, trainer.device.type)
            _, size, out = task.valid_step(sample, model, criterion)
            loss += float(out["loss"])
            nll += float(out["nll_loss"])
            ntokens += out["ntokens"]
            sample_size += size
    ln2 = math.log(2)
    return Validation(loss / sample_size / ln2, nll / ntokens / ln2)


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
        self._detok = _moses_detokenizer(data.tgt) if data.tokenized else None
        self.refs = [self.detok(r) for r in self.refs_tok]

    def detok(self, text: str) -> str:
        return self._detok(text) if self._detok else text

    def translate(self, model, device: str) -> list[str]:
        task = self.task
        model.eval()
        generator = fa.sequence_generator(task, model, self.beam, self.lenpen)
        tgt_dict = task.target_dictionary
        hyps: dict[int, str] = {}
        with torch.no_grad():
            for sample in fa.batch_iterator(task, self.split, max_tokens=1 << 30,
                                            max_sentences=self.max_sentences, ids=range(self.n)):
                sample = fa.move_to(sample, device)
                for sid, out in zip(sample["id"].tolist(), task.inference_step(
                        generator, [model], sample), strict=True):
                    pieces = tgt_dict.string(out[0]["tokens"].int().cpu())
                    hyps[sid] = self.decode(pieces)
        return [hyps.get(i, "") for i in range(self.n)]

    def score(self, model, device: str, hyps_path: Path | None = None) -> Validation:
        import sacrebleu

        hyps_tok = self.translate(model, device)
        hyps = [self.detok(h) for h in hyps_tok]
        bleu = sacrebleu.metrics.BLEU()
        result = bleu.corpus_score(hyps, [self.refs])
        v = Validation(math.nan, math.nan, result.score, signature=str(bleu.get_signature()))
        if self.data.tokenized:
            v.bleu_tok = sacrebleu.corpus_bleu(hyps_tok, [self.refs_tok], tokenize="none").score
        if hyps_path is not None:
            write_lines(hyps_path, hyps)
        return v


def _moses_detokenizer(lang: str):
    from sacremoses import MosesDetokenizer

    md = MosesDetokenizer(lang=lang)
    return lambda text: md.detokenize(text.split())
