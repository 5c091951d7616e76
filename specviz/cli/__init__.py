"""The command line: run, verify, bench, check, shrink, schema. May import every layer below."""
