"""`make report` rewrites README's claims table from the figures' checks files, nothing typed."""

from __future__ import annotations

import json

import pytest

from lnexp.errors import UserError
from lnexp.figures import report


def test_readme_claims_block_is_rewritten_from_checks(tmp_path):
    figures = tmp_path / "figures"
    figures.mkdir()
    (figures / "fig4_checks.json").write_text(json.dumps({"scale": "mini", "checks": [
        {"claim": "Pre-LN reaches Post-LN's loss sooner", "paper": "~1.7x", "measured_text": "1.74x",
         "pass": True},
        {"claim": "informational row", "paper": "-", "measured_text": "x", "pass": False,
         "required": False}]}))
    (figures / "atlas_checks.json").write_text(json.dumps({"scale": "mini", "claims_supported": "1 of 2",
                                                          "checks": [
        {"claim": "Peri-LN at a higher lr", "ours": "both to the top", "pass": None, "required": False},
        {"claim": "dt < 1 never less stable", "ours": "4 comparisons", "pass": True, "required": False}]}))
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n\n{report.README_BEGIN}\nold table\n{report.README_END}\n\nafter\n")
    assert report.main(["--figures", str(figures), "--out", str(tmp_path / "report"), "--runs-root",
                        str(tmp_path / "runs"), "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("intro\n\n") and text.endswith("\n\nafter\n") and "old table" not in text
    assert "| Convergence speed: Pre-LN without warm-up vs Post-LN | Pre-LN reaches Post-LN's loss " \
           "sooner | ~1.7x | 1.74x | yes |" in text
    assert "informational row" not in text  # required rows only; report/README.md has the rest
    assert "Not run yet for this table: `make fig3`, `make theory`, `make fig2`." in text
    assert "dt < 1" not in text  # the atlas's claims are informational: counted, not listed
    assert "Informational (no threshold at this scale; each claim in `report/README.md`): Stability " \
           "atlas: 1 of 2 claims supported by our runs." in text


def test_readme_without_markers_is_a_one_line_error(tmp_path):
    (tmp_path / "README.md").write_text("no block here\n")
    with pytest.raises(UserError, match="has no claims block"):
        report.update_readme(tmp_path / "README.md", "table")
    assert (tmp_path / "README.md").read_text() == "no block here\n"
