"""Eight visitors at once: each gets the run it asked for, exactly as if alone, and nothing one of
them runs or uploads reaches another, not even an upload that claims another
visitor's fingerprint."""
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gradio_client import Client, handle_file

from specviz.app.form import spec_from_controls
from specviz.app.serving import save
from specviz.run.runner import run
from specviz.trace.schema import Trace

# Eight small runs on the tiny pair, all different (seeds 900-907 keep them out of other tests'
# replay cache).
RUNS = [
    {"prompt_set": "quick", "method": "eqspec", "batch_size": 2, "k": 3},
    {"typed": "a\nb\nc", "method": "eqspec", "batch_size": 4, "k": 5, "max_new_tokens": 12},
    {"prompt_set": "chat", "method": "exspec", "batch_size": 2, "k": 2, "max_wait": 2},
    {"prompt_set": "lists", "method": "batched-reference", "batch_size": 3},
    {"prompt_set": "quick", "method": "reference"},
    {"prompt_set": "quick", "method": "eqspec", "faults": ["bsp-like"], "batch_size": 2, "k": 4},
    {"typed": "Hello there", "method": "hf-assisted", "batch_size": 1, "k": 3},
    {"prompt_set": "code", "method": "eqspec", "faults": ["no-mask"], "batch_size": 4, "k": 2},
]


def controls(i: int) -> dict:
    """Session i's controls by name (the rest at their defaults)."""
    return {"pair": "tiny", "dtype": "float64", "max_new_tokens": 8, "seed": 900 + i, **RUNS[i]}


def decisions(trace: Trace) -> tuple:
    """What a run decided, timings aside."""
    return (trace.manifest.spec, trace.manifest.fingerprint,
            [(s.output_ids, s.reference_ids) for s in trace.sequences],
            [(r.seq, r.round, r.emitted) for r in trace.rows])


def test_eight_simultaneous_sessions_each_get_their_own_run_and_files(app_url, tmp_path):
    n = len(RUNS)
    ran, forged, downloads, swapped = [None] * n, [None] * n, [None] * n, [None] * n
    together = threading.Barrier(n)

    def session(i: int) -> None:
        client = Client(app_url, verbose=False)  # a session of its own
        together.wait()
        ran[i] = Trace.from_json(Path(client.predict(**controls(i),
                                                     api_name="/run")[1]).read_text())
        together.wait()
        # Upload this run's trace under the next session's fingerprint, while the others do
        # the same.
        forged[i] = ran[i].model_copy(deep=True)
        forged[i].manifest.fingerprint = ran[(i + 1) % n].manifest.fingerprint
        upload = tmp_path / f"forged-{i}.json"
        upload.write_text(forged[i].to_json())
        together.wait()
        downloads[i] = client.predict(handle_file(str(upload)), api_name="/open_trace")[1]
        # Then run the next session's spec, while others still upload: it may come from the replay
        # cache, never from an upload, and its file is not the forged one of the same fingerprint.
        swapped[i] = Trace.from_json(Path(client.predict(**controls((i + 1) % n),
                                                         api_name="/run")[1]).read_text())

    with ThreadPoolExecutor(n) as pool:
        list(pool.map(session, range(n)))

    alone = [run(spec_from_controls(**controls(i))) for i in range(n)]
    assert len({t.manifest.fingerprint for t in alone}) == n  # eight different runs
    for i in range(n):
        assert decisions(ran[i]) == decisions(alone[i]), f"session {i}"
        assert Trace.from_json(Path(downloads[i]).read_text()) == forged[i], f"session {i}'s upload"
        assert decisions(swapped[i]) == decisions(alone[(i + 1) % n]), (
            f"session {i}, next session's spec")
    assert len(set(downloads)) == n


def test_saved_traces_with_one_fingerprint_never_share_a_file():
    trace = run(spec_from_controls(**controls(0)))
    # Another trace claiming the same fingerprint (a well-formed one: a trace whose parts disagree
    # is refused).
    other = trace.model_copy(
        update={"manifest": trace.manifest.model_copy(update={"device_name": "elsewhere"})})
    assert other.manifest.fingerprint == trace.manifest.fingerprint
    paths = save(trace), save(other), save(trace)
    assert paths[0] != paths[1] and paths[0] == paths[2]
    assert (Trace.from_json(Path(paths[0]).read_text()) == trace
            and Trace.from_json(Path(paths[1]).read_text()) == other)
