"""The page: the Gradio layout and its handlers (page.py, pagetext.py, controls.py, form.py,
runview.py, sweeptab.py), which read traces and reach decoding, shrinking and engine checks only
through the serving layer (serving.py); the views and plots, drawn from a trace alone (no torch).
The only package that imports gradio."""
