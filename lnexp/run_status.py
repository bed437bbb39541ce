"""What a run's status.json says happened, in the one set of words every reader uses, and what the
atlas makes of each word.

A run ends ``done`` (max_epoch reached), ``stopped`` (max_update reached before max_epoch),
``plateau`` (its last validation predicts no better than word frequencies, by the plateau rule of
lnexp/train/divergence.py; or the rule stopped it there, ``divergence.stop``), ``diverged`` (a
NaN/inf loss, gradient or validation loss), ``interrupted`` (Ctrl-C, SIGTERM, or its process gone)
or ``failed`` (an error); ``running`` while it trains, ``pending`` (``lnexp results`` only)
before it has a status and ``damaged`` (``lnexp results`` only) when status.json cannot be read.
docs/configuration.md "How a run ends" has the same table.

Older lnexp wrote ``diverged`` for a plateau too (reason ``plateau: ...``), kept it once the run
left the plateau, and wrote ``done`` for a run that max_update stopped; ``normalise`` reads those
folders in today's words. Torch-free and below the atlas, so that ``lnexp results``, the training
loop and the figures agree.
"""

from __future__ import annotations

import math
from typing import Any

from lnexp.plural import count

# status -> what it means (the order of lnexp results' counts)
MEANING = {
    "done": "trained to max_epoch",
    "stopped": "max_update reached before max_epoch: a shorter run than the configuration's",
    "plateau": "ended (or stopped early, divergence.stop) on the unigram plateau",
    "diverged": "NaN/inf loss, gradient or validation loss; the run stops there",
    "failed": "an error stopped it (the reason is in status.json)",
    "running": "training now",
    "interrupted": "Ctrl-C, SIGTERM or its process gone; the same command resumes it",
    "pending": "no status yet (lnexp results only)",
    "damaged": "status.json is not readable JSON (lnexp results only): the same lnexp train command "
               "resumes the run from its last checkpoint and writes it again",
}
STATUSES = tuple(MEANING)
FINAL = ("done", "stopped", "plateau", "diverged")  # ended by itself: the folder holds a result
ATLAS_OUTCOMES = ("trained", "plateau", "diverged", "missing")
NON_FINITE = "non-finite"  # the start of a divergence's reason (NaN/inf)


def normalise(status: dict[str, Any], max_epoch: int | None = None,
              plateau_now: bool | None = None) -> dict[str, Any]:
    """``status`` (a status.json, as ``rundir.effective_status`` reads it) in today's words: a
    plateau is ``plateau`` with its own ``plateau`` record (``diverged`` holds NaN/inf only), a run
    that max_update stopped before ``max_epoch`` (the run's config) is ``stopped``, and
    ``ended_early`` says whether a divergence or the plateau rule ended it before its length.

    ``plateau_now``: whether the run's last validation is on the plateau by its own rule, for folders
    of older lnexp that kept a plateau seen earlier (None: keep what the folder says)."""
    out = dict(status)
    word = out.get("status")
    div = out.get("diverged") or None
    if "ended_early" not in out:  # older lnexp: "stopped" meant diverged before max_epoch
        out["ended_early"] = bool(out.pop("stopped", False)) and word == "diverged" \
            and not out.get("max_update_reached")
    if word == "diverged" and div and str(div.get("reason", "")).startswith("plateau"):
        if not math.isfinite(_plateau_nll(div)):  # older lnexp's plateau rule caught a NaN loss
            out["diverged"] = {**div, "reason": f"{NON_FINITE} validation loss"}
        else:
            out.update(status="plateau", diverged=None, plateau=div)
            if plateau_now is False and not out["ended_early"]:  # it left the plateau later
                out.update(status="done", plateau=None)
                word = "done"
    if word == "done" and out.get("max_update_reached") and max_epoch is not None \
            and int(out.get("epoch") or 0) < int(max_epoch) and "max_epoch" not in status:
        out["status"] = "stopped"  # older lnexp called a max_update stop done
    out.setdefault("plateau", None)
    if max_epoch is not None:
        out.setdefault("max_epoch", int(max_epoch))
    return out


def _plateau_nll(div: dict[str, Any]) -> float:
    """The valid nll in older lnexp's reason ``plateau: valid nll 9.07 bits >= ...``."""
    try:
        return float(str(div["reason"]).split("valid nll", 1)[1].split()[0])
    except (IndexError, ValueError):
        return 0.0  # a reason without the number: a plateau


def note(status: dict[str, Any]) -> str:
    """What happened, in a few words, for a normalised status: ``stopped at 64 updates, 1/2
    epochs`` ('' for a plain ``done`` and while it runs)."""
    word, n = status.get("status"), status.get("updates")
    epochs = f"{status.get('epoch', 0)}/{status.get('max_epoch', '?')} epochs"
    left = status.get("left_plateau")
    left = f"left the unigram plateau at update {left['update']}, epoch {left['epoch']}" if left else ""
    if word == "stopped":
        return "; ".join(x for x in (f"stopped at {count(n, 'update')}, {epochs}: max_update="
                                     f"{status.get('max_update', n)}", left) if x)
    if word == "plateau":
        p = status.get("plateau") or {}
        early = "; divergence.stop ended it there" if status.get("ended_early") else ""
        reason = str(p.get("reason", "")).removeprefix("plateau: ")
        return f"plateau at {count(n, 'update')}, {epochs}: {reason}{early}"
    if word == "diverged":
        d = status.get("diverged") or {}
        return f"diverged at update {d.get('update', n)}, epoch {d.get('epoch', '?')}: {d.get('reason', '')}"
    if word == "interrupted" and status.get("resumes_from") is not None:
        return f"interrupted at {count(n, 'update')}; resumes from update {status['resumes_from']}"
    if word == "damaged":
        return MEANING["damaged"]
    if word == "done" and status.get("plateau_rule"):
        return f"plateau rule {status['plateau_rule']}"
    return left if word == "done" else ""


def atlas_outcome(status: str, final_valid_loss: float | None) -> str:
    """What an atlas cell counts a run as: ``trained``, ``plateau`` or ``diverged`` (both fail the
    cell), or ``missing`` (no result yet). ``status``: the run's normalised status;
    ``final_valid_loss``: its last validation loss, None without one.

    A run that ran its length is ``trained`` whether max_epoch or max_update ended it (an atlas
    cell's budget is its max_update), unless its last validation is not finite. A plateau fails the
    cell, at the end of the cell's budget or where divergence.stop ended it early to save the
    budget. A run that failed, was interrupted or still runs has no outcome yet."""
    if status == "diverged":
        return "diverged"
    if status == "plateau":
        return "plateau"
    if status in ("done", "stopped") and final_valid_loss is not None:
        return "trained" if math.isfinite(final_valid_loss) else "diverged"
    return "missing"
