"""Launch the specviz page: `python app.py` (embedded default model, CPU or GPU).

Operator settings come from SPECVIZ_* environment variables (docs/deploy.md).
"""
import specviz.gpu  # noqa: F401  first: ZeroGPU needs `spaces` imported before CUDA starts
from specviz import determinism
from specviz.settings import Settings
from specviz.ui import serve

if __name__ == "__main__":
    settings = Settings.from_env()
    if settings.deterministic:
        determinism.enable()
    serve(settings, server_name="0.0.0.0")
