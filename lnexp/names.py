"""The choices of each axis of the study, importable without torch or fairseq."""

PLACEMENTS = ("post_ln", "pre_ln", "peri_ln", "deepnorm")
NORMS = ("layernorm", "rmsnorm")
SCHEDULES = ("inverse_sqrt", "constant", "step", "linear")
PRECISIONS = ("fp32", "bf16", "fp16")
