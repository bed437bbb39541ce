"""What a training process does on its host besides training: share the cores (``sharing``), hold
its run folder's lock (``runlock``) and print where runs and sweeps are (``progress``)."""
