"""Console and text logs: a state machine (`machine.py`) and one module per console dialect."""
