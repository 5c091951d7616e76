import contextlib
import ctypes
import ctypes.util
import gc
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # every test runs offline, as on CI
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# every pair the suite uses stays loaded, with its references and yardsticks
os.environ.setdefault("SPECVIZ_MAX_PAIRS", "12")

import psutil  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from specviz.engines.vllm import vllm_python, vllm_server  # noqa: E402
from specviz.forensics import yardstick_cache  # noqa: E402
from specviz.models.pairs import load_pair, unload_pairs  # noqa: E402
from specviz.spec.prompts import builtin_set  # noqa: E402
from specviz.spec.run import TINY_DRAFT, TINY_TARGET  # noqa: E402

# `make test` runs two workers on two cores: one torch thread each, and one thread for each engine
# server a worker starts. An engine's threads meet at a barrier after every operation, spinning:
# with the other worker on one of their cores, each barrier waits for a thread that is not running
# (llama.cpp took 15x longer so).
ENGINE_THREADS = 1 if os.environ.get("PYTEST_XDIST_WORKER") else 2
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)


# One worker's share of the CI machine's 24 GiB, beside the other worker and a vLLM server: an
# audited run of the embedded pair holds about 4 GiB (the pair, its packed weights, its float64
# copy), and a worker that has loaded it in three dtypes holds three times that.
MEMORY_LIMIT = 6 * 2**30


@pytest.fixture(autouse=True, scope="module")
def _bounded_memory():
    """After each test file: a worker past its share of memory lets go of the pairs it loaded, and
    so of all that was computed from them (the next file to ask for one loads it again), and hands
    the freed heap back to the system (glibc keeps it otherwise: the worker's size stays)."""
    yield
    if psutil.Process().memory_info().rss > MEMORY_LIMIT:
        unload_pairs()
        gc.collect()
        ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim(0)


@pytest.fixture(autouse=True, scope="session")
def _session_yardsticks(tmp_path_factory):
    """The session's fixtures keep the yardsticks they measure in a folder of the session's own,
    never the user's cache."""
    with pytest.MonkeyPatch.context() as patch:
        folder = tmp_path_factory.mktemp("yardsticks")
        patch.setattr(yardstick_cache, "directory", lambda: folder)
        yield


@pytest.fixture(autouse=True)
def _own_yardsticks(tmp_path_factory, monkeypatch):
    """Each test keeps the yardsticks it measures on disk in a folder of its own: one that plants a
    bug in the model's numerics measures it, never reading what another test measured without it (in
    memory, the runner's caches are shared as before; tests/test_yardstick_cache.py tests reuse)."""
    folder = tmp_path_factory.mktemp("yardsticks")
    monkeypatch.setattr(yardstick_cache, "directory", lambda: folder)


# The pairs' fixtures are per test file: a worker that lets go of its pairs after a file
# (`_bounded_memory`) must hold no other reference to them, or the next file loads a second copy
# (the embedded pair and its float64 copy pin about 4 GiB) and every later file reloads.
@pytest.fixture(scope="module")
def tiny():
    """The tiny random pair in float64: equality with the reference is exact, always."""
    return load_pair(TINY_TARGET, TINY_DRAFT, dtype="float64", device="cpu")


@pytest.fixture(scope="module")
def embedded():
    """The embedded SmolLM2-135M-Instruct pair in float32."""
    return load_pair(dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def mixed_prompts(tiny):
    """Prompt ids of very different lengths: a 1-token prompt, short chats, a ~330-token passage."""
    ids = tiny.encode(builtin_set("all"))
    ids.insert(2, tiny.encode(["Hi"], chat_template=False)[0])
    return ids


@pytest.fixture(scope="session")
def app_url():
    """The page, served in this process as `python app.py` serves it."""
    import socket

    from specviz.app.page import serve

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    demo = serve(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    yield f"http://127.0.0.1:{port}/"
    demo.close()


@pytest.fixture(scope="session")
def hostile():
    """A real tiny-pair trace with sync-bug divergences (so every view has content), and a
    script-carrying payload in every string field its schema accepts one in (tests/hostile.py)."""
    from hostile import hostile_trace

    from specviz.run.runner import run
    from specviz.spec.run import RunSpec

    spec = RunSpec.build(target=TINY_TARGET, draft=TINY_DRAFT, dtype="float64", device="cpu",
                         faults=("bsp-like",),
                         prompts=("Hi!", "Name three rivers.",
                                  "Write a long story about a dragon."),
                         batch_size=3, k=3, max_new_tokens=12)
    return hostile_trace(run(spec))


CJK_PROMPT = "日本の首都はどこですか？日本語で答えてください。"
EMOJI_PROMPT = "Reply with three emoji only: 🙂🎉🚀 and say why."
FLAGS_PROMPT = "Name the country of each flag in one word: " + "🇫🇷🇯🇵🇧🇷🇮🇳🇰🇷🇩🇪🇮🇹🇪🇸🇲🇽🇨🇦"


@pytest.fixture(scope="session")
def cjk_emoji():
    """The embedded pair on a CJK, an emoji and a flags prompt, with bsp-like faults so that they
    fork: its tokenizer splits many of these characters over 2–4 tokens."""
    from specviz.run.runner import run
    from specviz.spec.run import RunSpec

    return run(RunSpec.build(prompts=(CJK_PROMPT, EMOJI_PROMPT, FLAGS_PROMPT), faults=("bsp-like",),
                             batch_size=3, k=3, max_new_tokens=24, device="cpu"))


class VllmServers:
    """Real vLLM servers on the embedded target, at most one up at a time: two would share this
    machine's two cores (and vLLM's CPU build binds its workers to them). Asking for another mode or
    dtype stops the one up."""

    def __init__(self, logs):
        self.logs, self.up, self.stack, self.server = logs, None, None, None

    def serve(self, mode: str, dtype: str = "float32"):
        if self.up != (mode, dtype):
            self.close()
            self.stack = contextlib.ExitStack()
            self.server = self.stack.enter_context(vllm_server(
                mode, self.logs / f"{mode}-{dtype}.log", dtype=dtype, eager=True,
                threads=ENGINE_THREADS))
            self.up = (mode, dtype)
        return self.server

    def close(self) -> None:
        if self.stack is not None:
            self.stack.close()
        self.up, self.stack, self.server = None, None, None


@pytest.fixture(scope="module")
def vllm_servers(tmp_path_factory):
    """Without `make vllm` (which `make test` runs) the first test to ask fails, saying so: these
    tests are part of the suite. The server stops with its file: an idle one holds about 3 GiB,
    which the other worker's files need (the CI machine ran out of memory with one left up)."""
    vllm_python()
    servers = VllmServers(tmp_path_factory.mktemp("vllm"))
    yield servers
    servers.close()


class Served:
    """One mode's float32 server, (re)started whenever a test reaches for its url, model
    or launch."""

    def __init__(self, servers: VllmServers, mode: str):
        self.servers, self.mode = servers, mode

    def __getattr__(self, name: str):
        return getattr(self.servers.serve(self.mode), name)


@pytest.fixture(scope="module")
def vllm(request, vllm_servers):
    """A real vLLM server on the embedded target in float32, in the mode its test asks for (indirect
    parametrization: none, ngram or draft; see specviz/engines/vllm.py). pytest runs the tests of
    one mode together, so each mode starts about once (75-150 s here)."""
    return Served(vllm_servers, request.param)


def attribute_every_fork(trace, spec, pair, ids, settings: dict, batch: int, label: str,
                         rows: int | None = None):
    """A correct engine's forks, every one attributed on purpose (its rounding's too; with `rows`,
    those among its first `rows` sequences): none may be named. Prints what was measured, the
    threshold's false-attribution count on this engine, for docs/engines.md."""
    from specviz.run import attribution

    seqs = [s for s in attribution.forks_to_attribute(trace, every_fork=True)
            if rows is None or s < rows]
    replaying = attribution.Replaying(spec, pair, ids, settings, batch)
    attribution.attribute(trace, replaying, seqs).record(trace)
    found = [trace.sequences[seq].attribution for seq in seqs]
    closest = max((a.hypotheses[0].beyond for a in found if a.hypotheses), default=0)
    longest = max((h.explained for a in found for h in a.hypotheses), default=0)
    named = [a.explanation for a in found if any(h.named for h in a.hypotheses)]
    print(f"\n{label}: {len(found)} forks attributed, {len(named)} named; the closest hypothesis "
          f"wrote {closest} departing token(s) (the longest replay {longest} tokens after a fork); "
          f"{sum(a.replays for a in found)} replays, {sum(a.seconds for a in found):.0f} s; per "
          "fork (departing, the correct replay's, the best hypothesis's): " + ", ".join(
              f"({len(a.departing)}, {a.correct.beyond}, "
              f"{a.hypotheses[0].beyond if a.hypotheses else 0})"
              for a in found))
    return found, named
