"""Launch the specviz page: `python app.py` (embedded default model, CPU or GPU).

Operator settings come from SPECVIZ_* environment variables (docs/deploy.md).
"""
import specviz.run.gpu  # noqa: F401  first: ZeroGPU needs `spaces` imported before CUDA starts
from specviz.app.page import serve
from specviz.decoding import determinism
from specviz.run.settings import Settings

if __name__ == "__main__":
    settings = Settings.from_env()
    if settings.deterministic:
        determinism.enable()
    serve(settings, server_name="0.0.0.0")
