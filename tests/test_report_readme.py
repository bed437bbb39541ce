"""`make report` rewrites README's claims table from the figures' checks files, nothing typed, and
never erases the rows it has no files for."""

from __future__ import annotations

import json
import time

import pytest

from lnexp.errors import UserError
from lnexp.figures import report
from tests.conftest import REPO


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
           "atlas: 1 of 2 claims supported by our runs (mini, " in text


def test_report_never_erases_readmes_measured_rows(tmp_path):
    """A clone without figure files leaves README's block as it is; a figure's checks file
    replaces that figure's rows only, and the others keep their scale and date."""
    readme, figures = tmp_path / "README.md", tmp_path / "figures"
    original = (REPO / "README.md").read_text()
    readme.write_text(original)
    args = ["--figures", str(figures), "--out", str(tmp_path / "report"), "--runs-root",
            str(tmp_path / "runs"), "--readme", str(readme)]
    assert report.main(args) == 0
    assert readme.read_text() == original
    block = original[original.index(report.README_BEGIN):original.index(report.README_END)]
    fig3_rows = [ln for ln in block.splitlines() if ln.startswith("| Gradient norms at init")]
    assert fig3_rows and "Not run yet" not in block
    figures.mkdir()
    (figures / "fig4_checks.json").write_text(json.dumps({"scale": "mini", "checks": [
        {"claim": "Pre-LN sooner", "paper": "1.67x", "measured_text": "1.80x", "pass": True}]}))
    assert report.main(args) == 0
    text = readme.read_text()
    today = time.strftime("%Y-%m-%d")
    assert f"| Convergence speed: Pre-LN without warm-up vs Post-LN | Pre-LN sooner | 1.67x | 1.80x | " \
           f"yes | mini, {today} |" in text
    assert "target 6.01 bits" not in text  # fig4's old row is replaced ...
    assert all(row in text for row in fig3_rows)  # ... the others stay as measured
    assert "Not run yet" not in text and text.count("| Warm-up ablation with Post-LN |") == 1


def test_readme_without_markers_is_a_one_line_error(tmp_path):
    (tmp_path / "README.md").write_text("no block here\n")
    with pytest.raises(UserError, match="has no claims block"):
        report.update_readme(tmp_path / "README.md", tmp_path / "figures", "mini")
    assert (tmp_path / "README.md").read_text() == "no block here\n"
