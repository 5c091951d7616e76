"""The page's views, built from a trace alone: focus, chips, grid cells, forensics, lanes."""
import math
import re

import pytest

from specviz.app import glossary, plots, summary, tokens, views
from specviz.app.panel import forensics_html
from specviz.run.runner import run
from specviz.spec.prompts import builtin_set
from specviz.spec.run import TINY_DRAFT, TINY_TARGET, RunSpec
from specviz.trace import metrics, text
from specviz.trace.schema import Trace


def _spec(**kw) -> RunSpec:
    fields = dict(target=TINY_TARGET, draft=TINY_DRAFT, dtype="float64", device="cpu",
                  prompts=tuple(builtin_set("all")[:6]), batch_size=3, k=3, max_new_tokens=16)
    return RunSpec.build(**{**fields, **kw})


@pytest.fixture(scope="module")
def broken(tiny) -> Trace:
    """bsp-like faults: sequences diverge, with sync-bug verdicts."""
    return run(_spec(faults=("bsp-like",)))


@pytest.fixture(scope="module")
def clean(tiny) -> Trace:
    return run(_spec())


def test_default_focus_is_the_first_divergence(broken):
    first = next(s for s in broken.sequences if s.equivalent is False)
    focus, note = views.resolve(broken)
    assert focus.seq == first.seq and note == ""
    rows = views.rows_by_seq(broken)[first.seq]
    emitted_before = 0
    for r in rows:  # the focused round is the one that emitted the first divergent token
        if r.round == focus.round:
            assert emitted_before <= first.first_divergence < emitted_before + len(r.emitted)
        emitted_before += len(r.emitted)


def test_a_focus_outside_the_run_moves_with_a_note(broken):
    focus, note = views.resolve(broken, seq=99)
    assert 0 <= focus.seq < len(broken.sequences) and "not in this run" in note
    other = views.rows_by_seq(broken)[0][0].round
    stranger = next(r.round for r in broken.rows if r.seq != 0
                    and r.round not in {x.round for x in views.rows_by_seq(broken)[0]})
    focus, note = views.resolve(broken, seq=0, round=stranger)
    assert focus.seq == 0 and focus.round != stranger and "took no part" in note
    assert views.resolve(broken, seq=0, round=other) == (views.Focus(0, other), "")


def test_timeline_marks_the_divergent_token_and_every_token_once(broken):
    focus, _ = views.resolve(broken)
    seq = broken.sequences[focus.seq]
    page = tokens.timeline_html(broken, focus)
    forks = re.findall(r'class="sv-tok [^"]*sv-fork[^"]*" data-index="(\d+)"', page)
    assert forks == [str(seq.first_divergence)]
    assert len(re.findall(r'data-index="\d+"', page)) == len(seq.output_ids)
    assert page.count("sv-round sv-sel") == 1
    assert len(re.findall(r"sv-tok sv-rejected", page)) == sum(
        len(r.draft_tokens) - r.accepted for r in views.rows_by_seq(broken)[focus.seq])


def test_grid_has_one_cell_per_round_row_and_marks_forks(broken):
    focus, _ = views.resolve(broken)
    page = tokens.grid_html(broken, focus)
    assert len(re.findall(r'<td class="sv-cell', page)) == len(broken.rows)
    diverged = sum(s.equivalent is False for s in broken.sequences)
    assert len(re.findall(r'class="sv-cell sv-fork', page)) == diverged
    assert page.count("sv-sel") == 1


def test_forensic_panel_follows_the_focused_round(broken):
    focus, _ = views.resolve(broken)
    rounds = [r.round for r in views.rows_by_seq(broken)[focus.seq]]
    a = forensics_html(broken, focus)
    b = forensics_html(broken,
                       views.Focus(focus.seq, rounds[0] if rounds[0] != focus.round else rounds[1]))
    assert "sync-bug" in a and a != b
    assert "✗" in a  # bsp-like breaks an invariant, and the panel shows which


def test_clean_run_says_equal_and_draws_lanes_and_phases(clean):
    focus, _ = views.resolve(clean)
    assert "equals the reference" in forensics_html(clean, focus)
    assert "identical token ids" in tokens.compare_html(clean, focus)
    assert all(v == "yes" for v in summary.summary_frame(clean)["equal"])
    lanes = plots.kv_lanes(clean, focus)
    batch = {r.seq for r in clean.rows if r.batch == views.rows_by_seq(clean)[focus.seq][0].batch}
    assert len(lanes.data) == len(plots.lanes(clean)) * len(batch)
    assert len(plots.phase_timings(clean).data) == len(metrics.PHASES)


def test_a_trace_reads_without_its_tokenizer(clean, tiny):
    back = Trace.from_json(clean.to_json())
    assert back.vocab == clean.vocab and all(isinstance(i, int) for i in back.vocab)
    for s in back.sequences:  # whole characters, as the tokenizer decodes the sequence
        assert text.joined(s.output_pieces) == tiny.tokenizer.decode(s.output_ids)
    assert "100% of sequences equal" in summary.headline(back)
    assert "here" in glossary.glossary(back)


def test_non_speculative_traces_show_tokens_without_rounds(tiny):
    trace = run(_spec(method="batched-reference"))
    focus, _ = views.resolve(trace)
    assert focus.round is None
    assert (tokens.timeline_html(trace, focus).count("data-index")
            == len(trace.sequences[focus.seq].output_ids))
    assert "does not speculate" in tokens.grid_html(trace, focus)


def test_the_forensic_panel_shows_the_evidence_and_the_grid_the_audit(tiny):
    trace = run(_spec(faults=("bsp-like",), audit=3))
    focus, _ = views.resolve(trace)
    panel = forensics_html(trace, focus)
    for label in ("judged against", "rounding tolerance", "state check", "positions fed",
                  "own choice", "audit: first round"):
        assert label in panel, label
    s = trace.sequences[focus.seq]
    assert s.audit_round is not None and s.audit_round <= s.forensics.round
    grid = tokens.grid_html(trace, focus)
    marked = re.findall(r'class="sv-cell[^"]*sv-audit[^"]*" data-seq="(\d+)" data-round="(\d+)"',
                        grid)
    assert (str(s.seq), str(s.audit_round)) in marked
    assert ("rounding tolerance" in glossary.glossary(trace)
            and "here **" in glossary.glossary(trace))


# ---------------------------------------------------------------- sampled runs (temperature > 0)


@pytest.fixture(scope="module")
def drawn(tiny) -> Trace:
    """A sampled run whose engine accepts with min(1, q/p): decisions that do not follow their
    recorded draw."""
    return run(_spec(temperature=0.8, top_p=0.95, faults=("accept-q-over-p",)))


@pytest.fixture(scope="module")
def outside(tiny) -> Trace:
    """A sampled run whose target verifies at temperature 1: tokens outside the target's
    nucleus (impossible)."""
    return run(_spec(temperature=0.8, top_p=0.95, faults=("temperature-draft-only",)))


def _tips(page: str) -> list[tuple[str, str]]:
    """(class, title) of every chip, titles unescaped."""
    import html

    return [(c, html.unescape(t))
            for c, t in re.findall(r'class="sv-tok ([^"]*)"[^>]*title="([^"]*)"', page)]


def test_every_sampled_draft_chip_shows_q_p_the_accept_probability_its_draw_and_the_decision(drawn):
    assert drawn.decisions.mismatches > 0
    flagged, non_draft = [], 0
    for s in drawn.sequences:
        tips = _tips(tokens.timeline_html(drawn, views.Focus(s.seq, None)))
        rows = views.rows_by_seq(drawn)[s.seq]
        emitted = [t for t in tips if "sv-rejected" not in t[0]]
        rejected = [t for t in tips if "sv-rejected" in t[0]]
        assert len(emitted) == len(s.output_ids)
        assert len(rejected) == sum(len(r.draft_tokens) - r.accepted for r in rows)
        drafts = iter([t for t in emitted if "sv-draft" in t[0]])
        others = iter([t for t in emitted if "sv-draft" not in t[0]])
        rejected = iter(rejected)
        for r in rows:
            # the budget may cut a round
            shown_drafts = [j for j, src in enumerate(r.sources) if src == "draft"]
            for j in [*shown_drafts, *range(r.accepted, len(r.draft_tokens))]:
                cls, tip = next(drafts) if j < r.accepted else next(rejected)
                q, p, u = r.draft_probs[j], r.target_draft_probs[j], r.accept_draws[j]
                for shown in (f"draft q {q:.4g}", f"target p {p:.4g}",
                              f"min(1, p/q) {min(1, p / q):.4g}", f"draw u {u:.4g}"):
                    assert shown in tip, (shown, tip)
                if j < r.accepted:
                    assert "ACCEPTED" in tip
                elif j == r.accepted:
                    assert "REJECTED" in tip
                else:
                    assert "not decided" in tip
                if "does not follow its draw" in tip:
                    assert "sv-mismatch" in cls
                    flagged.append([r.round, r.row, j])
            if r.accepted < len(r.emitted):  # the non-draft token: where it was drawn from
                _, tip = next(others)
                non_draft += 1
                where = {"residual": "residual norm(max(0, p − q))",
                         "target": "drawn from the target's p"}
                assert where[r.pick_from] in tip and f"draw v {r.pick_draw:.4g}" in tip
                if r.accepted < len(r.draft_tokens):  # and the rejected draft it replaces
                    assert "the draft proposed" in tip and "REJECTED" in tip
    assert non_draft > 0
    # The chips flag exactly the decisions distribution.py's audit found, computed apart
    # from the views.
    assert (sorted(flagged) == sorted(drawn.decisions.first)
            and len(flagged) == drawn.decisions.mismatches)


def test_a_sampled_run_opens_on_its_evidence_and_its_chips_carry_their_pit(outside):
    focus, _ = views.resolve(outside)
    s = outside.sequences[focus.seq]
    # the first sequence with an impossible token, at the round that emitted it
    first = s.pit.index(None)
    assert all(None not in t.pit for t in outside.sequences[:focus.seq])
    assert focus.round == views.evidence_round(outside, s.seq, views.rows_by_seq(outside)[s.seq])
    page = tokens.timeline_html(outside, focus)
    chips = re.findall(r'class="sv-tok ([^"]*)" data-index="(\d+)" title="([^"]*)"', page)
    assert ([int(i) for c, i, _ in chips if "sv-impossible" in c]
            == [i for i, u in enumerate(s.pit) if u is None])
    assert "IMPOSSIBLE under the target" in chips[first][2]
    assert all(f"PIT {u:.3f}" in t for (_, _, t), u in zip(chips, s.pit) if u is not None)
    grid = tokens.grid_html(outside, focus)
    assert re.search(rf'class="sv-cell[^"]*sv-impossible[^"]*" data-seq="{s.seq}" '
                     rf'data-round="{focus.round}"', grid)


def test_a_sampled_run_claims_no_divergence_and_summarises_its_distribution(outside, clean):
    table = summary.summary_frame(outside)
    assert {"equal", "diverges at", "verdict"}.isdisjoint(table.columns)
    assert list(table["impossible tokens"]) == [str(sum(u is None for u in s.pit))
                                                for s in outside.sequences]
    means = [sum(u for u in s.pit if u is not None) / sum(u is not None for u in s.pit)
             for s in outside.sequences]
    assert list(table["mean PIT"]) == [f"{m:.3f}" for m in means]
    d = outside.distribution
    assert d.verdict == "not the target's distribution" and d.impossible > 0
    row = hostile_free_text(summary.headline(outside))
    assert "equal the batch-size-1 reference" not in row
    assert (f"distribution not the target's distribution 0 impossible tokens {d.tokens} "
            f"{d.impossible} 0 of {outside.decisions.checked}") in row
    assert "sampled at temperature 0.8, top-p 0.95" in row
    # A greedy run keeps its exact and prefix match, and its columns.
    assert "100% of sequences equal the batch-size-1 reference" in summary.headline(clean)
    assert ("| sampled run |" not in summary.headline(clean)
            and "equal" in summary.summary_frame(clean).columns)


def hostile_free_text(markdown: str) -> str:
    from hostile import markdown_text

    return markdown_text(markdown)


def test_the_pit_panel_shows_the_histograms_and_the_verdict(outside, drawn, clean):
    fig = plots.pit_histograms(outside)
    bars = [t for t in fig.data if t.type == "bar"]
    assert len(bars) == min(len(outside.distribution.splits), 12) >= 1
    assert (bars[0].name == "all tokens"
            and sum(bars[0].customdata) == outside.distribution.splits[0].n)
    line = hostile_free_text(summary.distribution_md(outside))
    d = outside.distribution
    alone = min(1, min(x.p for x in d.splits) * len(d.splits))
    assert ("Distribution: not the target's distribution — p = 0: an impossible token rejects "
            f"alone (the PIT splits alone: p = {alone:.3g}, the smallest split's p × "
            f"{len(d.splits)} split") in line
    assert (f"failing: impossible tokens. {d.tokens} tokens tested; {d.impossible} impossible"
            in line)
    assert (f"{outside.decisions.checked} accept/reject decisions re-derived" in line
            and "all follow their draw" in line)
    # Not audited, a wrong rule cannot be told from a corrupt state: said so, with the evidence
    # to get.
    assert line.startswith("unexplained — ") and "were not audited" in line and "--audit" in line
    audit = hostile_free_text(summary.distribution_md(drawn))
    first = ", ".join(f"[{r}, {w}, {j}]" for r, w, j in drawn.decisions.first[:5])
    assert (f"{drawn.decisions.mismatches} do not follow their draw; the first at (round, row, "
            f"slot) {first}" in audit)
    assert audit.startswith("sampler-bug:decisions — The sampler does not follow its own record")
    greedy = plots.pit_histograms(clean)
    assert not greedy.data and "Greedy run" in greedy.layout.annotations[0].text
    assert ("Greedy run" in summary.distribution_md(clean)
            and "judged here" in summary.distribution_md(None))


def test_the_forensic_panel_shows_a_sampled_rounds_draws(drawn):
    s, r = next((drawn.sequences[r.seq], r) for r in drawn.rows if r.accepted < len(r.draft_tokens))
    panel = forensics_html(drawn, views.Focus(s.seq, r.round))
    assert "no token-by-token reference" in panel and "mean PIT" in panel
    rows = re.findall(r'<tr class="sv-(held|broken)"><td>(\d+)</td><td>[^<]*</td>'
                      r'((?:<td>[^<]*</td>){5})</tr>', panel)
    assert [int(j) for _, j, _ in rows] == list(range(len(r.draft_tokens)))
    j = r.accepted
    cells = re.findall(r"<td>([^<]*)</td>", rows[j][2])
    assert cells == [f"{r.draft_probs[j]:.4g}", f"{r.target_draft_probs[j]:.4g}",
                     f"{min(1, r.target_draft_probs[j] / r.draft_probs[j]):.4g}",
                     f"{r.accept_draws[j]:.4g}",
                     "rejected"
                     + (" — does not follow u &lt; p/q" if rows[j][0] == "broken" else "")]
    assert "residual" in panel and f"draw v {r.pick_draw:.4g}" in panel
    assert "one draw" in tokens.compare_html(drawn, views.Focus(s.seq, r.round))


def test_the_sampling_example_is_caught_on_the_tiny_pair(tiny):
    """The page's sampling-fault example, on the tiny pair (the page runs it on the embedded one):
    rejected, and the correct example's settings are not."""
    from specviz.app.form import spec_from_controls
    from specviz.app.runview import EXAMPLES

    def controls(name: str) -> dict:
        return {**EXAMPLES[name], "pair": "tiny"}

    caught = run(spec_from_controls(**controls("sampling fault: draft-only temperature")))
    assert (caught.manifest.spec.faults == ("temperature-draft-only",)
            and caught.manifest.spec.top_p == 0.95)
    d = caught.distribution
    assert d.verdict == "not the target's distribution" and d.p < 0.001
    assert "not the target\\'s distribution" in summary.headline(caught)
    correct = run(spec_from_controls(**controls("sampled eqspec")))
    assert correct.distribution.verdict == "consistent" and correct.decisions.mismatches == 0


def test_a_hostile_sampled_trace_shows_stranger_text_as_text(outside):
    from hostile import HOSTILE, PAYLOADS, hostile_trace, live_markdown, live_markup

    from specviz.app import runview as ui

    trace = hostile_trace(outside)
    d = trace.distribution
    assert (HOSTILE in d.failing and all(HOSTILE in s.name for s in d.splits)
            and all(HOSTILE in n for n in d.skipped))
    for seq in range(len(trace.sequences)):
        out = ui.render(trace, seq)
        for name in ("timeline", "grid", "compare", "forensics"):
            assert live_markup(out[name],
                               {"div", "span", "p", "b", "h4", "table", "thead", "tbody", "tr",
                                "th", "td", "mark"},
                               {"class", "title", "style", "data-seq", "data-round",
                                "data-index"}) == [], name
        assert (live_markdown(out["pit_verdict"]) == []
                and PAYLOADS[0] in hostile_free_text(out["pit_verdict"]))
        assert live_markdown(summary.headline(trace)) == []
        texts = ([a.text for a in out["pit"].layout.annotations]
                 + [t.name or "" for t in out["pit"].data])
        # plotly reads those tags
        assert not any("<img" in t or "<script" in t or "<a " in t for t in texts)
        # shown, escaped: plotly turns the entities to text
        assert any("&lt;img src=x" in t for t in texts)


# -------------------------------------------------------- prompt lookup: per-row drafts, 0 included


@pytest.fixture(scope="module")
def lookup(tiny) -> Trace:
    """Prompt lookup on the tiny pair: in round 0 one row is offered no drafts ("Hi" repeats
    nothing), one the full k (a thrice-repeated sentence) and one fewer (its match runs into the
    prompt's end)."""
    return run(_spec(drafter="lookup", chat_template=False, batch_size=3, k=5, max_new_tokens=6,
                     prompts=("Hi", "Name three rivers. Name three rivers. Name three rivers.",
                              "red blue red blue")))


def _cells(page: str) -> dict[tuple[int, int], tuple[str, str, str]]:
    """(seq, round) -> (class, title, text) of every grid cell, titles unescaped."""
    import html

    return {(int(s), int(r)): (c, html.unescape(t), html.unescape(x))
            for c, s, r, t, x in re.findall(
                r'<td class="(sv-cell[^"]*)" data-seq="(\d+)" data-round="(\d+)" style="[^"]*" '
                r'title="([^"]*)">([^<]*)</td>', page)}


def _had(trace: Trace, row) -> int:
    """Tokens the row's sequence had before the row's round."""
    return sum(len(r.emitted) for r in views.rows_by_seq(trace)[row.seq] if r.round < row.round)


def test_the_grid_counts_each_row_against_its_own_drafts_and_marks_rows_offered_none(lookup):
    rows = lookup.rows
    widest = views.round_widths(lookup)
    none = [r for r in rows if not r.draft_tokens]
    fewer = [r for r in rows if 0 < len(r.draft_tokens) < widest[r.round]]
    assert none and fewer and widest[0] == 5  # the run shows all three kinds in one round
    assert {len(r.draft_tokens) for r in rows if r.round == 0} == {0, 2, 5}
    cells = _cells(tokens.grid_html(lookup, views.resolve(lookup)[0]))
    assert len(cells) == len(rows)
    for r in rows:
        cls, tip, text = cells[r.seq, r.round]
        k = len(r.draft_tokens)
        if k:
            # its own k, not the round's
            assert "sv-nodraft" not in cls and text == f"{r.accepted}/{k}", (cls, text)
            assert f"accepted {r.accepted} of its {k} drafts" in tip
            assert ("the round's widest row was offered 5" in tip) == (r in fewer)
        else:
            assert "sv-nodraft" in cls and text == "—"
            assert "no drafts offered" in tip and "the target's own token alone" in tip
            budget = _had(lookup, r) >= lookup.manifest.spec.max_new_tokens - 1
            assert (("token budget" in tip) == budget
                    and ("no earlier occurrence of its last n-gram, n 1–3" in tip) != budget)
    assert any("prompt lookup found no earlier occurrence" in cells[r.seq, r.round][1]
               for r in none)


def test_the_timeline_shows_a_row_offered_no_drafts_and_only_a_rows_own_slots(lookup):
    widest = views.round_widths(lookup)
    for s in lookup.sequences:
        rows = views.rows_by_seq(lookup)[s.seq]
        page = tokens.timeline_html(lookup, views.Focus(s.seq, rows[0].round))
        tips = _tips(page)
        assert len([t for t in tips if "sv-rejected" not in t[0]]) == len(s.output_ids)
        assert (len([t for t in tips if "sv-rejected" in t[0]])
                == sum(len(r.draft_tokens) - r.accepted for r in rows))
        rounds = re.findall(r'<div class="sv-round[^"]*?( '
                            r'sv-nodrafts)?" data-seq="\d+" data-round="(\d+)" '
                            r'title="([^"]*)"><span class="sv-rn">\d+</span>(<span '
                            r'class="sv-nodraft")?', page)
        assert [int(r) for _, r, _, _ in rounds] == [r.round for r in rows]
        for (marked, _, title, marker), r in zip(rounds, rows):
            empty = not r.draft_tokens
            assert bool(marked) == bool(marker) == empty
            assert ("no drafts offered" in title) == empty
            assert (("others in this round were offered up to" in title)
                    == (0 < len(r.draft_tokens) < widest[r.round]))
        own = [t for c, t in tips if "no drafts were offered" in t]
        # its one token: the target's own, not a "bonus"
        assert len(own) == sum(not r.draft_tokens for r in rows)
        assert not any("all drafts accepted" in t for t in own)
    # The row offered 2 of the round's 5 shows its own 2 drafts, struck through: no empty slots for
    # the others.
    r = next(r for r in lookup.rows if r.round == 0 and len(r.draft_tokens) == 2)
    first = tokens.timeline_html(lookup, views.Focus(r.seq, 0)).split('<div class="sv-round', 2)[1]
    assert (first.count("sv-rejected") == 2 - r.accepted
            and first.count("data-index") == len(r.emitted))


def test_the_forensic_panel_headline_and_lanes_name_the_drafter(lookup):
    r = next(r for r in lookup.rows if r.round == 0 and not r.draft_tokens)
    panel = forensics_html(lookup, views.Focus(r.seq, r.round))
    assert ("<td>drafts offered to this row</td><td>0 (the round&#x27;s widest row: 5) — no drafts "
            "offered" in panel)
    assert "prompt lookup keeps no draft cache" in panel
    line = hostile_free_text(summary.headline(lookup))
    assert ("eqspec on specviz:tiny, drafts by prompt lookup (n-grams 1–3, no draft model), 3 "
            "prompts" in line)
    assert "specviz:tiny-draft" not in line
    model = hostile_free_text(summary.headline(run(_spec(max_new_tokens=4))))
    # the draft model
    assert "drafts by" not in model and "specviz:tiny / specviz:tiny-draft" in model
    focus, _ = views.resolve(lookup)
    lanes = plots.kv_lanes(lookup, focus)
    names = [a.text for a in lanes.layout.annotations]
    assert "draft KV length" not in names and "drafts offered (the row's own k)" in names
    batch = [x for x in lookup.rows if x.batch == r.batch]
    # the last lane
    offered = {t.name: list(t.y) for t in lanes.data if t.yaxis == f"y{len(names)}"}
    assert offered == {f"seq {s}": [len(x.draft_tokens) for x in batch if x.seq == s]
                       for s in sorted({x.seq for x in batch})}
    none = sum(not x.draft_tokens for x in lookup.rows)
    assert f"Rows offered none — here **{none} of {len(lookup.rows)}**" in glossary.glossary(lookup)


def test_per_position_acceptance_counts_only_rows_offered_that_draft(lookup):
    offered = [[r for r in lookup.rows if r.accepted >= j and len(r.draft_tokens) > j]
               for j in range(5)]
    # rows offered none are left out
    assert len(offered[0]) < sum(r.accepted >= 0 for r in lookup.rows)
    want = [sum(r.accepted > j for r in rows) / len(rows) if rows else None
            for j, rows in enumerate(offered)]
    got = metrics.per_position_acceptance(lookup)
    # nan where no row was offered draft j
    assert [None if math.isnan(g) else g for g in got] == want


def test_a_lookup_run_that_found_nothing_to_draft_says_so(tiny):
    trace = run(_spec(drafter="lookup", ngram_min=3, chat_template=False,
                      prompts=("Hi", "Name three rivers."), batch_size=2, max_new_tokens=4))
    assert (trace.rows and not any(r.draft_tokens for r in trace.rows)
            and metrics.acceptance_rate(trace) is None)
    assert "no drafts offered, 1.00 tokens/round" in summary.headline(trace)
    page = tokens.grid_html(trace, views.resolve(trace)[0])
    assert (page.count("sv-nodraft") == len(trace.rows)
            and "no earlier occurrence of its last n-gram, n 3" in page)


def test_a_hostile_lookup_trace_shows_stranger_text_as_text(lookup):
    from hostile import hostile_trace, live_markdown, live_markup

    from specviz.app import runview as ui

    trace = hostile_trace(lookup)
    for seq in range(len(trace.sequences)):
        out = ui.render(trace, seq)
        for name in ("timeline", "grid", "forensics"):
            assert live_markup(out[name],
                               {"div", "span", "p", "b", "h4", "table", "thead", "tbody", "tr",
                                "th", "td"},
                               {"class", "title", "style", "data-seq", "data-round",
                                "data-index"}) == [], name
    assert live_markdown(summary.headline(trace)) == [] and "Speed-up" in summary.headline(trace)


# ---------------------------------------------------------------- the speed-up over the reference


def test_the_summary_says_the_speed_up_over_the_reference_and_where_it_was_timed(clean, lookup,
                                                                                 outside, tiny):
    for trace in (clean, lookup):
        m = trace.manifest
        tps = sum(len(s.output_ids) for s in trace.sequences) / m.decode_seconds
        ref = sum(len(s.reference_ids) for s in trace.sequences) / m.reference_seconds
        assert metrics.speedup(trace)["ratio"] == pytest.approx(tps / ref)
        shown = hostile_free_text(summary.headline(trace, timing="now"))
        assert (f"Speed-up: {tps / ref:.2f}× " in shown and f"{tps:.1f} tokens/s" in shown
                and f"against {ref:.1f} " in shown), shown
        assert ("both measured on this machine in this run" in shown
                and f"Device: {m.device}" in shown)
        assert "batching is part of this ratio" in shown  # batch size 3 against the reference's 1
        assert "when this process first decoded it" in hostile_free_text(
            summary.headline(trace, timing="reused"))
        assert f"when this process first ran this spec, at {m.created}" in hostile_free_text(
            summary.headline(trace, timing="cached"))
        assert (f"when this trace was made, at {m.created}"  # a file
                in hostile_free_text(summary.headline(trace)))
    # No reference time, no claim: a sampled run, the reference itself.
    assert metrics.speedup(outside) is None and "Speed-up" not in summary.headline(outside)
    itself = run(_spec(method="reference", max_new_tokens=4))
    assert metrics.speedup(itself) is None and "Speed-up" not in summary.headline(itself)
    slow = clean.model_copy(update={"manifest": clean.manifest.model_copy(update={
        "decode_seconds": 10 * clean.manifest.reference_seconds})})
    assert ("Speed-up: 0.10× — slower than the batch-size-1 reference"
            in hostile_free_text(summary.headline(slow)))
    even = clean.model_copy(update={"manifest": clean.manifest.model_copy(update={
        "decode_seconds": clean.manifest.reference_seconds * 1.001})})
    assert ("Speed-up: 1.00× the batch-size-1 reference's tokens/s"
            in hostile_free_text(summary.headline(even)))
    line = next(x for x in glossary.glossary(clean).splitlines() if x.startswith("- **speed-up**"))
    assert line.endswith(f" — here **{metrics.speedup(clean)['ratio']:.3g}**")


def test_the_prompt_lookup_example_is_a_batch_size_1_lookup_run_on_the_copying_prompts():
    from specviz.app.page import example_api_name
    from specviz.app.form import spec_from_controls
    from specviz.app.runview import EXAMPLES
    from specviz.spec.prompts import builtin_sets

    name = next(n for n in EXAMPLES if EXAMPLES[n].get("drafter") == "lookup")
    assert example_api_name(name) == "example_prompt"
    spec = spec_from_controls(**EXAMPLES[name])
    assert (spec.method, spec.drafter, spec.batch_size, spec.k) == ("eqspec", "lookup", 1, 5)
    assert (spec.prompts == tuple(builtin_sets()["summarize+code"])
            and spec.target == "specviz:smollm2-135m")
    assert (spec.ngram_min, spec.ngram_max) == (2, 3)
