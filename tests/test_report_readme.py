"""`make report` rewrites README's claims table from the figures' checks files, nothing typed, and
never erases the rows it has no files for."""

from __future__ import annotations

import json
import time

import pytest

from lnexp.errors import UserError
from lnexp.figures import report
from lnexp.figures.checks import Check, write_checks
from tests.conftest import REPO


def test_readme_claims_block_is_rewritten_from_checks(tmp_path):
    figures = tmp_path / "figures"
    figures.mkdir()
    write_checks(figures, "fig4", "mini", [
        Check("sooner", "Pre-LN reaches Post-LN's loss sooner", "~1.7x", {}, "1.74x", True),
        Check("info", "informational row", "-", {}, "x", False, required=False)], {})
    write_checks(figures, "atlas", "mini", [
        Check("higher", "Peri-LN at a higher lr", "", {}, "both to the top", None, required=False),
        Check("dt", "dt < 1 never less stable", "", {}, "4 comparisons", True, required=False)],
        {"claims_supported": "1 of 2"})
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
    """A clone without figure files is a one-line error that leaves README as it is; a figure's
    checks file replaces that figure's rows only, and the others keep their scale and date."""
    readme, figures = tmp_path / "README.md", tmp_path / "figures"
    original = (REPO / "README.md").read_text()
    readme.write_text(original)
    args = ["--figures", str(figures), "--out", str(tmp_path / "report"), "--runs-root",
            str(tmp_path / "runs"), "--readme", str(readme)]
    with pytest.raises(UserError, match="no checks files in .*: make the figures first"):
        report.main(args)
    assert readme.read_text() == original and not (tmp_path / "report").exists()
    block = original[original.index(report.README_BEGIN):original.index(report.README_END)]
    fig3_rows = [ln for ln in block.splitlines() if ln.startswith("| Gradient norms at init")]
    assert fig3_rows and "Not run yet" not in block
    figures.mkdir()
    write_checks(figures, "fig4", "mini", [Check("sooner", "Pre-LN sooner", "1.67x", {}, "1.80x", True)], {})
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


def test_checks_round_trip_and_older_files(tmp_path):
    """A Check reads back as written; fig3/theory files of the older {"name": {...}} form give
    the rows their Check would; a file of any other shape is a one-line error."""
    from lnexp.figures.checks import read_checks

    new = [Check.of_value("flat", "W2 flat across depth", 1.1328, True, threshold=1.3),
           Check.of_value("kan", "mean |x| last/input (reported)", "3/5 layers", None)]
    write_checks(tmp_path, "fig3", "mini", new, {"meta": {"depths": [2, 3]}})
    doc, got = read_checks(tmp_path / "fig3_checks.json")
    assert got == new and doc["meta"] == {"depths": [2, 3]} and doc["all_required_pass"] is True
    (tmp_path / "old_checks.json").write_text(json.dumps({"figure": "fig3", "all_pass": True, "checks": {
        "flat": {"value": 1.1328, "pass": True, "claim": "W2 flat across depth", "threshold": 1.3},
        "kan": {"value": "3/5 layers", "pass": None, "claim": "mean |x| last/input (reported)"}}}))
    _, old = read_checks(tmp_path / "old_checks.json")
    assert report.check_rows(old) == report.check_rows(new) == [
        {"claim": "W2 flat across depth", "paper": "", "ours": "1.133", "holds": "yes"},
        {"claim": "mean \\|x\\| last/input (reported)", "paper": "", "ours": "3/5 layers",
         "holds": "reported (no threshold)"}]
    (tmp_path / "bad_checks.json").write_text(json.dumps({"checks": [{"claim": "no id"}]}))
    with pytest.raises(UserError, match=r"bad_checks.json is not a figure's checks file \(no 'id'\): rerun"):
        read_checks(tmp_path / "bad_checks.json")


def test_figures_register_themselves(capsys):
    """Each figure module's FIGURE: `lnexp figure --help` and the report list them in report order,
    and every experiment a figure draws has its config at every scale."""
    from lnexp.config import CONFIG_DIR
    from lnexp.figures import cli, registry
    from lnexp.names import SCALES

    figs = registry.figures()
    assert list(figs) == ["fig3", "theory", "fig2", "fig4", "atlas"]
    assert cli.main(["--help"]) == 0
    assert "usage: lnexp figure {fig3,theory,fig2,fig4,atlas,report}" in capsys.readouterr().out
    missing = [e for f in figs.values() for s in SCALES for e in f.experiments(s)
               if not (CONFIG_DIR / "experiment" / f"{e}.yaml").is_file()]
    assert not missing and figs["fig4"].experiments("paper") == ["fig4_paper", "fig4_wmt_paper"]


def test_readme_lists_each_atlas_claim_with_its_test(tmp_path):
    """The atlas's claims go to their own table in the block: test, arms with n, statistic, raw and
    Holm-adjusted p, verdict, and the date and machine; a rerun without the file keeps it."""
    figures = tmp_path / "figures"
    figures.mkdir()
    measured = {"test": "Boschloo's exact test", "arms": ["admin, 18+18: n=4", "post_ln, 18+18: n=4"],
                "statistic": ["admin 4/4 trained vs post_ln 0/4 trained"], "p": 0.0039, "p_holm": 0.047,
                "p_refute": 1.0, "p_refute_holm": 1.0, "verdict": "supported"}
    write_checks(figures, "atlas", "mini", [
        Check("rescued", "deep Post-LN fails where Admin trains", "Liu et al. 2020", measured, "...", True,
              required=False)],
        {"claims_supported": "1 of 1", "claims_decided": "1 of 1", "measured": "2026-12-03",
         "machine": "AMD EPYC 7B13", "alpha": 0.05})
    readme = tmp_path / "README.md"
    readme.write_text(f"{report.README_BEGIN}\n{report.README_END}\n")
    args = ["--figures", str(figures), "--out", str(tmp_path / "report"), "--runs-root",
            str(tmp_path / "runs"), "--readme", str(readme)]
    assert report.main(args) == 0
    text = readme.read_text()
    assert "measured 2026-12-03 on AMD EPYC 7B13" in text and "1 of 1 decided" in text
    row = ("| deep Post-LN fails where Admin trains. Paper: Liu et al. 2020 | Boschloo's exact test | "
           "admin, 18+18: n=4; post_ln, 18+18: n=4 | admin 4/4 trained vs post_ln 0/4 trained | "
           "0.0039 (0.047) | supported |")
    assert row in text
    (figures / "atlas_checks.json").unlink()
    write_checks(figures, "fig4", "mini", [Check("sooner", "Pre-LN sooner", "1.67x", {}, "1.80x", True)], {})
    assert report.main(args) == 0  # a rerun without the atlas's file keeps its table
    assert row in readme.read_text() and readme.read_text().count(report.ATLAS_INTRO) == 1
