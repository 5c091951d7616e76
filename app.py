"""Launch the specviz page: `python app.py` (embedded default model, CPU or GPU)."""
from specviz.ui import build, launch

if __name__ == "__main__":
    launch(build(), server_name="0.0.0.0")
