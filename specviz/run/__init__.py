"""A RunSpec to a Trace: decode beside the reference and explain (runner.py), check an engine
(check.py), shrink a divergence, shard a sweep, bench; the operator's settings. May import every
layer below."""
