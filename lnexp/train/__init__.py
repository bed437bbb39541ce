"""Training: Hydra config -> fairseq settings, the run loop, per-epoch metrics, divergence."""
