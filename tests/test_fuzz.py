"""Seeded fuzzing of what strangers send: 10,000 malformed share links and 1,000 malformed trace
files, each must get our message or a rendered page, through the handlers the server calls and
through the server. benchmarks/fuzz.py times the same inputs."""
import random

import gradio as gr
import pytest
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError
from hostile import (malformed_link, malformed_links, malformed_trace, malformed_traces,
                     real_link_and_trace)

from specviz.app import runview as ui

SEED = 12  # benchmarks/fuzz.py times the same inputs
LINKS, TRACES = 10_000, 1000
SERVED_LINKS, SERVED_TRACES = 300, 50


@pytest.fixture(scope="module")
def real(tiny) -> tuple[str, str]:
    return real_link_and_trace()


def test_every_malformed_link_gets_our_message_or_opens(real):
    refused = 0
    for query in malformed_links(SEED, LINKS, real[0]):
        status = ui.open_link(query)["status"]  # any exception but our message fails the test
        assert status == "Replaying the shared run…" or status.startswith(
            ("**You are looking at a real case", "**That share link could not be used"))
        refused += "could not be used" in status
    assert refused > 0.8 * LINKS


def test_every_malformed_trace_gets_our_message_or_renders(real, tmp_path):
    path = tmp_path / "upload.json"
    refused = rendered = 0
    for data in malformed_traces(SEED, TRACES, real[1]):
        path.write_bytes(data)
        try:
            trace = ui.open_trace(str(path))[0]
        except gr.Error as e:
            assert e.message.startswith("upload.json: ")  # our SpecError, named after the file
            refused += 1
            continue
        views = ui.render(trace)
        assert (tuple(views) == ui.VIEW_NAMES
                and views["timeline"].startswith('<div class="sv-timeline"'))
        rendered += 1
    assert refused > 0.7 * TRACES and rendered > 0


def test_the_server_turns_a_sample_away_and_keeps_serving(real, app_url, tmp_path):
    client = Client(app_url, verbose=False)
    rng = random.Random(SEED)
    sample = rng.sample(range(LINKS), SERVED_LINKS)
    # 8 at a time: within the queue's 16 places, and quicker than one
    for start in range(0, SERVED_LINKS, 8):
        jobs = [client.submit(malformed_link(SEED, i, real[0]), api_name="/open_link")
                for i in sample[start: start + 8]]
        for job in jobs:
            status = job.result()[-1]
            assert (status.startswith(("Replaying the shared run…", "**You are looking at"))
                    or "could not be used" in status)
    path = tmp_path / "upload.json"
    for i in rng.sample(range(TRACES), SERVED_TRACES):
        path.write_bytes(malformed_trace(SEED, i, real[1]))
        try:
            client.predict(handle_file(str(path)), api_name="/open_trace")
        except AppError as e:
            assert str(e).startswith("upload.json: ")
            continue
        client.predict(None, None, api_name="/focus_seq")  # the views, rendered by the server
    status = client.predict(real[0], api_name="/open_link")[-1]  # still serving
    assert status == "Replaying the shared run…"
    path.write_text(real[1])
    assert "opened from a file" in client.predict(handle_file(str(path)), api_name="/open_trace")[0]
