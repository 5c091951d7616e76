"""Share links: what a link carries comes back exactly; a bad link gets one clear message."""
import base64
import json
import zlib

import pytest

from specviz.spec.run import RunSpec
from specviz.spec.strict import SpecError
from specviz.trace import share

SPEC = RunSpec.build(target="specviz:tiny", draft="specviz:tiny-draft",
                     prompts=("Hi!", "two\nlines"), faults=("bsp-like",), batch_size=2, k=3,
                     max_new_tokens=9, dtype="float64")


def _run_param(payload) -> str:
    raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return base64.urlsafe_b64encode(zlib.compress(raw)).decode().rstrip("=")


def test_a_link_carries_spec_focus_fingerprint_and_environment():
    link = share.Link(SPEC, seq=1, round=7, fingerprint="0123456789abcdef",
                      env={"torch": "2.13.0", "device": "cpu"})
    query = share.encode_link(link)
    assert query.startswith("?run=") and "seq=1" in query and "round=7" in query
    assert share.decode_link(query) == link
    assert share.decode_link(query.lstrip("?")) == link  # with or without the '?'


def test_a_plain_visit_carries_no_link():
    assert share.decode_link("") is None
    assert share.decode_link("?utm_source=x") is None


@pytest.mark.parametrize("query, message", [
    ("?run=eNpLy", "damaged"),  # cut off while copying
    ("?run=%%%not-base64", "damaged"),
    ("?run=" + base64.urlsafe_b64encode(b"not zlib at all").decode(), "damaged"),
    ("?run=" + _run_param(b"{not json"), "damaged"),
    ("?run=" + _run_param([1, 2, 3]), "no run spec"),
    ("?run=" + _run_param({"spec": {**json.loads(SPEC.canonical_json()), "batch_size": 999}}),
     "batch_size"),
    ("?run=" + _run_param({"spec": {**json.loads(SPEC.canonical_json()), "k": "five"}}), "k:"),
    ("?run=" + _run_param({"spec": {**json.loads(SPEC.canonical_json()), "secret": 1}}), "secret"),
    ("?run=" + _run_param({"spec": json.loads(SPEC.canonical_json()), "fp": 5}), "fingerprint"),
    ("?run=" + _run_param({"spec": json.loads(SPEC.canonical_json())}) + "&seq=-1",
     "seq must be a whole number"),
    ("?run=" + _run_param({"spec": json.loads(SPEC.canonical_json())}) + "&round=x",
     "round must be a whole number"),
    ("?run=" + _run_param(b" " * (share.MAX_PAYLOAD_BYTES + 10)), "too large"),  # a zip bomb
    ("?run=" + "A" * share.MAX_LINK_CHARS, "characters long"),
])
def test_malformed_links_get_a_clear_message(query, message):
    with pytest.raises(SpecError, match=message):
        share.decode_link(query)


def test_a_run_too_long_for_a_link_says_to_share_the_trace():
    import random

    rng = random.Random(0)  # incompressible prompts
    prompts = tuple("".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(4000))
                    for _ in range(8))
    with pytest.raises(SpecError, match="share the trace file instead"):
        share.encode_link(share.Link(SPEC.model_copy(update={"prompts": prompts})))
