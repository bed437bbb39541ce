"""``lnexp`` command line: thin dispatch, heavy imports only inside the chosen command.

    lnexp train [hydra overrides]          one run, or a sweep with -m
    lnexp prepare CORPUS [ARGS]            prepare a corpus offline (lnexp prepare --help lists them)
    lnexp results [filters] [--csv]        table of runs
    lnexp evaluate RUN ... [--split test]  test-set BLEU (sacreBLEU, chrF) of trained runs
    lnexp compare RUN_A RUN_B              is a BLEU/chrF difference significant (sacreBLEU's paired tests)
    lnexp translate RUN                    stdin sentences -> translations on stdout
    lnexp plot RUN ... --out FILE          any runs' curves in one figure
    lnexp figure NAME [options]            a paper figure or the report (lnexp figure --help lists them)
    lnexp atlas [--scale S] [--budget-min M] the zoo atlas's runs, chosen adaptively (docs/atlas.md)
"""

from __future__ import annotations

import sys

from lnexp.exit_status import Exit

COMMANDS = {
    "train": ("lnexp.train.run", "one training run (Hydra overrides; -m for a sweep)"),
    "prepare": ("lnexp.data.cli", "prepare a corpus offline (lnexp prepare --help lists them)"),
    "results": ("lnexp.results", "list runs and their best scores (--csv to export)"),
    "evaluate": ("lnexp.evaluation.evaluate", "test-set BLEU/chrF of runs (best, last or avgN)"),
    "compare": ("lnexp.evaluation.compare", "BLEU/chrF difference of two runs and its p-value"),
    "translate": ("lnexp.evaluation.translate", "translate stdin with a run's model"),
    "plot": ("lnexp.figures.plot", "any runs' curves in one figure (PNG and PDF)"),
    "figure": ("lnexp.figures.cli", "draw a paper figure from finished runs"),
    "atlas": ("lnexp.atlas.driver", "the zoo atlas: adaptive rounds of runs within a time budget"),
}


def usage() -> str:
    lines = ["usage: lnexp COMMAND [ARGS]", "", "commands:"]
    lines += [f"  {name:<9} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Examples:", "  lnexp train placement=pre_ln warmup=0",
              "  lnexp train -m placement=post_ln,pre_ln warmup=0,4000",
              "  lnexp train --help   (every config group and option)"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    try:
        return _dispatch(list(sys.argv[1:] if argv is None else argv))
    except BrokenPipeError:  # `lnexp ... | head`: the reader left; say nothing more
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return Exit.OK


def _dispatch(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return Exit.OK
    if argv[0] in ("-V", "--version"):
        from lnexp import __version__

        print(f"lnexp {__version__}")
        return Exit.OK
    if argv[0] in ("-sc", "--shell-completion"):
        return _complete(argv)
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"lnexp: unknown command {command!r}; use one of {', '.join(COMMANDS)} "
              "(lnexp --help)", file=sys.stderr)
        return Exit.BAD_INPUT
    import importlib

    from lnexp.errors import UserError

    module = importlib.import_module(COMMANDS[command][0])
    try:
        return int(module.main(rest) or 0)
    except UserError as e:
        print(f"lnexp {command}: error: {e}", file=sys.stderr)
        return Exit.BAD_INPUT
    except BrokenPipeError:
        raise
    except OSError as e:  # a path the command could not read or write, where no check named it
        where = f"{e.filename}: " if e.filename else ""
        print(f"lnexp {command}: error: {where}{e.strerror or e}: check the path and that you may "
              "read or write there", file=sys.stderr)
        return Exit.BAD_INPUT
    except KeyboardInterrupt:
        print(f"lnexp {command}: interrupted; finished work is kept, re-run to resume",
              file=sys.stderr)
        return Exit.INTERRUPTED


def _complete(argv: list[str]) -> int:
    """The shell's question from the script ``lnexp train -sc install=bash`` installs: the line typed
    so far is in $COMP_LINE. Command names, then Hydra's completion of ``lnexp train``'s groups,
    options and keys; other commands complete file names (the script's default)."""
    import os

    line = os.environ.get("COMP_LINE", "")
    words = line.split()
    if len(words) > 1 and words[1] == "train" and (len(words) > 2 or line.endswith(" ")):
        os.environ["COMP_LINE"] = line.split(None, 1)[1]  # Hydra drops the first word: `train`
        from lnexp.train.run import shell_completion

        return shell_completion(argv)
    if len(words) == 1 or (len(words) == 2 and not line.endswith(" ")):
        prefix = words[1] if len(words) == 2 else ""
        print(" ".join(c for c in COMMANDS if c.startswith(prefix)))
    return Exit.OK


if __name__ == "__main__":
    sys.exit(main())
