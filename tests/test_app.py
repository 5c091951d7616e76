"""The app's named API: the default example's trace equals the reference; bad links and trace files
get clear messages while the server keeps serving."""
import json
from pathlib import Path

import pytest
from gradio_client import Client
from hostile import markdown_text

from specviz.app import summary, views
from specviz.spec.run import RunSpec
from specviz.trace import share
from specviz.trace.schema import MAX_TRACE_BYTES, Trace

TINY_RUN = {"pair": "tiny", "target": "", "draft": "", "prompt_set": "quick", "typed": "",
            "prompt_file": None, "method": "eqspec", "faults": [], "batch_size": 2, "k": 3,
            "max_new_tokens": 8, "dtype": "float64", "seed": 0, "window": 0, "max_wait": 4}


@pytest.fixture(scope="module")
def client(app_url):
    return Client(app_url, verbose=False)


def test_default_example_through_the_named_api_equals_the_reference(client, embedded):
    from specviz.app.form import DEFAULTS

    controls = client.predict(api_name="/example_clean")  # fills the controls as the button does
    _, trace_file = client.predict(**dict(zip(DEFAULTS, controls)), prompt_file=None,
                                   api_name="/run")
    trace = Trace.from_json(Path(trace_file).read_text())
    assert (trace.manifest.spec.target == "specviz:smollm2-135m"
            and trace.manifest.spec.method == "eqspec")
    assert [p.ids for p in trace.prompts] == embedded.encode(trace.manifest.spec.prompts)
    for s in trace.sequences:
        assert s.reference_ids and s.output_ids == s.reference_ids


def test_bad_input_gets_a_message_and_the_server_keeps_serving(client, tiny):
    bad = {**TINY_RUN, "method": "reference", "faults": ["no-mask"]}
    with pytest.raises(Exception, match="faults apply to eqspec, not reference"):
        client.predict(**bad, api_name="/run")
    typed = {**TINY_RUN, "typed": '{"turns": ["broken'}
    with pytest.raises(Exception, match="typed prompts, line 1"):
        client.predict(**typed, api_name="/run")
    status, _ = client.predict(**TINY_RUN, api_name="/run")
    assert "100% of sequences equal the batch-size-1 reference" in status


def _link(**spec_changes) -> str:
    spec = RunSpec.build(target="specviz:tiny", draft="specviz:tiny-draft", prompts=("Hi!",),
                         dtype="float64")
    return share.encode_link(share.Link(spec.model_copy(update=spec_changes), seq=0, round=1,
                                        fingerprint="f" * 16))


@pytest.mark.parametrize("query, message", [
    (_link()[:40], "damaged"),
    ("?run=@@@@", "damaged"),
    (_link().replace("seq=0", "seq=zero"), "seq must be a whole number"),
    ("?run=" + "A" * 20_000, "characters long"),
])
def test_malformed_share_links_get_a_message_and_the_default_page(client, query, message):
    status = markdown_text(client.predict(query, api_name="/open_link")[-1])
    assert "could not be used" in status and message in status
    status_ok = client.predict(_link(), api_name="/open_link")[-1]
    assert "Replaying" in status_ok


def test_an_out_of_limits_link_names_the_limit(client):
    import base64
    import zlib

    spec = {**json.loads(RunSpec.build(prompts=("Hi",)).canonical_json()), "batch_size": 10_000}
    run = base64.urlsafe_b64encode(zlib.compress(json.dumps({"spec": spec}).encode())).decode()
    status = markdown_text(client.predict("?run=" + run, api_name="/open_link")[-1])
    assert "could not be used" in status and "batch_size" in status


def _upload(client, tmp_path, name: str, content: bytes):
    from gradio_client import handle_file

    path = tmp_path / name
    path.write_bytes(content)
    return client.predict(handle_file(str(path)), api_name="/open_trace")


@pytest.fixture(scope="module")
def good_trace(client) -> bytes:
    _, trace_file = client.predict(**TINY_RUN, api_name="/run")
    return Path(trace_file).read_bytes()


def test_a_trace_file_opens_without_a_model(client, tmp_path, good_trace):
    status, _ = _upload(client, tmp_path, "good.json", good_trace)
    assert "opened from a file" in status


@pytest.mark.parametrize("mangle, message", [
    (lambda t: t[: len(t) // 2], "invalid JSON"),  # truncated
    (lambda t: json.dumps({**json.loads(t), "schema_version": 99}).encode(), "schema version 1"),
    (lambda t: json.dumps({**json.loads(t), "rows": "many"}).encode(), "rows"),
    (lambda t: json.dumps({**json.loads(t), "sequences": [{"seq": "zero"}]}).encode(),
     "sequences.0"),
    (lambda t: b"\xff\xfe binary", "not UTF-8"),
])
def test_malformed_trace_files_get_a_message(client, tmp_path, good_trace, mangle, message):
    with pytest.raises(Exception, match=message):
        _upload(client, tmp_path, "bad.json", mangle(good_trace))
    assert "opened from a file" in _upload(client, tmp_path, "good.json", good_trace)[0]


def test_an_oversized_trace_file_is_refused(client, tmp_path):
    with pytest.raises(Exception, match="(?i)size|large|limit"):
        _upload(client, tmp_path, "huge.json", b" " * (MAX_TRACE_BYTES + 1))


def test_operator_limits_are_enforced_with_clear_messages(client):
    # The default SPECVIZ_MAX_BATCH_SIZE is 16: the slider itself stops at it.
    over = {**TINY_RUN, "batch_size": 17}
    with pytest.raises(Exception, match="greater than maximum value 16"):
        client.predict(**over, api_name="/run")
    many = {**TINY_RUN, "typed": "\n".join(f"prompt {i}" for i in range(65))}
    with pytest.raises(Exception, match=r"the number of prompts 65 is over this server's limit of "
                                        r"64 \(SPECVIZ_MAX_PROMPTS\)"):
        client.predict(**many, api_name="/run")
    custom = {**TINY_RUN, "pair": "custom (type ids below)", "target": "gpt2",
              "draft": "distilgpt2"}
    with pytest.raises(Exception, match=r"target model 'gpt2' is not allowed on this server"):
        client.predict(**custom, api_name="/run")
    wide = {**TINY_RUN, "pair": "smollm2"}  # Hub ids: refused before anything is downloaded
    with pytest.raises(Exception,
                       match=r"dtype float64 is wider than this server's limit of float32 for Hub "
                             r"and local models \(SPECVIZ_MAX_DTYPE\)"):
        client.predict(**wide, api_name="/run")
    work = {**TINY_RUN, "typed": "\n".join(f"prompt {i}" for i in range(40)), "max_new_tokens": 110}
    with pytest.raises(Exception,
                       match=r"prompts × max new tokens 4400 is over this server's limit of "
                             r"4096 \(SPECVIZ_MAX_RUN_TOKENS\)"):
        client.predict(**work, api_name="/run")
    long = {**TINY_RUN, "typed": " ".join(["word"] * 2100)}  # about 2,100 tokens, 10,500 characters
    with pytest.raises(Exception,
                       match=r"prompt 0 is \d+ tokens long, over this server's limit of "
                             r"2048 \(SPECVIZ_MAX_PROMPT_TOKENS\)"):
        client.predict(**long, api_name="/run")
    status, _ = client.predict(**TINY_RUN, api_name="/run")  # and the next run goes through
    assert "100% of sequences equal the batch-size-1 reference" in status


def test_a_shared_link_to_another_revision_is_not_replayed():
    from gradio import Error

    from specviz.app.runview import replay
    from specviz.run.settings import Settings

    spec = RunSpec.build(target="Qwen/Qwen3-8B", draft="Qwen/Qwen3-0.6B",
                         target_revision="refs/pr/7", prompts=("Hi",))
    with pytest.raises(Error,
                       match=r"cannot be replayed here: revision 'refs/pr/7' of target model "
                             r"'Qwen/Qwen3-8B' is not allowed on this server; "
                             r".*\(SPECVIZ_ALLOWED_MODELS\)"):
        replay(Settings(), {"spec": spec.canonical_json()})


def test_a_replay_that_drifted_says_so_and_shows_what_differs(good_trace):
    from specviz.app.runview import _replay_report

    trace = Trace.from_json(good_trace)
    same = _replay_report(trace, {"fp": trace.manifest.fingerprint,
                                  "env": share.environment(trace.manifest)})
    assert "matched the shared run exactly" in same and "| differs |" not in same
    elsewhere = {**share.environment(trace.manifest), "device": "cuda:0", "torch": "2.12.0"}
    drifted = _replay_report(trace, {"fp": "0" * 16, "env": elsewhere})
    shown = markdown_text(drifted)
    assert "drifted" in shown and "differs shared run this replay" in shown
    assert ("device cuda:0 cpu" in shown
            and f"torch 2.12.0 {trace.manifest.versions['torch']}" in shown)


def test_an_uploaded_prompt_file_is_used_and_a_bad_one_explained(client, tmp_path):
    from gradio_client import handle_file

    good = tmp_path / "prompts.jsonl"
    good.write_text('{"turns": ["Hello there"]}\n{"turns": ["Two\\nlines"]}\n')
    with_file = {**TINY_RUN, "prompt_file": handle_file(str(good))}
    _, trace_file = client.predict(**with_file, api_name="/run")
    assert (Trace.from_json(Path(trace_file).read_text()).manifest.spec.prompts
            == ("Hello there", "Two\nlines"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "no turns"}\n')
    with_file["prompt_file"] = handle_file(str(bad))
    with pytest.raises(Exception, match="bad.jsonl, line 1"):
        client.predict(**with_file, api_name="/run")


def test_the_shrink_button_gives_a_smaller_run_that_opens_on_the_fork(app_url):
    # a session of its own: shrink reads the session's trace
    client = Client(app_url, verbose=False)
    bsp = {**TINY_RUN, "prompt_set": "all", "faults": ["bsp-like"], "batch_size": 4,
           "max_new_tokens": 16, "dtype": "float32"}
    _, trace_file = client.predict(**bsp, api_name="/run")
    trace = Trace.from_json(Path(trace_file).read_text())
    seq = next(s for s in trace.sequences if s.equivalent is False)
    note = client.predict(seq.seq, api_name="/shrink")
    assert "Smallest run found" in note and "sync-bug:" in note
    query = note.split("](", 1)[1].split(")", 1)[0]
    link = share.decode_link(query)
    assert len(link.spec.prompts) < len(trace.prompts) and link.spec.max_new_tokens <= 16
    assert "Replaying" in client.predict(query, api_name="/open_link")[-1]
    with pytest.raises(Exception, match="there is no sequence 10000"):
        client.predict(10_000, api_name="/shrink")


def _outputs_file(tmp_path, trace: Trace, tamper: int | None = None,
                  name: str = "outputs.jsonl") -> str:
    """An engine's outputs file made from a run's outputs; `tamper`: that sequence's token
    2 replaced."""
    lines = [json.dumps({"engine": {"name": "my-engine", "version": "1.2", "settings": {"k": 3}}})]
    for p, s in zip(trace.prompts, trace.sequences):
        ids = list(s.output_ids)
        if s.seq == tamper and len(ids) > 2:
            ids[2] = (ids[2] + 1) % 1000
        lines.append(json.dumps({"prompt_ids": p.ids, "output_ids": ids}))
    path = tmp_path / name
    path.write_text("\n".join(lines))
    return str(path)


CHECKED = {"pair": "tiny", "target": "", "dtype": "float64", "outputs": None, "control": None,
           "server": "", "served_model": "", "control_server": "", "prompt_set": "quick",
           "max_new_tokens": 8}


def test_the_check_tab_judges_an_uploaded_outputs_file(tmp_path, good_trace, app_url):
    from gradio_client import handle_file

    client = Client(app_url, verbose=False)
    checked = {**CHECKED, "outputs": handle_file(
        _outputs_file(tmp_path, Trace.from_json(good_trace), tamper=0))}
    status, _ = client.predict(**checked, api_name="/check_engine")
    # without its control run, this engine's rounding is not known
    assert "unexplained × 1" in status
    checked["control"] = handle_file(_outputs_file(tmp_path, Trace.from_json(good_trace),
                                                   name="control.jsonl"))
    status, trace_file = client.predict(**checked, api_name="/check_engine")
    trace = Trace.from_json(Path(trace_file).read_text())
    assert trace.manifest.engine.name == "my-engine" and trace.manifest.spec.method == "engine"
    assert ("engine check" in status and "my\\-engine 1\\.2" in status
            and "engine\\-bug × 1" in status)
    assert trace.sequences[0].forensics.verdict == "engine-bug"
    assert all(s.equivalent for s in trace.sequences[1:])


def test_the_check_tab_judges_the_acceptance_of_an_engine_said_to_draft_with_the_pairs_draft(
        tmp_path, good_trace, app_url):
    """Right outputs whose counters accept no draft: a lossless draft bug, caught once the user says
    the engine drafts with the pair's draft model (its counters are judged against that draft's
    replay); not judged unsaid."""
    from gradio_client import handle_file

    trace = Trace.from_json(good_trace)
    lines = [{"engine": {"name": "my-engine", "settings": {"k": 5}}}]
    lines += [{"prompt_ids": p.ids, "output_ids": s.output_ids, "drafts": 5 * len(s.output_ids),
               "accepted": 0}
              for p, s in zip(trace.prompts, trace.sequences)]
    path = tmp_path / "counted.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines))
    client = Client(app_url, verbose=False)
    checked = {**CHECKED, "outputs": handle_file(str(path)), "determinism": False, "temperature": 0,
               "top_p": 1, "seed": 0}
    for said in ("", "model"):
        _, trace_file = client.predict(**checked, engine_drafter=said, api_name="/check_engine")
        acceptance = Trace.from_json(Path(trace_file).read_text()).acceptance
        if said:
            assert (acceptance.counters
                    and acceptance.verdict == "draft-bug:acceptance"), acceptance.explanation
        else:
            assert acceptance is None


def test_the_check_tab_judges_a_sampled_engine_at_its_settings(tmp_path, good_trace, app_url):
    """Sampled, a file is judged by its tokens' distribution under the target at the tab's settings,
    which the check's spec records (a server would be asked with them)."""
    from gradio_client import handle_file

    client = Client(app_url, verbose=False)
    outputs = handle_file(_outputs_file(tmp_path, Trace.from_json(good_trace)))
    status, trace_file = client.predict(**{**CHECKED, "outputs": outputs}, determinism=False,
                                        temperature=0.8, top_p=0.9, seed=3,
                                        api_name="/check_engine")
    trace = Trace.from_json(Path(trace_file).read_text())
    spec = trace.manifest.spec
    assert (spec.method, spec.temperature, spec.top_p, spec.seed) == ("engine", 0.8, 0.9, 3)
    assert trace.distribution is not None and all(s.reference_ids is None for s in trace.sequences)
    assert "sampled** at temperature 0\\.8" in status, status


def test_the_check_tab_asks_no_server_unless_the_operator_allows_it(app_url):
    client = Client(app_url, verbose=False)
    with pytest.raises(Exception,
                       match=r"engine server 'http://example\.org:8000' is not allowed on this "
                             r"server; allowed: none \(SPECVIZ_ENGINE_SERVERS\)"):
        client.predict(**{**CHECKED, "server": "http://example.org:8000"}, api_name="/check_engine")


SAMPLED = {**TINY_RUN, "audit": False, "temperature": 0.8, "top_k": 40, "top_p": 0.9,
           "draft_temperature": None, "draft_top_k": None, "draft_top_p": None}


def test_penalties_logprobs_stop_strings_and_chat_template_go_through_the_controls_and_back():
    from specviz.app import form
    from specviz.app import runview as ui

    spec = form.spec_from_controls(**TINY_RUN, audit=False, temperature=0.0, top_k=0, top_p=1.0,
                                   draft_temperature=None, draft_top_k=None, draft_top_p=None,
                                   drafter="model", ngram_min=1, ngram_max=3, rows="",
                                   repetition_penalty=1.3, presence_penalty=0.5,
                                   logprobs=True, stop=" Paris\r\n!", chat_template=False)
    assert (spec.repetition_penalty, spec.presence_penalty, spec.logprobs) == (1.3, 0.5, True)
    assert spec.stop == (" Paris", "!") and spec.chat_template is False
    opened = ui.open_link(share.encode_link(share.Link(spec)))
    assert form.spec_from_controls(**{n: opened[n] for n in form.DEFAULTS}) == spec


def test_the_sampling_controls_make_the_spec_and_a_sampled_link_replays_exactly(client):
    from specviz.app import form, serving
    from specviz.app import runview as ui
    from specviz.run.settings import Settings

    status, trace_file = client.predict(**SAMPLED, api_name="/run")
    trace = Trace.from_json(Path(trace_file).read_text())
    spec = trace.manifest.spec
    assert ((spec.temperature, spec.top_k, spec.top_p, spec.draft_temperature)
            == (0.8, 40, 0.9, None))
    assert spec == form.spec_from_controls(**SAMPLED)
    assert trace.distribution is not None and all(s.reference_ids is None for s in trace.sequences)
    assert ("sampled** at temperature 0\\.8\\, top\\-k 40\\, top\\-p 0\\.9" in status
            and "| distribution |" in status)
    # The link fills the controls back to the same spec, and carries it exactly.
    link = share.encode_link(share.Link(spec, 0, None, trace.manifest.fingerprint,
                                        share.environment(trace.manifest)))
    # States are not API outputs
    *controls, _download, note = client.predict(link, api_name="/open_link")
    assert "Replaying" in note
    assert form.spec_from_controls(**dict(zip(form.DEFAULTS, controls))) == spec
    # the draft's own settings, in the accordion
    own = form.spec_from_controls(**{**SAMPLED, "draft_temperature": 0.5, "draft_top_k": 0,
                                     "draft_top_p": 0.99})
    assert (own.draft_temperature, own.draft_top_k, own.draft_top_p) == (0.5, 0, 0.99)
    opened = ui.open_link(share.encode_link(share.Link(own)))
    assert form.spec_from_controls(**{n: opened[n] for n in form.DEFAULTS}) == own
    # Replayed afresh (not from this process's cache): the same fingerprint, and the report says so.
    serving.TRACES.pop(spec.key(), None)
    replayed, report, _, _ = ui.replay(Settings(), {"spec": spec.canonical_json(),
                                                    "fp": trace.manifest.fingerprint,
                                                    "env": share.environment(trace.manifest)})
    assert replayed is not trace and replayed.manifest.fingerprint == trace.manifest.fingerprint
    assert ("Replay matched the shared run exactly" in report
            and "Every draw fell the same way" in report)
    assert markdown_text(summary.distribution_row(replayed)) in markdown_text(report)


def test_a_sampled_replay_that_drifted_says_what_that_means(client):
    from specviz.app import runview as ui

    _, trace_file = client.predict(**SAMPLED, api_name="/run")
    trace = Trace.from_json(Path(trace_file).read_text())
    elsewhere = {**share.environment(trace.manifest), "device": "cuda:0"}
    shown = markdown_text(ui._replay_report(trace, {"fp": "0" * 16, "env": elsewhere}))
    assert ("drifted" in shown and "random numbers are counter-based" in shown
            and "device cuda:0 cpu" in shown)


def test_out_of_range_sampling_is_refused_with_a_message(client):
    from specviz.app.form import DEFAULTS

    top_p_without_temperature = {**TINY_RUN, "audit": False, "temperature": 0, "top_k": 0,
                                 "top_p": 0.9}
    with pytest.raises(Exception, match="need a temperature above 0"):
        client.predict(**top_p_without_temperature, api_name="/run")
    sampling_fault_greedy = {**TINY_RUN, "faults": ["accept-q-over-p"]}
    with pytest.raises(Exception, match="sampling faults need a temperature above 0"):
        client.predict(**sampling_fault_greedy, api_name="/run")
    hot = share.encode_link(share.Link(RunSpec.build(prompts=("Hi",), temperature=5.0, top_p=0.01)))
    values = dict(zip(DEFAULTS, client.predict(hot, api_name="/open_link")))
    # the slider widens to it
    assert values["temperature"] == {"__type__": "update", "value": 5.0, "maximum": 5.0}
    assert values["top_p"] == {"__type__": "update", "value": 0.01, "minimum": 0.01}


def test_the_sampling_examples_fill_the_controls(client):
    from specviz.app import form, page
    from specviz.app import runview as ui

    names = [n for n in ui.EXAMPLES if ui.EXAMPLES[n].get("temperature")]
    assert {page.example_api_name(n) for n in names} == {"example_sampled", "example_sampling",
                                                         "example_audited"}
    values = dict(zip(form.DEFAULTS, client.predict(api_name="/example_sampling")))
    assert (values["faults"] == ["temperature-draft-only"]
            and (values["temperature"], values["top_p"]) == (0.8, 0.95))
    greedy = dict(zip(form.DEFAULTS, client.predict(api_name="/example_clean")))
    # an example resets sampling
    assert (greedy["temperature"], greedy["top_k"], greedy["top_p"]) == (0, 0, 1)


# Typed prompts of this test's own, so that their reference is decoded first here (the timing note
# says so).
LOOKUP = {**TINY_RUN, "typed": "Name three rivers. Name three rivers.\nHi", "audit": False,
          "temperature": 0, "top_k": 0, "top_p": 1, "draft_temperature": None, "draft_top_k": None,
          "draft_top_p": None, "drafter": "lookup", "ngram_min": 2, "ngram_max": 4}


def test_the_drafter_controls_make_the_spec_and_a_lookup_link_restores_them(client):
    from specviz.app import form
    from specviz.app import runview as ui

    status, trace_file = client.predict(**LOOKUP, api_name="/run")
    trace = Trace.from_json(Path(trace_file).read_text())
    spec = trace.manifest.spec
    assert (spec.method, spec.drafter, spec.ngram_min, spec.ngram_max) == ("eqspec", "lookup", 2, 4)
    assert spec == form.spec_from_controls(**LOOKUP)
    shown = markdown_text(status)
    assert "drafts by prompt lookup (n-grams 2–4, no draft model)" in shown
    assert f"Speed-up: {views.metrics.speedup(trace)['ratio']:.2f}×" in shown
    assert "both measured on this machine in this run" in shown  # its reference decoded in this run
    # The same spec again: served from the process's cache, and said so; another k:
    # the reference reused.
    assert "when this process first ran this spec" in markdown_text(
        client.predict(**LOOKUP, api_name="/run")[0])
    other_k = {**LOOKUP, "k": 4}
    assert ("reused here, not timed again"
            in markdown_text(client.predict(**other_k, api_name="/run")[0]))
    # The link fills the drafter and n-gram controls back to the same spec.
    link = share.encode_link(share.Link(spec, 0, None, trace.manifest.fingerprint,
                                        share.environment(trace.manifest)))
    # States are not API outputs
    *controls, _download, note = client.predict(link, api_name="/open_link")
    values = dict(zip(form.DEFAULTS, controls))
    assert ("Replaying" in note
            and (values["drafter"], values["ngram_min"], values["ngram_max"]) == ("lookup", 2, 4))
    assert form.spec_from_controls(**values) == spec
    # With the draft model the (hidden) n-gram sliders are not read, and its link restores
    # the draft model.
    model = form.spec_from_controls(**{**LOOKUP, "drafter": "model", "ngram_min": 2,
                                       "ngram_max": 4})
    assert (model.drafter, model.ngram_min, model.ngram_max) == ("model", 1, 3)
    opened = ui.open_link(share.encode_link(share.Link(model)))
    values = {n: opened[n] for n in form.DEFAULTS}
    assert values["drafter"] == "model" and form.spec_from_controls(**values) == model


def test_the_method_registry_drives_the_method_drafter_and_fault_controls():
    from specviz.app import page
    from specviz.app import runview as ui
    from specviz.run.settings import Settings
    from specviz.spec.drafters import DRAFTER_OPTIONS, DRAFTERS
    from specviz.spec.methods import METHODS

    blocks = page.build(Settings())
    by_id = {b.elem_id: b for b in blocks.blocks.values() if getattr(b, "elem_id", None)}
    assert [v for _, v in by_id["sv-method"].choices] == list(METHODS)
    assert [v for _, v in by_id["sv-drafter"].choices] == list(DRAFTERS)
    assert (by_id["sv-method"].info == METHODS["eqspec"].summary
            and by_id["sv-drafter"].info == DRAFTERS["model"].summary)
    # the draft model: no n-grams,
    assert not by_id["sv-ngram-min"].visible and not by_id["sv-ngram-max"].visible
    assert by_id["sv-tree-width"].visible  # but trees
    for name, m in METHODS.items():
        info, faults, drafter, k = ui.method_allows(name, "lookup")
        assert info["info"] == m.summary
        assert (faults["interactive"] == m.faults
                and faults.get("value", "kept") == ("kept" if m.faults else []))
        assert drafter["interactive"] == k["interactive"] == m.speculative
        assert drafter.get("value", "kept") == ("kept" if "lookup" in m.drafters else "model")
    def shown(drafter: str) -> set[str]:
        info, *options = ui.drafter_shows(drafter)
        assert info["info"] == DRAFTERS[drafter].summary
        return {f for f, x in zip(DRAFTER_OPTIONS, options, strict=True) if x["visible"]}

    assert shown("lookup") == {"ngram_min", "ngram_max", "tree_width"}
    assert shown("model") == {"tree_width"}
    assert shown("eagle3") == shown("eagle1") == {"head", "tree_width"}


def test_the_prompt_lookup_example_fills_the_drafter_and_other_examples_reset_it(client):
    from specviz.app.form import DEFAULTS

    values = dict(zip(DEFAULTS, client.predict(api_name="/example_prompt")))
    assert (values["drafter"], values["ngram_min"], values["ngram_max"]) == ("lookup", 2, 3)
    assert (values["prompt_set"], values["method"], values["batch_size"],
            values["k"]) == ("summarize+code", "eqspec", 1, 5)
    assert dict(zip(DEFAULTS, client.predict(api_name="/example_clean")))["drafter"] == "model"


def test_the_tree_width_control_makes_the_spec_and_a_link_restores_it():
    from specviz.app import form
    from specviz.app import runview as ui

    spec = form.spec_from_controls(**{**form.DEFAULTS, "pair": "tiny", "prompt_file": None,
                                      "tree_width": 4})
    assert (spec.drafter, spec.tree_width) == ("model", 4)
    opened = ui.open_link(share.encode_link(share.Link(spec)))
    values = {n: opened[n] for n in form.DEFAULTS}
    assert values["tree_width"] == 4
    assert form.spec_from_controls(**{**values, "prompt_file": None}) == spec
