import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # every test runs offline, as on CI
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402

from specviz.engines.vllm import vllm_python, vllm_server  # noqa: E402
from specviz.models import load_pair  # noqa: E402
from specviz.prompts import builtin_set  # noqa: E402
from specviz.spec import TINY_DRAFT, TINY_TARGET  # noqa: E402


@pytest.fixture(scope="session")
def tiny():
    """The tiny random pair in float64: equality with the reference is exact, always."""
    return load_pair(TINY_TARGET, TINY_DRAFT, dtype="float64", device="cpu")


@pytest.fixture(scope="session")
def embedded():
    """The embedded SmolLM2-135M-Instruct pair in float32."""
    return load_pair(dtype="float32", device="cpu")


@pytest.fixture(scope="session")
def mixed_prompts(tiny):
    """Prompt ids of very different lengths: a 1-token prompt, short chats, a ~330-token passage."""
    ids = tiny.encode(builtin_set("all"))
    ids.insert(2, tiny.encode(["Hi"], chat_template=False)[0])
    return ids


@pytest.fixture(scope="session")
def app_url():
    """The page, served in this process as `python app.py` serves it."""
    import socket

    from specviz.ui import serve

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    demo = serve(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    yield f"http://127.0.0.1:{port}/"
    demo.close()


@pytest.fixture(scope="session")
def hostile(tiny):
    """A real tiny-pair trace with sync-bug divergences (so every view has content), and a script-carrying
    payload in every string field its schema accepts one in (tests/hostile.py)."""
    from hostile import hostile_trace

    from specviz.runner import run
    from specviz.spec import RunSpec

    spec = RunSpec.build(target=TINY_TARGET, draft=TINY_DRAFT, dtype="float64", device="cpu", faults=("bsp-like",),
                         prompts=("Hi!", "Name three rivers.", "Write a long story about a dragon."), batch_size=3,
                         k=3, max_new_tokens=12)
    return hostile_trace(run(spec))


CJK_PROMPT = "日本の首都はどこですか？日本語で答えてください。"
EMOJI_PROMPT = "Reply with three emoji only: 🙂🎉🚀 and say why."
FLAGS_PROMPT = "Name the country of each flag in one word: " + "🇫🇷🇯🇵🇧🇷🇮🇳🇰🇷🇩🇪🇮🇹🇪🇸🇲🇽🇨🇦"


@pytest.fixture(scope="session")
def cjk_emoji(embedded):
    """The embedded pair on a CJK, an emoji and a flags prompt, with bsp-like faults so that they fork: its
    tokenizer splits many of these characters over 2–4 tokens."""
    from specviz.runner import run
    from specviz.spec import RunSpec

    return run(RunSpec.build(prompts=(CJK_PROMPT, EMOJI_PROMPT, FLAGS_PROMPT), faults=("bsp-like",), batch_size=3,
                             k=3, max_new_tokens=24, device="cpu"))


@pytest.fixture(scope="session")
def vllm(request, tmp_path_factory):
    """A real vLLM server on the embedded target, in the mode its test asks for (indirect parametrization:
    none, ngram or draft; see specviz/engines/vllm.py). Session scope: pytest runs the tests of one mode
    together, so each mode starts once (about 75-150 s here), one server at a time. Without `make vllm`
    (which `make test` runs) it fails, saying so: these tests are part of the suite."""
    vllm_python()
    with vllm_server(request.param, tmp_path_factory.mktemp("vllm") / f"{request.param}.log") as server:
        yield server
