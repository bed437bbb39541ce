"""The zoo atlas: which cells of scheme x lr x warm-up x depth x seed to train (plan) and the
``lnexp atlas`` driver that trains them in rounds within a time budget (driver)."""
