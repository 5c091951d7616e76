"""The app serves, and its named API runs a decode whose ids equal the reference."""
import socket

import pytest
from gradio_client import Client

from specviz.ui import build


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def client():
    demo = build()
    port = _free_port()
    demo.queue(default_concurrency_limit=1).launch(server_name="127.0.0.1", server_port=port,
                                                   prevent_thread_lock=True, quiet=True)
    yield Client(f"http://127.0.0.1:{port}/", verbose=False)
    demo.close()


def test_run_api_equals_reference(client, tiny):
    status, table = client.predict("tiny", "quick", "", "eqspec", [], 2, 3, 8, "float64", api_name="/run")
    assert "100% of sequences equal the batch-size-1 reference" in status
    assert len(table["data"]) == 4 and all(row[4] == "yes" for row in table["data"])


def test_bad_input_gets_a_message_and_the_server_keeps_serving(client, tiny):
    with pytest.raises(Exception, match="faults apply to speculative methods"):
        client.predict("tiny", "quick", "", "reference", ["no-mask"], 2, 3, 8, "float64", api_name="/run")
    status, _ = client.predict("tiny", "quick", "Hello", "reference", [], 1, 3, 4, "float64", api_name="/run")
    assert "reference" in status
