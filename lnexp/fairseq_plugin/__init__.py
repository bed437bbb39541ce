"""The ``--user-dir`` that lets stock fairseq tools load lnexp checkpoints.

    fairseq-generate DATA --user-dir $(python -c 'import lnexp.fairseq_plugin as p; print(p.USER_DIR)') \\
        --path RUN/checkpoints/checkpoint_best.pt --gen-subset test --beam 5 --lenpen 1.2

fairseq imports ``--user-dir`` by putting its parent folder on ``sys.path``: the user dir is
``lnexp_fairseq/`` one level down, so that only that name (not lnexp's own modules) becomes
importable at the top level.
"""

from pathlib import Path

USER_DIR = Path(__file__).resolve().parent / "lnexp_fairseq"
