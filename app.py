"""Launch the specviz page: `python app.py` (embedded default model, CPU or GPU)."""
from specviz.ui import build

if __name__ == "__main__":
    build().queue(default_concurrency_limit=1).launch(server_name="0.0.0.0")
