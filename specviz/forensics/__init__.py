"""The evidence and the verdicts, measured apart from what they judge: taps on the models and the watch on
every round (measuring), independent recomputation, the yardsticks (rounding, an engine's own), the judges of
our runs (whitebox.py) and of engines from outside (blackbox.py), and a sampled run's distribution.
May import: spec, models, trace, decoding (its cache and sampling helpers; never its engines)."""
