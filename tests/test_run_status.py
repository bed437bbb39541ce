"""lnexp.run_status: the words a run ends in, older run folders read in those words, what the atlas
counts as a failure, and the plateau rule that decides ``plateau`` (lnexp/train/divergence.py)."""

from __future__ import annotations

import json
import math

import pytest

from lnexp.run_status import ATLAS_OUTCOMES, FINAL, MEANING, STATUSES, atlas_outcome, normalise, note

OLD_PLATEAU = {"reason": "plateau: valid nll 9.07 bits >= unigram entropy 7.49 - 0.5", "update": 16,
               "epoch": 2}


@pytest.mark.parametrize(("status", "final_valid_loss", "outcome"), [
    ("done", 7.1, "trained"),
    ("stopped", 7.1, "trained"),  # an atlas cell's budget is its max_update: a run that ran it trained
    ("done", math.nan, "diverged"),  # (a non-finite last validation is a divergence whatever it says)
    ("plateau", 8.9, "plateau"),  # at the end of the cell's budget, or ended early there (stop=true)
    ("diverged", None, "diverged"),
    ("diverged", math.inf, "diverged"),
    ("failed", 7.1, "missing"),  # no result yet: the cell stays unknown
    ("interrupted", 7.1, "missing"),
    ("running", 7.1, "missing"),
    ("pending", None, "missing"),
    ("done", None, "missing"),  # no validation recorded
])
def test_the_atlas_outcome_of_each_status(status, final_valid_loss, outcome):
    assert atlas_outcome(status, final_valid_loss) == outcome


def test_every_status_has_a_meaning_and_an_atlas_outcome():
    assert set(STATUSES) == set(MEANING) and set(FINAL) < set(STATUSES)
    assert {atlas_outcome(s, 7.0) for s in STATUSES} == set(ATLAS_OUTCOMES)
    fails = {s for s in STATUSES if atlas_outcome(s, 7.0) in ("plateau", "diverged")}
    assert fails == {"plateau", "diverged"}


def test_an_old_plateau_reads_as_plateau_not_diverged():
    """status.json of an older lnexp: the plateau was "diverged" with a reason "plateau: ..."."""
    old = {"status": "diverged", "epoch": 2, "updates": 16, "diverged": OLD_PLATEAU, "stopped": False,
           "max_update_reached": False, "wall_s": 16.2}
    s = normalise(old, max_epoch=2)
    assert s["status"] == "plateau" and s["diverged"] is None and s["plateau"] == OLD_PLATEAU
    assert not s["ended_early"] and "stopped" not in s
    assert note(s) == ("plateau at 16 updates, 2/2 epochs: valid nll 9.07 bits >= unigram entropy "
                       "7.49 - 0.5")
    assert atlas_outcome(s["status"], 9.1) == "plateau"
    # ended early by divergence.stop (older "stopped": true before max_epoch, max_update not reached)
    early = normalise({**old, "epoch": 2, "stopped": True}, max_epoch=15)
    assert early["status"] == "plateau" and early["ended_early"]
    assert note(early).endswith("; divergence.stop ended it there")
    # ... but a run that max_update ended was not ended by the plateau
    assert not normalise({**old, "stopped": True, "max_update_reached": True}, 15)["ended_early"]


def test_an_old_plateau_that_the_run_left_reads_as_done():
    """Older lnexp kept the plateau seen at epoch 2 to the end; the last validation decides now."""
    old = {"status": "diverged", "epoch": 50, "updates": 400, "diverged": OLD_PLATEAU, "stopped": False,
           "max_update_reached": True}
    assert normalise(old, 100, plateau_now=True)["status"] == "plateau"
    left = normalise(old, 100, plateau_now=False)
    assert left["status"] == "stopped" and left["plateau"] is None  # max_update ended it at 50/100
    assert normalise({**old, "max_update_reached": False}, 50, plateau_now=False)["status"] == "done"


def test_an_old_nan_reads_as_diverged():
    nan = {"status": "diverged", "epoch": 1, "updates": 9, "stopped": True,
           "diverged": {"reason": "non-finite loss or gradient", "update": 10, "epoch": 1}}
    s = normalise(nan, 2)
    assert s["status"] == "diverged" and s["ended_early"] and s["plateau"] is None
    assert note(s) == "diverged at update 10, epoch 1: non-finite loss or gradient"
    # older lnexp's plateau rule also caught a NaN validation loss ("valid nll nan bits")
    caught = {**nan, "diverged": {"reason": "plateau: valid nll nan bits >= unigram entropy 7.49 - 0.5",
                                  "update": 9, "epoch": 1}}
    assert normalise(caught, 2)["status"] == "diverged"
    assert normalise(caught, 2)["diverged"]["reason"] == "non-finite validation loss"


def test_an_old_max_update_stop_reads_as_stopped():
    old = {"status": "done", "epoch": 1, "updates": 64, "diverged": None, "stopped": False,
           "max_update_reached": True}
    s = normalise(old, max_epoch=2)
    assert s["status"] == "stopped" and s["max_epoch"] == 2
    assert note({**s, "max_update": 64}) == "stopped at 64 updates, 1/2 epochs: max_update=64"
    assert normalise({**old, "epoch": 2}, max_epoch=2)["status"] == "done"  # it did reach max_epoch
    assert normalise(old)["status"] == "done"  # max_epoch unknown: as written


def test_todays_statuses_are_kept_as_written():
    for word in STATUSES:
        s = {"status": word, "epoch": 1, "updates": 3, "max_epoch": 2, "max_update": 3,
             "diverged": None, "plateau": None, "ended_early": False, "max_update_reached": True}
        assert normalise(s, 2) == s
    done = {"status": "done", "epoch": 3, "updates": 18, "max_epoch": 3,
            "left_plateau": {"update": 12, "epoch": 2}}
    assert note(done) == "left the unigram plateau at update 12, epoch 2"
    assert json.dumps(normalise(done))  # plain JSON, as status.json holds it


def test_the_plateau_rule_applies_from_its_epoch_and_update_and_judges_each_epoch():
    from lnexp.train.divergence import PlateauRule

    rule = PlateauRule(entropy_bits=7.5, plateau_epoch=2, margin_bits=0.5, min_updates=100)
    assert not rule.applies(1, 500) and not rule.applies(2, 99) and rule.applies(2, 100)
    assert rule.not_applied(2, 16) == "not applied: 16 updates < divergence.plateau_min_updates=100"
    assert rule.not_applied(1, 500) == "not applied: 1 epoch < divergence.plateau_epoch=2"  # (not "1 epochs")
    assert rule.not_applied(3, 400) is None
    on = rule.verdict({"valid_nll_loss": 7.2, "updates": 120, "epoch": 2})
    assert on == {"reason": "valid nll 7.20 bits >= unigram entropy 7.50 - 0.5", "update": 120,
                  "epoch": 2}
    assert rule.verdict({"valid_nll_loss": 6.9, "updates": 240, "epoch": 3}) is None
