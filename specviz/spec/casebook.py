"""The field casebook: speculative-decoding bugs that hit real engines, each replayed by one fault
of specviz's engine (spec/faults.py), declared once here for every layer that shows them: the page's
gallery, the sweep that runs them all, docs/casebook.md and tests/test_casebook.py.

A case is a card for its fault: what the users saw, the mechanism in two lines, what the replica
leaves out, and the run that replays it: the embedded pair by default, a built-in pair where the
case needs a feature the embedded one lacks (a hybrid's recurrent state, a sliding window). The
threads it cites and the verdict it gets are its fault's record's. Its recorded run is bundled as
assets/traces/case-<fault>.json. Plain data: no torch.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from specviz.spec.faults import FAULTS
from specviz.spec.run import EMBEDDED_TARGET, FITTED_HEAD, TINY_WINDOW, TINY_WINDOW_DRAFT
from specviz.spec.threads import Thread

# The replica's run, beside the fault: greedy, float32, eqspec, on prompts one of which ("What is
# the capital of France?") ends inside a block of drafts. On the device the server picks (auto, the
# page's default): a served page refuses device "cpu" (SPECVIZ_DEVICES), and its gallery and
# casebook sweep must open every case.
PROMPTS = ("What is the capital of France?", "Write a haiku about the sea.",
           "Name three primary colors.", "Explain what a prime number is in one sentence.")
BASE_RUN = dict(prompts=PROMPTS, method="eqspec", dtype="float32", batch_size=4, k=4,
                max_new_tokens=32)


@dataclass(frozen=True)
class Case:
    fault: str  # the record it replays (spec/faults.py)
    title: str  # what the user saw, in a few words
    mechanism: str  # two lines: what fell out of step, and how
    leaves_out: str  # what the replica does not replay
    run: dict = field(default_factory=dict)  # RunSpec fields beyond BASE_RUN and the fault

    @property
    def trace(self) -> str:
        """Its bundled run's file in assets/traces."""
        return f"case-{self.fault}.json"

    @property
    def expected(self) -> str | None:
        """The verdict its mechanism gets: a breaking case's fork, a lossless case's drafts; None
        where the distribution test alone judges the run (a sampling fault unaudited:
        trace/evidence.py's Distribution)."""
        return FAULTS[self.fault].verdict or FAULTS[self.fault].acceptance

    @property
    def threads(self) -> tuple[Thread, ...]:
        """The field's threads its fault replays."""
        return FAULTS[self.fault].threads

    @property
    def lossless(self) -> bool:
        return FAULTS[self.fault].kind == "lossless"

    def spec_fields(self) -> dict:
        """Every RunSpec field of its replica."""
        return {**BASE_RUN, "faults": (self.fault,), **self.run}


# a correct drafter's every draft is accepted
_SELF_DRAFT = dict(target=EMBEDDED_TARGET, draft=EMBEDDED_TARGET)
# Requests of their own in one batch: greedy, sampled at 0.8 (top-p 0.95), and a seeded top-k
# request that leaves its temperature unset (the engines' default 1.0); on prompts that ask for long
# answers (the settings test needs tokens: a confident model's sampled tokens are often its argmax,
# and the short answers of PROMPTS did not tell greedy from sampled beyond chance).
_REQUESTS = dict(rows=({"temperature": 0}, {"temperature": 0.8, "top_p": 0.95},
                       {"top_k": 20, "seed": 7}),
                 prompts=("Write a short story about a lighthouse keeper.",
                          "Describe your favourite city in detail.",
                          "Explain how a bicycle works.", "Tell me about the history of tea."),
                 max_new_tokens=48)
_HYBRID = dict(target="specviz:tiny-hybrid", draft="specviz:tiny-hybrid-draft")
# specviz's fitted EAGLE-3 head of the run's target (models/builtinheads.py): it drafts the target's
# own text on these prompts, so what a wrong feeding costs shows
_FITTED = dict(drafter="eagle3", head=FITTED_HEAD)
# The first prompt's answer ends with its end-of-sequence token (token 7) inside the block that
# reaches a cap of 9 tokens: the stop and the cap fall in one accepted block.
CAP_RUN = dict(max_new_tokens=9)
# Paged (decoding/paging.py): blocks small enough that a verify crosses into a new one; prefix
# caching over two batches, the second's requests hitting the chat template's blocks.
_PAGED, _PREFIX = dict(kv_block_size=4), dict(kv_block_size=8, prefix_caching=True, batch_size=2)
# A hybrid's requests asked again (a retry) in a later batch; in blocks of 2, each prompt ends on
# a block boundary: its last block is completed by its first verify pass.
_RETRIED = {**_HYBRID, **_PREFIX, "kv_block_size": 2, "prompts": (PROMPTS[3], PROMPTS[1]) * 2}
# PROMPTS reach its window inside the run
_WINDOW = dict(target=TINY_WINDOW, draft=TINY_WINDOW_DRAFT)
# Structured output (decoding/grammar.py): a person's record, compact JSON.
PERSON_SCHEMA = json.dumps({
    "type": "object", "additionalProperties": False, "required": ["name", "age", "city"],
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"},
                   "city": {"type": "string", "maxLength": 20}}})
_JSON = dict(json_schema=PERSON_SCHEMA, k=5, max_new_tokens=48,
             prompts=("Describe a person as JSON.", "Give me a JSON object for a user profile.",
                      "Write JSON about Alice, 30, from Paris.",
                      "Output a JSON record of a famous scientist."))
# A reasoning model's thinking, its end a newline: the embedded model writes one before its JSON.
_THINKING = {**_JSON, "reasoning_end": "\n", "max_new_tokens": 64, "prompts": (
    "Briefly explain who Ana is (41, Lima), then output her record as JSON.",
    "Introduce Kai, age 7, from Oslo, in a sentence, then as JSON.",
    "Say hello to Mia (19, Kyiv), then write her profile in JSON.",
    "Write one sentence about Bob, a 30-year-old from Rome. Then give his data as JSON.")}
# Prompt lookup drafts the chat template's end-of-turn after a quoted JSON's closing brace.
_QUOTED = {**_JSON, "drafter": "lookup", "max_new_tokens": 40, "prompts": (
    'Return this record unchanged: {"name":"Ana","age":41,"city":"Lima"}',
    'Echo the JSON {"name":"Kai","age":7,"city":"Oslo"}',
    'Copy: {"name":"Mia","age":19,"city":"Kyiv"}',
    'Print the record {"name":"Lea","age":52,"city":"Nice"}')}

CASES = (
    Case("verify-positions-not-advanced",
         "greedy output left the reference once a draft was accepted",
         "Every slot of a verify window got the window's first position id.\n"
         "The keys committed to the cache were rotated at the wrong positions.",
         "oMLX's multimodal rotary offsets (M-RoPE): the text model's one position per slot is "
         "enough to show it."),
    Case("positions-from-slots", "speculation differed from plain decoding in a padded batch",
         "A row's position ids were counted from its cache slots, pads included.\n"
         "vLLM dropped a per-row position offset when it expanded the batch alike.",
         "the vision model's M-RoPE delta: here the offset is the row's left padding."),
    Case("bonus-from-another-row", "a word dropped and its continuation kept, at temperature > 0",
         "The token after a row's accepted drafts was another row's target choice.\n"
         "The recovered token was read from the wrong row, one iteration late.",
         "the one-iteration lateness and the prefix-cache assertion: the row mix-up alone, "
         "at greedy."),
    Case("rollback-by-draft-list",
         "temperature-0 degeneration: the model's history lost its own output",
         "A row's rollback was sized by the batch's draft list, not by the drafts the row "
         "was offered.\n"
         "It erased committed tokens the verify pass never added: the cache fell behind "
         "the output.",
         "Atlas's depth cap on the verified drafts: here a row is offered fewer drafts by "
         "prompt lookup.",
         dict(drafter="lookup")),
    Case("accept-on-raw-softmax", "greedy speculative output differed from greedy decoding",
         "At temperature 0 an argmax draft was accepted with probability min(1, p/q) "
         "of the untempered softmaxes.\n"
         "Drafts the target would not choose were kept; tempering first makes p and q one-hot.",
         "the residual drawn after a rejection: the replica takes the target's argmax there."),
    Case("stop-at-last-token", "generated past an end-of-sequence token accepted mid-block",
         "The stop check looked only at the last token of the block a round kept.\n"
         "An end-of-sequence token accepted inside the block was written, and decoding went on.",
         "the stop strings of the threads: the replica stops on the model's end-of-sequence tokens "
         "(the fault misses stop strings alike: tests/test_stop_strings.py)."),
    Case("cap-before-stop",
         "tokens after an end-of-sequence token, reported as finished by length",
         "The finish check tested the length cap before the stop.\n"
         "A block reaching the cap was kept whole, past the end-of-sequence token inside it.",
         "stop strings and the finish reason: the replica stops on the model's end-of-sequence "
         "tokens, and its trace records no finish reason.",
         CAP_RUN),
    Case("counted-before-stop-trim",
         "mean acceptance length (and usage) overcounted when a stop lands in a block",
         "A round's counters took its whole accepted block before the stop trimmed it.\n"
         "Tokens past an end-of-sequence token were counted as emitted; the output is right.",
         "vLLM's Prometheus metrics and SGLang's reasoning-token usage: the replica's own counter "
         "of each round's tokens (its rows' `counted`) takes the untrimmed block."),
    Case("penalty-history-last-token",
         "penalties weaker the better the draft; loops under a repetition penalty",
         "The penalty history gained only the last token of each round, and each verify slot used "
         "the round's start.\n"
         "Accepted drafts went unpenalised: the target chose tokens the row already held.",
         "min_new_tokens and the frequency penalty: the replica applies a repetition penalty "
         "of 1.3.",
         dict(repetition_penalty=1.3)),
    Case("logprobs-from-draft",
         "log-probability 0.0 for every accepted token while the text was right",
         "An accepted draft's log-probability was the drafter's own, not the target's.\n"
         "The tokens stay right; only the reported numbers are wrong (0.0 under prompt lookup).",
         "prompt_logprobs and chunked prefill (vLLM #53488): the replica reports the "
         "output's log-probabilities.",
         dict(logprobs=True)),
    Case("tree-positions-by-index", "a tree verify right only while the tree was a chain",
         "A flattened token tree's nodes got their index in the span as their position, not "
         "their depth.\n"
         "Any node beside another one was rotated to a position it does not hold.",
         "mlxcel's flattened span and its own tree shapes: the replica verifies trees of width "
         "2.",
         dict(tree_width=2)),
    Case("state-not-rolled-back", "a hybrid model's output corrupted after rejected drafts",
         "A recurrent state's rollback after rejected drafts was a silent no-op.\n"
         "Every drafted token stayed in the state the next round read.",
         "mlx-lm's cache classes: any hybrid layer's state shows it (a random Qwen 3.5-style "
         "pair here).",
         _HYBRID),
    Case("state-after-zero-draft",
         "loops and drift on a hybrid with n-gram drafts; acceptance looked healthy",
         "A row offered no drafts read its recurrent state from before the last round's "
         "accepted drafts.\n"
         "The decode path's state column was committed only on the speculative path.",
         "vLLM's slot arithmetic and CUDA graphs: the stale column is read directly.",
         {**_HYBRID, "drafter": "lookup", "ngram_min": 1, "draft": "specviz:tiny-hybrid"}),
    Case("state-kept-when-all-rejected",
         "a hybrid's MTP output went wrong after rounds that rejected every draft",
         "Rolling back a whole decode reported success and left the recurrent state as it was.\n"
         "A round that accepted no draft kept every drafted token in its state.",
         "llama.cpp's sequence bookkeeping (n_rs_seq) and MTP heads: a draft model drafts for "
         "the random Qwen 3.5-style pair here.",
         _HYBRID),
    Case("state-from-another-rows-count",
         "garbled text and early end-of-sequence on a hybrid under async speculation",
         "A stale copy of the accepted counts, read in the batch's old row order, picked each "
         "row's recurrent state.\n"
         "A row's state continued from another row's number of this round's tokens.",
         "the async scheduler's reorder and its CPU copy: the replica reads the row before's "
         "count every round (a random Qwen 3.5-style pair here).",
         _HYBRID),
    Case("window-kept-on-verify", "a sliding-window model drifted only under speculation",
         "A rotating cache evicted one key per update, whatever the update's length.\n"
         "A verify of several tokens never evicted: the cache grew past its window, and every "
         "verify saw it.",
         "the cache's rotation: the replica keeps every key and lifts the window in verify "
         "passes (a random Mistral-style pair with a 48-token window here).", _WINDOW),
    Case("window-full-keeps-rejected", "a late greedy fork, reported as \"should be identical\"",
         "Once a sliding-window (rotating) cache was full, it could no longer be trimmed.\n"
         "Drafts rejected after that stayed in the window, seen by every later token.",
         "the rotating cache's offset, not rewound either: the replica keeps positions right "
         "(a random Mistral-style pair with a 48-token window here).", _WINDOW),
    Case("draft-positions-off-by-one", "acceptance dropped while the output stayed right",
         "The draft model's passes were fed position ids one ahead of its prefill's.\n"
         "Drafts came from a shifted context: fewer were accepted, none was wrong.",
         "SGLang's EAGLE worker: a separate draft model shows the same shift.", _SELF_DRAFT),
    Case("draft-misses-target-token", "65% acceptance with the target as its own draft (98% fixed)",
         "The drafter drafted before it had fed the token the target wrote last.\n"
         "Its first draft repeated that token, and was rejected.",
         "vllm-metal's case was after prefill only: the replica misses the token every round.",
         _SELF_DRAFT),
    Case("draft-window-as-full",
         "acceptance fell off a cliff past a context length while the output stayed right",
         "The draft model's sliding-window layers ran as full attention.\n"
         "Past its window it drafted from a context it was not made for: fewer drafts were "
         "accepted, none was wrong.",
         "DFlash's block drafter and the 2k-token context: a random Mistral-style pair with a "
         "48-token window drafts for itself here.",
         {**_WINDOW, "draft": TINY_WINDOW}),
    Case("drafts-to-another-row", "acceptance dropped after the batch was reordered",
         "Each row verified the drafts proposed for another row.\n"
         "The row-to-draft mapping went stale when the batch was reordered.",
         "ragged draft widths packed as rectangles (−1 placeholders): the rows are simply rotated.",
         _SELF_DRAFT),
    Case("head-hidden-off-by-one", "an EAGLE head lost a quarter of its acceptance; output right",
         "The head was fed, at each slot, the target's hidden state two slots back.\n"
         "EAGLE's first input token was not dropped: every input shifted by one.",
         "EAGLE-1's own head: specviz's fitted EAGLE-3 head of the run's target shows the same "
         "shift.", _FITTED),
    Case("head-aux-one-early", "an EAGLE-3 head's acceptance fell from 45% to 10%; output right",
         "The head was fed each aux hidden state from one layer earlier than its config named.\n"
         "The engine captured layer k's input where the head was trained on it one layer on.",
         "MiniMax-M2 and its head: specviz's fitted EAGLE-3 head of the run's target shows the "
         "same shift.", _FITTED),
    Case("head-aux-fallback", "EAGLE-3 acceptance 1.2% against 58.9%, and nothing said why",
         "The head was fed the engines' default aux layers (2, L/2, L-3), not its config's.\n"
         "Its config's aux layer ids were not read (absent, or nested), and no error said so.",
         "the config's spelling: the replica reads the ids and feeds the default anyway (on the "
         "embedded pair: the tiny one's 3 layers leave no other choice of three).", _FITTED),
    Case("head-features-norm-flipped", "GPT-OSS EAGLE-3 heads drafted poorly in SGLang",
         "The head's features were normed before fc where it asked for no norm (or the "
         "reverse).\n"
         "It drafted from hidden states of another scale than it was trained on.",
         "GPT-OSS's layer boundaries, the PR's other half: the aux faults replay those.",
         _FITTED),
    Case("head-vocab-as-ids", "an exported EAGLE-3 head drafted nonsense in the engine",
         "The head's draft vocabulary map was read as target ids, not offsets.\n"
         "Each draft id went to the target id its offset names: almost none was accepted.",
         "the PR's direction (ids written where offsets are read): reading offsets as ids "
         "misplaces the same drafts.", _FITTED),
    Case("head-vocab-map-dropped", "an EAGLE-3 head's acceptance collapsed after export",
         "The head's draft vocabulary map was dropped: draft id i became target id i.\n"
         "Only the lowest ids, where the map is the identity, were still drafted right.",
         "the side file the map was kept in: the replica drops the map at load.", _FITTED),
    Case("settings-from-first-row",
         "rows sampled with another request's temperature, top-k and top-p",
         "The fused verify read the first row's temperature, top-k and top-p and gave them "
         "to every row.\n"
         "A greedy first request made every sampled request greedy.",
         "the overlap scheduler that made the path reachable: every verify here reads the first "
         "row's settings.",
         _REQUESTS),
    Case("settings-never-written", "garbage temperatures and top-k on a CPU build",
         "The kernel that expands each request's sampling settings to its tokens never ran.\n"
         "Every row was verified with what the buffer held, whatever it asked.",
         "the buffer's garbage and the out-of-bounds crash: the replica reads zeros, so every "
         "row is verified greedily.",
         _REQUESTS),
    Case("unset-temperature-greedy", "top-k-only requests silently became greedy",
         "A request that left its temperature unset got the greedy sentinel, whatever else "
         "it asked.\n"
         "Its top-k (and seed) then changed nothing: it wrote the argmax.",
         "the one-model path's 1e-5 sentinel: here the verify reads an unset temperature as 0.",
         _REQUESTS),
    Case("unseeded-noise-to-copy",
         "gibberish (\"I!!!!!!!! will\") in some requests of a mixed batch",
         "With seeded and unseeded requests in one batch, the unseeded rows' noise went "
         "to a copy.\n"
         "Their rows kept a buffer never written: only they broke, and only when the batch "
         "was mixed.",
         "the buffer's garbage: the replica reads it as zeros, so those rows draw the "
         "lowest tokens.", _REQUESTS),
    Case("draft-draw-shared-with-verify",
         "output leaned toward the drafter with probabilistic drafting",
         "The draft's noise was keyed by the offset of the acceptance's uniform at its position.\n"
         "One random number proposed the draft and decided it: the two were coupled.",
         "Gumbel sampling and the recovery noise, which shared the offset too: the replica draws "
         "each draft by inverse CDF with the acceptance's uniform, at temperature 1.",
         dict(temperature=1.0, audit=4)),
    Case("stream-advanced-for-zero-draft", "seeded output not reproducible, dependent on the batch",
         "A row offered no drafts still advanced its random generator in a round that "
         "verified others'.\n"
         "Its later draws shifted with the schedule; its distribution stayed right.",
         "the vocabulary's worth of draws vllm-ascend consumed: the replica skips one.",
         dict(drafter="lookup", chat_template=False, rows=_REQUESTS["rows"][1:],
              prompts=("one two one two one two one two one two", *PROMPTS[1:]))),
    Case("target-probs-mutated",
         "wrong recovered tokens and wrong log-probabilities after a rejection",
         "The target's probability of the draft token was zeroed in place before it was copied.\n"
         "Every later decision read the altered distribution: every draft was rejected.",
         "the raw-logprobs mode of vLLM PR #30846: the replica alters p, not the logits returned.",
         # At 0.3 the draft token holds much of p, and zeroing it shows in 32 tokens of the tiny
         # pair as well.
         dict(temperature=0.3, audit=4)),
    Case("processors-on-bonus-only", "top-k and top-p ignored under speculation",
         "The rejection sampler applied the row's truncating processors to the bonus token only.\n"
         "Drafts were decided, and refused ones redrawn, against p untruncated: tokens the row "
         "excluded came through.",
         "min_p and logit_bias, which specviz does not offer: top-k and top-p are the same kind "
         "of processor (the replica truncates with top-k 5).",
         dict(temperature=0.8, top_k=5, audit=4)),
    Case("draft-probs-unprocessed", "biased samples with a block drafter at temperature < 1",
         "Drafts were drawn from the draft model's processed distribution.\n"
         "Their decisions read its raw softmax as q: an unlikely-looking draft was accepted "
         "too often.",
         "DFlash's block drafter: the replica's draft model hands over its raw softmax alike, "
         "at temperature 0.3.",
         dict(temperature=0.3, audit=4)),
    Case("draft-drawn-in-bfloat16", "a small bias at temperature > 0 that no test caught",
         "Drafts were sampled from the draft model's logits in bfloat16.\n"
         "Their decisions read the float32 softmax: where the two part, a draft is not a draw from "
         "its q.",
         "DeepSpec's own sampler: the replica rounds the draft model's logits to bfloat16 before "
         "it draws, at temperature 1 (where rounding moves the most draws).",
         dict(temperature=1.0, audit=4)),
    Case("shared-stream", "identical or degenerate samples across requests",
         "Every row drew the same random numbers: one stream for the whole batch.\n"
         "Identical prompts gave identical samples; rows' draws were not independent.",
         "the engine-wide seed's step counter: the streams are shared, not shifted.",
         # One prompt in every row: rows sharing a stream then draw the same tokens, which the
         # distribution test's row pairs show (on four different prompts it found them consistent);
         # audited, each draw is re-derived from its row's own stream, which names it.
         dict(temperature=0.8, prompts=(PROMPTS[0],) * len(PROMPTS), audit=4)),
    Case("grammar-unmasked-past-reasoning-end",
         "grammar-invalid answers from a reasoning model under MTP or EAGLE with a JSON schema",
         "Whether a row still thought was decided once per block, at its start.\n"
         "The slots after a mid-block end of thinking kept the unconstrained mask.",
         "a reasoning model: the replica's thinking ends at a newline, which the embedded model "
         "writes before its JSON, as a reasoning model writes </think>.",
         _THINKING),
    Case("grammar-advanced-over-rejected",
         "structured outputs that break their schema, or 'grammar rejected tokens' errors",
         "The grammar advanced over every draft its verify masks walked, rejected ones too.\n"
         "Its later masks were a state the output never reached.",
         "the reasoning boundary of vLLM PR #44297: the replica's grammar runs from the first "
         "token.",
         _JSON),
    Case("grammar-mask-after-terminated",
         "requests aborted when a draft ends the answer inside a block",
         "An end-of-sequence draft terminated the matcher mid-block, and the next slot asked it "
         "for a mask.\n"
         "The matcher failed and the request was aborted with the tokens it had.",
         "xgrammar: llguidance allows only the end after a grammar ends; the replica fails as "
         "xgrammar's check does.",
         _QUOTED),
    Case("slots-assumed-contiguous", "wrong output with speculation and prefix caching both on",
         "A pass wrote its K/V at the slot ids after its first, as if its blocks were in a row.\n"
         "Its table mapped them elsewhere: it read slots never written, and overwrote others'.",
         "the radix cache that scattered the slots, and the device asserts: here the blocks rows "
         "take as they grow interleave on their own.", _PAGED),
    Case("lookahead-into-shared-block",
         "generation length falling for requests under prefix caching and concurrency",
         "A request that hit the prefix cache got no block past its hit ones for its first pass.\n"
         "It wrote there into the last hit block, shared: its sharers and later hits read its K/V.",
         "DFlash's drafter and its lookahead positions: here the target's own prefill writes past "
         "the hit blocks.", _PREFIX),
    Case("state-saved-over-drafts",
         "a hybrid under prefix caching and speculation returned garbage or only EOS, now and then",
         "A block completed by a verify pass kept the recurrent states after the pass's drafts.\n"
         "A later request that hit the block started from states fed drafts it had rejected.",
         "vLLM's Mamba block alignment and its EAGLE block drop: the replica's blocks are 2 "
         "tokens, and a request asked again hits the block its prompt's last token ends.",
         _RETRIED),
)
BY_FAULT = {c.fault: c for c in CASES}

