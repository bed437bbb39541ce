"""After training: test-set BLEU of a run (``lnexp evaluate``) and translation (``lnexp translate``).

At the results level: it reads runs and uses training-level pieces (the BLEU scorer, the data
pipeline, the fairseq adapter); nothing below imports it. Where it writes its records is
``lnexp.results``'s (``record_dir``), which ``lnexp results`` reads without torch.
"""
