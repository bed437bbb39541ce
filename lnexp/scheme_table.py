"""docs/configuration.md's table of schemes, written from configs/placement/*.yaml (each scheme's
``about`` and ``recipe``), so that the page lists every scheme and says of it what its YAML says.

``python -m lnexp.scheme_table docs/configuration.md`` rewrites the table between its markers;
tests/test_docs.py fails when the page and the YAMLs disagree.
"""

from __future__ import annotations

import sys
from pathlib import Path

from lnexp.exit_status import Exit
from lnexp.names import PLACEMENTS
from lnexp.scheme import about

BEGIN = ("<!-- schemes: written by `python -m lnexp.scheme_table docs/configuration.md` from "
         "configs/placement/*.yaml -->")
END = "<!-- end of schemes -->"
HEADER = ("| scheme | one block | initialisation | paper | checked against | recipe |\n"
          "|---|---|---|---|---|---|")
# A recipe as the page's paragraph above the table names it
RECIPES = {("inverse_sqrt", "${scale.warmup}"): "Post-LN's", ("step", 0): "Pre-LN's"}


def recipe_text(recipe: dict) -> str:
    key = (recipe["schedule"], recipe["warmup"])
    return RECIPES.get(key, f"`{recipe['schedule']}`, warm-up {recipe['warmup']}")


def table() -> str:
    rows = []
    for p in PLACEMENTS:
        a = about(p)
        cells = (f"`{p}`", a["block"], a["init"], a["paper"], a["checked"], recipe_text(a["recipe"]))
        rows.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join((HEADER, *rows))


def rewrite(page: str) -> str:
    """``page`` with the text between the markers replaced by :func:`table`."""
    head, begin, rest = page.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise ValueError(f"the page has no {BEGIN} ... {END} markers")
    return f"{head}{BEGIN}\n{table()}\n{END}{tail}"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m lnexp.scheme_table PAGE.md", file=sys.stderr)
        return Exit.BAD_INPUT
    page = Path(argv[0])
    page.write_text(rewrite(page.read_text(encoding="utf-8")), encoding="utf-8")
    return Exit.OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
