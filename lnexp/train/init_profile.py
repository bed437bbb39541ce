"""A scheme's profiling pass at initialisation (its YAML's ``init.profile``; Admin's residual gains),
run once, on a fresh run: a resumed run reads the values back from its checkpoint."""

from __future__ import annotations

from typing import Any

from lnexp import fairseq_adapter as fa
from lnexp.scheme import placement_of


def profile_fresh_run(fcfg, task, trainer, master: bool) -> dict[str, Any] | None:
    """Profile the model on the first training batch and set what the pass sets; returns the
    record for run.json ({"profile": name, "omega": {stack: [values]}}), None for a scheme without
    a pass. Rank 0 profiles and broadcasts the values, so that every rank starts alike."""
    from lnexp.model.admin import profile_init, set_gains

    if placement_of(fcfg.model).init.profile is None:
        return None
    model = trainer.get_model()
    record = None
    if master:
        sample = fa.first_train_batch(fcfg, task, model)
        sample = fa.move_to(sample, "cuda" if trainer.device.type == "cuda" else "cpu")
        record = profile_init(model, sample["net_input"], int(fcfg.common.seed))
    record = fa.broadcast_from_master(record)
    set_gains(model, record["omega"])
    return record
