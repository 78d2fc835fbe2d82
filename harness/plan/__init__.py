"""Planning a run: which cells, on which platform and versions, with which engine arguments and faults."""
