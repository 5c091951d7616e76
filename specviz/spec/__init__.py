"""What a run is: RunSpec, the method and fault catalogues, prompts, and input from strangers.

Plain data. Imports nothing of specviz outside this package, and no torch (import-linter)."""
