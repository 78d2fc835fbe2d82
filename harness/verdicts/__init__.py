"""What runs mean: results files, the known-bug table, workaround verdicts, reports, compare, history."""
