"""``lnexp translate RUN``: raw sentences on stdin, one translation per line on stdout.

    echo "Ein Mann fährt Fahrrad." | lnexp translate runs/RUN [--checkpoint best|last|avgN]

The input is prepared as the run's training data was (the corpus's normalisation, tokenisation
and lowercasing, the run's subword model and dictionary); the output is detokenised as
``lnexp evaluate`` scores it. On a terminal it prompts for one sentence at a time.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

from lnexp.errors import UserError, at_least
from lnexp.evaluation.evaluate import decoding, parser, quiet
from lnexp.evaluation.runinfo import RunInfo, open_run, run_folders


class Translator:
    """A run's model with its input and output processing, for sentences in memory."""

    def __init__(self, run: RunInfo, checkpoint: str, beam: int, lenpen: float, batch: int,
                 device: str, max_len: int | None = None) -> None:
        from lnexp.decoding import detokenizer
        from lnexp.evaluation import checkpoints
        from lnexp.evaluation.inputs import encoder

        self.run, self.beam, self.lenpen, self.batch, self.device = run, beam, lenpen, batch, device
        self.model, self.task = checkpoints.load(checkpoints.resolve(run.dir, checkpoint),
                                                 run.data.bin_dir, device)
        self.encode, self.decode = encoder(run.data), run.data.decoder()
        self.detok = detokenizer(run.data)
        from lnexp import fairseq_adapter as fa

        self.limit = fa.max_source_tokens(self.task, self.model)
        if max_len is not None and max_len > self.limit:
            raise UserError(f"--max-len {max_len} is more than the {self.limit} tokens the model "
                            f"reads: pass --max-len {self.limit} or less")
        self.max_len, self.seen = max_len, 0  # seen: lines read so far (for the line numbers)

    def __call__(self, lines: list[str]) -> list[str]:
        from lnexp import fairseq_adapter as fa
        from lnexp.decoding import generate
        from lnexp.evaluation.inputs import text_level

        first, self.seen = self.seen + 1, self.seen + len(lines)
        keep = [i for i, x in enumerate(lines) if x.strip()]
        if not keep:
            return ["" for _ in lines]
        text = text_level(self.run, [lines[i] for i in keep], self.run.data.src)
        pieces = [self.fit(self.encode(x), first + i) for i, x in zip(keep, text, strict=True)]
        fa.add_inference_split(self.task, "input", pieces)
        hyps = generate(self.task, self.model, "input", self.device, self.beam, self.lenpen,
                        self.batch, self.decode, range(len(keep)))
        out = ["" for _ in lines]
        for i, h in zip(keep, hyps, strict=True):
            out[i] = self.detok(h)
        return out


    def fit(self, pieces: str, line: int) -> str:
        """A line's subword pieces within what the model reads (its EOS counted): cut to --max-len,
        else one line naming it (fairseq would stop at the sentence with a traceback)."""
        tokens = pieces.split()
        limit = self.max_len or self.limit
        if len(tokens) + 1 <= limit:
            return pieces
        if self.max_len is None:
            raise UserError(f"input line {line} is {len(tokens) + 1} subword tokens, more than the "
                            f"{self.limit} the model reads: split it into sentences, or pass "
                            f"--max-len {self.limit} to cut longer lines there")
        return " ".join(tokens[:limit - 1])


def _lines(stream) -> Iterator[str]:
    """The stream's lines as text; bytes that are not UTF-8 are one line naming the line, not the
    tokenizer's crash (stdin decodes them as surrogates under a C locale, or raises)."""
    raw = getattr(stream, "buffer", None)
    for n, line in enumerate(raw if raw is not None else stream, 1):
        try:
            text = line.decode("utf-8") if isinstance(line, bytes) else line
            text.encode("utf-8")
        except UnicodeError as e:
            raise UserError(f"stdin line {n} is not UTF-8 text ({e.reason}): re-encode the input, "
                            "e.g. iconv -f latin1 -t utf-8 FILE | lnexp translate RUN") from None
        yield text


def _chunks(stream, size: int) -> Iterator[list[str]]:
    buf: list[str] = []
    for line in _lines(stream):
        buf.append(line.rstrip("\r\n"))
        if len(buf) == size:
            yield buf
            buf = []
    if buf:
        yield buf


def main(argv: list[str]) -> int:
    ap = parser("lnexp translate", __doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a run folder that lnexp train wrote")
    ap.add_argument("--max-len", type=at_least(2), default=None,
                    help="cut input lines to this many subword tokens (default: a longer line than "
                         "the model reads is an error)")
    args = ap.parse_args(argv)
    dirs = run_folders([args.run])
    if len(dirs) != 1:
        raise UserError(f"{args.run} holds {len(dirs)} runs: pass one run folder")
    quiet()
    run = open_run(dirs[0])
    beam, lenpen, batch, device = decoding(run, args)
    translate = Translator(run, args.checkpoint, beam, lenpen, batch, device, args.max_len)
    if sys.stdin.isatty():
        src = run.data.src
        print(f"{run.dir.name}: {src}->{run.data.tgt}, checkpoint {args.checkpoint}, beam {beam}; "
              "Ctrl-D to stop", file=sys.stderr)
        while True:
            print(f"{src}> ", end="", file=sys.stderr, flush=True)  # stdout: translations only
            try:
                line = input()
            except EOFError:
                print(file=sys.stderr)
                return 0
            try:
                print(translate([line])[0], flush=True)
            except UserError as e:  # one sentence too long: say so, take the next
                print(f"lnexp translate: error: {e}", file=sys.stderr, flush=True)
    for chunk in _chunks(sys.stdin, batch):
        sys.stdout.write("".join(h + "\n" for h in translate(chunk)))
        sys.stdout.flush()
    return 0
