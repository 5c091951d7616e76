"""specviz: batch speculative decoding under the microscope.

The packages are layers, each importing only those below it (checked by import-linter,
pyproject.toml):

    cli | app        the command line; the page (only app imports gradio)
    run              a RunSpec to a Trace: decode, check an engine, shrink, shard, bench;
                     operator settings
    forensics        the evidence and the verdicts, recomputed apart from what they judge
    decoding | engines   our engine (its cache, its faults, its recording) | the engines under test
    models | trace   draft/target pairs | the trace: the one contract, torch-free
    spec             what a run is, and input from strangers: plain data, torch-free
"""
