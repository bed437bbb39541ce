"""Paper figures, one module per figure, one plot style."""
