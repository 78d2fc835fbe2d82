"""The built-in checkpoints, written locally with hand-set weights, and how a cell's model is resolved."""
