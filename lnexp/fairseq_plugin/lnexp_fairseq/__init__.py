"""fairseq ``--user-dir`` plugin: registers what an lnexp checkpoint names, for stock fairseq tools.

* the model ``ln_transformer`` and its architectures (lnexp.model);
* the optimizer ``radam`` and the ``lnexp`` learning-rate schedule (lnexp.optim), which the
  checkpoint's saved config names;
* the classes fairseq's checkpoints hold (OmegaConf nodes, argparse.Namespace) on torch's
  ``weights_only`` allow-list, so ``torch.load`` keeps its safety check on.
"""

import sys
from pathlib import Path

try:
    import lnexp  # noqa: F401
except ImportError:  # a source checkout that is not installed: the repository root
    sys.path.append(str(Path(__file__).resolve().parents[3]))

import lnexp.model  # noqa: E402,F401  (registers ln_transformer)
import lnexp.optim  # noqa: E402,F401  (registers radam and the lnexp schedule)
from lnexp.fairseq_adapter import allow_fairseq_checkpoint_globals  # noqa: E402

allow_fairseq_checkpoint_globals()
