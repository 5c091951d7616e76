import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # every test runs offline, as on CI
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402

from specviz.engines.vllm import vllm_python, vllm_server  # noqa: E402
from specviz.models import load_pair  # noqa: E402
from specviz.prompts import builtin_set  # noqa: E402
from specviz.spec import TINY_DRAFT, TINY_TARGET, SpecError  # noqa: E402


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
def vllm(request, tmp_path_factory):
    """A real vLLM server on the embedded target, in the mode its test asks for (indirect parametrization:
    none, ngram or draft; see specviz/engines/vllm.py). Session scope: pytest runs the tests of one mode
    together, so each mode starts once (about 75-150 s here), one server at a time."""
    try:
        vllm_python()
    except SpecError as e:
        if os.environ.get("CI"):  # `make test` installs it: on CI its absence is a failure
            raise
        pytest.skip(str(e))
    with vllm_server(request.param, tmp_path_factory.mktemp("vllm") / f"{request.param}.log") as server:
        yield server
