"""The evidence and the verdicts, measured apart from what they judge: taps on the models and the
watch on every round (measuring), independent recomputation, the yardsticks (rounding, an engine's
own), the judges of our runs (whitebox.py; a sampled one's, sampledrun.py), of engines from outside
(blackbox.py) and of the replays that name an engine's bug (attribution.py), and a sampled run's
distribution. Each judge returns its findings (trace/findings.py) and never edits the trace it
judges.
May import: spec, models, trace, decoding (its cache and sampling helpers; never its engines)."""
