"""Our engine: reference decoding, eqspec and exspec, one speculative round, the drafters, faults as
policies, sampling, the KV cache (kvcache.py is the only toucher of its internals), and a decode
recorded as a trace. May import: spec, models, trace."""
