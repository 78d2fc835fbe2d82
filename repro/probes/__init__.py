"""Stand-alone probes of upstream bugs that no harness tier expresses yet (docs/upstream-bugs.md)."""
