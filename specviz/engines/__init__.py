"""Engines under the microscope: anything that turns prompt ids into output ids.

An adapter (a JSONL file, an OpenAI-compatible server, a Python callable)
yields one `EngineRun`: per prompt the output ids and, where the engine gives
them, its log-probabilities; and the engine's name, version and speculative
settings as it reports them. specviz supplies the batch-size-1 reference of
the same target weights and judges every difference from the outside.
May import: spec, models, trace.
"""
