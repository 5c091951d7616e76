"""The page in a real browser (Debian's Chromium, headless, driven by Playwright): run the bsp-like
example, see the divergence, click the grid, and reopen the share link in a fresh page."""
import json
import re
import shutil
import sys
from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright

ROOT = Path(__file__).resolve().parent.parent
SHOTS = ROOT / "out" / "screenshots"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
DECODE_MS = 600_000  # the embedded pair on a slow shared CPU


@pytest.fixture(scope="module")
def browser():
    chromium = shutil.which("chromium")
    assert chromium, "install Debian's chromium (apt-get install chromium); .ci/run does"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def new_page(browser):
    """Pages for one test, closed when it ends: an open page's renderer keeps taking CPU from the
    decodes that later tests wait on."""
    pages = []

    def make(**kwargs):
        pages.append(browser.new_page(**kwargs))
        return pages[-1]
    yield make
    for page in pages:
        page.close()


def _lines(page, selector: str) -> list[tuple[str, int]]:
    """Each matching element's text and the number of lines it is laid out on."""
    return page.eval_on_selector_all(selector, """els => els.map(e => {
        const r = document.createRange(); r.selectNodeContents(e);
        const tops = new Set([...r.getClientRects()].map(q => Math.round(q.top)));
        return [e.textContent.trim(), tops.size];
    })""")


def test_a_fresh_page_shows_a_real_fork_at_once_then_a_click_and_its_share_link(new_page, app_url):
    SHOTS.mkdir(parents=True, exist_ok=True)
    page = new_page(viewport={"width": 1280, "height": 1000})
    page.goto(app_url)  # no click: the bundled bsp-like trace, focused on its first fork
    expect(page.locator("#sv-grid td.sv-cell.sv-fork.sv-sel")).to_be_visible(timeout=60_000)
    expect(page.locator("#sv-forensics")).to_contain_text("sync-bug")
    expect(page.locator("#sv-timeline .sv-tok.sv-fork")).to_have_count(1)
    status = page.locator("#sv-status")
    expect(status).to_contain_text("You are looking at a real case, bundled with specviz")
    expect(status).to_contain_text("To run your own")
    # plotly has drawn
    expect(page.locator("#sv-lanes .main-svg").first).to_be_visible(timeout=60_000)
    _assert_lanes_stack(page)
    # Beside the verdict, its yardstick: the rounding distribution, the tolerance and the fork's
    # state check on it.
    yardstick = page.locator("#sv-yardstick")
    expect(yardstick.locator(".main-svg").first).to_be_visible(timeout=60_000)
    for name in ("rounding per position", "tolerance (α", "state check:"):
        expect(yardstick).to_contain_text(name)
    expect(page.locator("#sv-forensics")).to_contain_text("judged against")
    # At 1280 px the sequence table's headers break between words, never inside one ("equi
    # vale nt").
    headers = _lines(page, "#sv-table th .header")
    assert headers and all(lines <= len(text.split()) for text, lines in headers), headers
    table, last = (page.locator("#sv-table").bounding_box(),
                   page.locator("#sv-table th").last.bounding_box())
    # every column in view, none scrolled off
    assert last["x"] + last["width"] <= table["x"] + table["width"] + 1
    page.screenshot(path=SHOTS / "first-page.png", full_page=True)
    grid_bottom = page.locator("#sv-grid").bounding_box()
    # down to the grid: the README's screenshot
    page.screenshot(path=SHOTS / "first-page-top.png", full_page=True,
                    clip={"x": 0, "y": 0, "width": 1280,
                          "height": grid_bottom["y"] + grid_bottom["height"] + 16})
    # docs/lanes.png (this scrolls the page)
    page.locator("#sv-lanes").screenshot(path=SHOTS / "lanes.png")

    selected = page.locator("#sv-grid td.sv-cell.sv-sel")
    seq = selected.get_attribute("data-seq")
    before = page.inner_text("#sv-forensics")
    other = page.locator(f'#sv-grid td.sv-cell[data-seq="{seq}"]:not(.sv-sel)').first
    round_ = other.get_attribute("data-round")
    other.click()
    expect(page.locator("#sv-forensics .sv-forensics")).to_have_attribute("data-round", round_,
                                                                          timeout=60_000)
    after = page.inner_text("#sv-forensics")
    assert after != before and f"Round {round_}," in after
    # the address bar is the share link
    expect(page).to_have_url(re.compile(rf"\?run=.*&seq={seq}&round={round_}$"))
    page.screenshot(path=SHOTS / "bsp-like-clicked.png", full_page=True)

    fresh = new_page(viewport={"width": 1280, "height": 1000})
    fresh.goto(page.url)
    expect(fresh.locator("#sv-status")).to_contain_text("matched the shared run exactly",
                                                        timeout=DECODE_MS)
    # The views are drawn after the status says so (on a busy machine, seconds after).
    cell = fresh.locator(f'#sv-grid td.sv-cell.sv-sel[data-seq="{seq}"]')
    expect(cell).to_have_attribute("data-round", round_, timeout=60_000)
    expect(fresh.locator("#sv-timeline .sv-tok.sv-fork")).to_have_count(1)
    assert fresh.inner_text("#sv-forensics") == after
    expect(fresh.locator("#sv-lanes .main-svg").first).to_be_visible(timeout=60_000)
    fresh.screenshot(path=SHOTS / "share-link.png", full_page=True)


def _assert_lanes_stack(page) -> None:
    """The KV and padding lanes as drawn: each lane's plot area (plotly's drag rectangle) apart from
    the others, top to bottom, and each lane's title in its own lane, between the lane above and its
    own plot area."""
    drawn = page.evaluate("""() => {
        const box = e => {
            const r = e.getBoundingClientRect();
            return [r.top, r.bottom, r.left, r.right];
        };
        return {
            plots: [...document.querySelectorAll('#sv-lanes .draglayer .nsewdrag')].map(box),
            titles: [...document.querySelectorAll('#sv-lanes g.annotation')]
                .map(a => [a.textContent, box(a)]),
        };
    }""")
    plots = sorted(drawn["plots"])
    # the bsp-like case: a draft model's six lanes
    assert len(plots) == 6 and len(drawn["titles"]) == 6, drawn
    assert all(above[1] <= below[0] for above, below in zip(plots, plots[1:])), plots
    titles = sorted(drawn["titles"], key=lambda t: t[1][0])
    for i, ((text, (top, bottom, left, right)), plot) in enumerate(zip(titles, plots)):
        floor = plots[i - 1][1] if i else 0
        assert floor <= top and bottom <= plot[0] + 1, (text, (top, bottom), plot, floor)
        assert plot[2] <= left and right <= plot[3], (text, (left, right), plot)


def test_at_phone_width_the_page_opens_on_the_case_and_never_scrolls_sideways(new_page, app_url):
    SHOTS.mkdir(parents=True, exist_ok=True)
    page = new_page(viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True,
                    has_touch=True)
    page.goto(app_url)
    expect(page.locator("#sv-grid td.sv-cell.sv-fork.sv-sel")).to_be_visible(timeout=60_000)
    expect(page.locator("#sv-forensics")).to_contain_text("sync-bug")
    width = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    # wide things (the grid, the table) scroll inside their own boxes
    assert width[0] <= width[1], width
    # The case comes before the controls: a phone's first screen is the welcome line and the
    # verdict, not a form.
    status_y = page.locator("#sv-status").bounding_box()["y"]
    assert status_y < page.get_by_role("button", name="Run", exact=True).bounding_box()["y"]
    assert status_y < 844
    page.screenshot(path=SHOTS / "phone.png")
    page.screenshot(path=SHOTS / "phone-full.png", full_page=True)


def _open_trace_file(page, app_url: str, path) -> None:
    """Load the page and open a trace file through its "open a trace" control,
    as a visitor would."""
    page.goto(app_url)
    cells = page.locator("#sv-grid td.sv-cell")
    expect(cells.first).to_be_visible(timeout=60_000)  # the first page's bundled trace is in
    # Its views stay until the file's replace them (the status line says "opened" a step before):
    # mark them.
    page.evaluate("document.querySelectorAll('#sv-grid td.sv-cell').forEach(td => "
                  "td.dataset.stale = '1')")
    page.get_by_text("Trace files").click()
    page.locator("#sv-upload input[type=file]").set_input_files(str(path))
    expect(page.locator("#sv-status")).to_contain_text("opened from a file", timeout=60_000)
    expect(page.locator("#sv-grid td.sv-cell[data-stale]")).to_have_count(0, timeout=60_000)
    expect(cells.first).to_be_visible(timeout=60_000)
    expect(page.locator("#sv-timeline .sv-tok").first).to_be_visible(timeout=60_000)


def test_a_hostile_trace_runs_no_script_and_asks_no_other_origin(new_page, app_url, hostile,
                                                                 tmp_path):
    from hostile import EVIL, HOSTILE, PAYLOADS

    from specviz.trace import share

    SHOTS.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "hostile.json"
    path.write_text(hostile.to_json())
    page = new_page(viewport={"width": 1400, "height": 1000})
    asked = []
    page.on("request", lambda r: asked.append(r.url))
    _open_trace_file(page, app_url, path)
    expect(page.locator("#sv-forensics")).to_contain_text(PAYLOADS[0])  # shown, as text
    expect(page.locator("#sv-table")).to_contain_text("<script>")
    # the payloads' onmouseover, were they live
    for chip in page.locator("#sv-timeline .sv-tok").all()[:6]:
        chip.hover()
    page.get_by_role("tab", name="Glossary").click()
    # the top of the page: status, table, grid, forensics
    page.screenshot(path=SHOTS / "hostile-trace.png")
    # A link naming models this server refuses: the error quotes them, in a toast.
    page.goto(app_url
              + share.encode_link(share.Link(hostile.manifest.spec, 0, 0, None,
                                             {HOSTILE[:150]: HOSTILE[:200]})))
    expect(page.get_by_text("cannot be replayed here")).to_be_visible(timeout=60_000)
    expect(page.get_by_text("is not allowed on this server").first).to_be_visible()
    page.wait_for_timeout(1000)  # an image the toast let through would have been asked for by now
    assert page.evaluate("window.__pwned") is None
    origin = app_url.rstrip("/")
    assert [u for u in asked if not u.startswith(origin + "/")] == [], f"asked {EVIL}?"
    # The sentinel works: the same payload, made live on purpose, sets it.
    page.evaluate("p => { document.body.insertAdjacentHTML('beforeend', p) }", PAYLOADS[0])
    page.wait_for_function("window.__pwned === 1")


def test_cjk_and_emoji_show_whole_characters_in_the_compare_view(new_page, app_url, cjk_emoji,
                                                                 embedded, tmp_path):
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "cjk-emoji.json"
    path.write_text(cjk_emoji.to_json())
    page = new_page(viewport={"width": 1400, "height": 1000})
    _open_trace_file(page, app_url, path)
    for s in cjk_emoji.sequences[:2]:  # the CJK prompt, then the emoji one
        page.locator(f'#sv-grid th.sv-seq[data-seq="{s.seq}"]').click()
        texts = page.locator("#sv-compare .sv-text")
        expect(texts.nth(1)).to_have_text(embedded.tokenizer.decode(s.output_ids), timeout=60_000)
        expect(texts.nth(0)).to_have_text(embedded.tokenizer.decode(s.reference_ids))
        page.locator("#sv-compare").screenshot(path=SHOTS / f"cjk-emoji-{s.seq}.png")
    page.screenshot(path=SHOTS / "cjk-emoji.png", full_page=True)


@pytest.fixture(scope="module")
def sampled_trace(tiny, tmp_path_factory):
    """The page's sampling-fault example (temperature on the draft only) run on the tiny pair, as a
    trace file."""
    from specviz.app.form import spec_from_controls
    from specviz.app.runview import EXAMPLES
    from specviz.run.runner import run

    trace = run(spec_from_controls(**{**EXAMPLES["sampling fault: draft-only temperature"],
                                      "pair": "tiny"}))
    path = tmp_path_factory.mktemp("sampled") / "sampled.json"
    path.write_text(trace.to_json())
    return trace, path


@pytest.fixture(scope="module")
def audited_trace(tmp_path_factory, tiny):
    """The page's audited sampling example (bsp-like), on the tiny pair."""
    from specviz.app.form import spec_from_controls
    from specviz.app.runview import EXAMPLES
    from specviz.run.runner import run

    trace = run(spec_from_controls(**{**EXAMPLES["audited sampling: bsp-like state"],
                                      "pair": "tiny"}))
    assert any(s.forensics for s in trace.sequences), "bsp-like must corrupt some row's state"
    path = tmp_path_factory.mktemp("audited") / "audited.json"
    path.write_text(trace.to_json())
    return trace, path


def test_an_audited_sampled_fault_opens_on_its_corrupt_round_with_its_verdict(new_page, app_url,
                                                                              audited_trace):
    trace, path = audited_trace
    first = min((s for s in trace.sequences if s.forensics),
                key=lambda s: (s.forensics.round, s.seq))
    page = new_page(viewport={"width": 1400, "height": 1000})
    _open_trace_file(page, app_url, path)
    # the corrupt round, outlined and focused
    cell = page.locator("#sv-grid td.sv-cell.sv-fork.sv-sel")
    expect(cell).to_be_visible(timeout=60_000)
    assert ((cell.get_attribute("data-seq"), cell.get_attribute("data-round"))
            == (str(first.seq), str(first.forensics.round)))
    expect(page.locator("#sv-forensics")).to_contain_text(first.forensics.verdict)
    expect(page.locator("#sv-pit-verdict")).to_contain_text(f"{first.forensics.verdict} — The "
                                                            "target state of")
    page.screenshot(path=SHOTS / "audited-sampled.png", full_page=True)


def test_a_sampled_trace_shows_its_pit_panel_verdict_and_each_drafts_draws(new_page, app_url,
                                                                           sampled_trace):
    trace, path = sampled_trace
    SHOTS.mkdir(parents=True, exist_ok=True)
    page = new_page(viewport={"width": 1400, "height": 1000})
    _open_trace_file(page, app_url, path)
    verdict = page.locator("#sv-pit-verdict")
    expect(verdict).to_contain_text("Distribution: not the target's distribution", timeout=60_000)
    expect(verdict).to_contain_text(f"{trace.distribution.impossible} impossible")
    expect(verdict).to_contain_text("Decision audit")
    # plotly has drawn
    expect(page.locator("#sv-pit .main-svg").first).to_be_visible(timeout=60_000)
    expect(page.locator("#sv-pit")).to_contain_text("all tokens")
    expect(page.locator("#sv-status")).to_contain_text("sampled at temperature 0.8, top-p 0.95")
    expect(page.locator("#sv-table")).to_contain_text("mean PIT")
    # The page opens on the first impossible token's round; its chip says so, and every draft chip
    # its draws.
    expect(page.locator("#sv-timeline .sv-tok.sv-impossible").first).to_be_visible()
    chip = page.locator("#sv-timeline .sv-tok.sv-draft").first
    chip.hover()
    tip = chip.get_attribute("title")
    assert all(part in tip
               for part in ("draft q", "target p", "min(1, p/q)", "draw u", "ACCEPTED")), tip
    expect(page.locator("#sv-forensics")).to_contain_text("min(1, p/q)")
    page.locator("#sv-distribution").screenshot(path=SHOTS / "pit-panel.png")
    page.screenshot(path=SHOTS / "sampled-trace.png", full_page=True)


def test_prompt_lookup_example_says_its_speed_up_and_shows_rows_offered_no_drafts(new_page, app_url,
                                                                                  embedded):
    SHOTS.mkdir(parents=True, exist_ok=True)
    page = new_page(viewport={"width": 1400, "height": 1000})
    page.goto(app_url)
    # the first page is in
    expect(page.locator("#sv-grid td.sv-cell.sv-fork.sv-sel")).to_be_visible(timeout=60_000)
    expect(page.locator("#sv-ngram-min")).to_be_hidden()  # the draft model: no n-gram sizes
    page.get_by_role("button", name="prompt lookup: summaries and code edits").click()
    # The example's drafter is prompt lookup: its n-gram sizes come with the example's values,
    # before its decode.
    expect(page.locator("#sv-ngram-min")).to_be_visible(timeout=60_000)
    expect(page.locator("#sv-ngram-min input[type=number]")).to_have_value("2")
    status = page.locator("#sv-status")
    # (the first page's bundled case states a speed-up too: wait for this run's own words)
    expect(status).to_contain_text("drafts by prompt lookup (n-grams 2–3, no draft model)",
                                   timeout=DECODE_MS)
    expect(status).to_contain_text("Speed-up:")
    said = " ".join(status.inner_text().split())
    assert re.search(r"Speed-up: \d+\.\d\d× (the batch-size-1 reference's tokens/s|— "
                     r"(faster|slower) than the batch-size-1 reference): \d+\.\d tokens/s \(\d+ "
                     r"tokens in \d+\.\d\d s\) against \d+\.\d \(\d+ tokens in "
                     r"\d+\.\d\d s\), (both|the run's) measured on this machine in this run",
                     said), said
    # batch size 1: the ratio is prompt lookup's alone
    assert "batching is part of this ratio" not in said
    # Rows offered no drafts beside rows offered some; one of the focused sequence's, clicked, opens
    # its round.
    expect(page.locator("#sv-grid td.sv-cell.sv-nodraft").first).to_be_visible()
    assert page.locator("#sv-grid td.sv-cell:not(.sv-nodraft)").count() > 0
    seq = page.locator("#sv-grid td.sv-cell.sv-sel").get_attribute("data-seq")
    cell = page.locator(f'#sv-grid td.sv-cell.sv-nodraft[data-seq="{seq}"]').first
    assert cell.inner_text() == "—" and "no drafts offered" in cell.get_attribute("title")
    round_ = cell.get_attribute("data-round")
    cell.click()
    expect(page.locator("#sv-forensics .sv-forensics")).to_have_attribute("data-round", round_,
                                                                          timeout=60_000)
    expect(page.locator("#sv-forensics")).to_contain_text("no drafts offered")
    focused = page.locator("#sv-timeline .sv-round.sv-sel")
    expect(focused.locator(".sv-nodraft")).to_have_text("no drafts")
    expect(focused.locator(".sv-tok")).to_have_count(1)  # the target's own token alone
    assert "no drafts were offered" in focused.locator(".sv-tok").get_attribute("title")
    page.screenshot(path=SHOTS / "example-prompt-lookup.png", full_page=True)
    page.locator("#sv-grid").screenshot(path=SHOTS / "example-prompt-lookup-grid.png")
    # The link restores the drafter and its n-grams, and replays the run (from this
    # process's cache).
    fresh = new_page(viewport={"width": 1400, "height": 1000})
    fresh.goto(page.url)
    expect(fresh.locator("#sv-status")).to_contain_text("matched the shared run exactly",
                                                        timeout=DECODE_MS)
    expect(fresh.locator("#sv-status")).to_contain_text("when this process first ran this spec")
    expect(fresh.locator("#sv-drafter input")).to_have_value("lookup")
    expect(fresh.locator("#sv-ngram-min input[type=number]")).to_have_value("2")
    expect(fresh.locator("#sv-ngram-max input[type=number]")).to_have_value("3")
    expect(fresh.locator("#sv-grid td.sv-cell.sv-sel")).to_have_attribute("data-round", round_)


def _heat_cell(page, metric: str, label: str, column: int):
    """The heatmap cell of run `label` (method · faults) in its `column`-th (batch size,
    k) column."""
    row = page.locator(f"#sv-sweep-{metric} tr").filter(has=page.locator("th.sv-hlabel",
                                                                         has_text=label))
    return row.locator("td").nth(column)


def test_a_sweep_shows_where_equivalence_breaks_a_cell_opens_its_run_and_compare_finds_the_fork(
        new_page, app_url, tiny):
    SHOTS.mkdir(parents=True, exist_ok=True)
    page = new_page(viewport={"width": 1280, "height": 1000})
    page.goto(app_url)
    page.get_by_role("tab", name="Sweep").click()
    # The tab's defaults (eqspec with no fault, bsp-like and dsd-like, at bs 1, 4 and 8, k 5, on the
    # quick prompts) on the tiny pair in float64, where a correct engine equals the reference
    # exactly: the page is under test here.
    _pick(page, "#sv-sweep-pair", "tiny")
    _pick(page, "#sv-sweep-dtype", "float64")
    page.locator("#sv-sweep-run").click()
    expect(page.locator("#sv-sweep-exact td.sv-hcell")).to_have_count(9, timeout=DECODE_MS)
    for column in range(3):
        expect(_heat_cell(page, "exact", "eqspec", column)).to_have_text("100")
    for fault in ("eqspec · bsp-like", "eqspec · dsd-like"):
        below = [int(_heat_cell(page, "exact", fault, c).inner_text()) for c in range(3)]
        assert all(v <= 100 for v in below) and min(below) < 100, (fault, below)
        assert int(_heat_cell(page, "exact", fault, 1).inner_text()) < 100  # at bs 4
    expect(page.locator("#sv-sweep-summary")).to_contain_text("9 runs")
    for plot in ("verdicts", "divergence", "accept", "acceptance"):
        expect(page.locator(f"#sv-sweep-{plot} .main-svg").first).to_be_visible(timeout=60_000)
    expect(page.locator("#sv-sweep-verdicts")).to_contain_text("sync-bug")
    link = page.locator("#sv-sweep-link input, #sv-sweep-link textarea").first.input_value()
    assert "?sweep=" in link
    page.screenshot(path=SHOTS / "sweep.png", full_page=True)

    # dsd-like at batch size 4: its run opens in the run view, focused on a fork.
    _heat_cell(page, "exact", "eqspec · dsd-like", 1).click()
    expect(page.locator("#sv-status")).to_contain_text("run 8 of the sweep", timeout=DECODE_MS)
    expect(page.locator("#sv-status")).to_contain_text("dsd-like")
    expect(page.locator("#sv-grid td.sv-cell.sv-fork.sv-sel")).to_be_visible(timeout=60_000)
    expect(page.locator("#sv-forensics")).to_contain_text("sync-bug")
    page.screenshot(path=SHOTS / "sweep-cell-opened.png", full_page=True)

    # bsp-like at bs 4 in the run view: the index its table reports is where compare marks eqspec
    # and it parting.
    page.get_by_role("tab", name="Sweep").click()
    dsd_like = page.url  # the run view's share link
    _heat_cell(page, "exact", "eqspec · bsp-like", 1).click()
    expect(page.locator("#sv-status")).to_contain_text("run 5 of the sweep", timeout=DECODE_MS)
    # the run view has rendered bsp-like's run
    expect(page).not_to_have_url(dsd_like, timeout=60_000)
    seq = page.locator("#sv-grid td.sv-cell.sv-sel").get_attribute("data-seq")
    # the run view's texts, side by side
    note = page.locator(f'#sv-compare .sv-compare[data-seq="{seq}"] .sv-note')
    expect(note).to_contain_text(re.compile(r"first divergence at token \d+"))
    fork = re.search(r"first divergence at token (\d+)", note.inner_text()).group(1)
    page.get_by_role("tab", name="Compare two runs").click()
    _pick(page, "#sv-compare-a", "eqspec · bs 4 · k 5 · sweep")
    _pick(page, "#sv-compare-b", "eqspec · bsp-like · bs 4 · k 5 · sweep")
    page.locator("#sv-compare-seq input").fill(seq)
    page.locator("#sv-compare-seq input").press("Enter")
    aligned = page.locator(f'#sv-compare-aligned .sv-sbs[data-seq="{seq}"]')
    expect(aligned).to_have_attribute("data-first", fork, timeout=60_000)
    # reference, A and B
    expect(aligned.locator(f'td.sv-first[data-index="{fork}"]')).to_have_count(3)
    expect(page.locator("#sv-compare-summary")).to_contain_text(f"first differ at token {fork}")
    page.screenshot(path=SHOTS / "compare.png", full_page=True)

    # The comparison's link opens a fresh page on the Compare tab, the same two runs and sequence,
    # the same fork.
    compared = page.locator("#sv-compare-link input, #sv-compare-link textarea").first
    expect(compared).to_have_value(re.compile(rf"\?compare=.*seq={seq}"), timeout=60_000)
    shared = new_page(viewport={"width": 1280, "height": 1000})
    shared.goto(compared.input_value())
    expect(shared.get_by_role("tab", name="Compare two runs")).to_have_attribute("aria-selected",
                                                                                 "true",
                                                                                 timeout=60_000)
    again = shared.locator(f'#sv-compare-aligned .sv-sbs[data-seq="{seq}"]')
    expect(again).to_have_attribute("data-first", fork, timeout=DECODE_MS)
    expect(shared.locator("#sv-compare-summary")).to_contain_text(f"first differ at token {fork}")
    shared.close()

    # The sweep's link replays it in a fresh page (from this process's cache).
    fresh = new_page(viewport={"width": 1280, "height": 1000})
    fresh.goto(link)
    expect(fresh.locator("#sv-sweep-exact td.sv-hcell")).to_have_count(9, timeout=DECODE_MS)
    expect(fresh.locator("#sv-sweep-status")).to_contain_text("replayed on this server")
    cells = "els => els.map(e => e.dataset.run + ':' + e.textContent)"
    assert (fresh.eval_on_selector_all("#sv-sweep-exact td.sv-hcell", cells)
            == page.eval_on_selector_all("#sv-sweep-exact td.sv-hcell", cells))


def _pick(page, dropdown: str, label: str) -> None:
    page.locator(f"{dropdown} input").click()
    page.locator(dropdown).get_by_role("option", name=label, exact=True).click()
    expect(page.locator(f"{dropdown} input")).to_have_value(label)


def test_a_verify_json_report_written_by_the_cli_opens_in_the_sweep_view(new_page, app_url, tiny,
                                                                         tmp_path):
    from specviz.cli.main import main
    from specviz.trace.sweep import SweepReport

    path = tmp_path / "verify.json"
    assert main(["verify", "--pair", "tiny", "--device", "cpu", "--methods", "eqspec",
                 "--fault-sets", "none", "bsp-like", "--batch-sizes", "1,4", "--k", "3",
                 "--max-new-tokens", "12", "--allow-divergence", "--json", str(path)]) == 0
    report = SweepReport.from_json(path.read_text())
    page = new_page(viewport={"width": 1280, "height": 1000})
    page.goto(app_url)
    page.get_by_role("tab", name="Sweep").click()
    page.locator("#sv-sweep-upload input[type=file]").set_input_files(str(path))
    cells = page.locator("#sv-sweep-exact td.sv-hcell")
    expect(cells).to_have_count(len(report.rows), timeout=60_000)
    shown = {int(cells.nth(i).get_attribute("data-run")): cells.nth(i).inner_text()
             for i in range(len(report.rows))}
    # the file's numbers
    assert all(abs(int(shown[i]) - r.exact_pct) < 1 for i, r in enumerate(report.rows)), shown
    # eqspec at bs 1 equals the reference; bsp-like at bs 4 does not
    assert shown[0] == "100" and shown[3] != "100"
    expect(page.locator("#sv-sweep-summary")).to_contain_text("4 runs")
    page.screenshot(path=SHOTS / "sweep-from-verify-json.png", full_page=True)


def test_a_field_case_opens_from_its_card_at_its_fork_and_its_share_link_replays_it(
        new_page, app_url, tmp_path):
    from specviz.engines.process import free_port, serving
    from specviz.spec.casebook import CASES

    SHOTS.mkdir(parents=True, exist_ok=True)
    case = next(c for c in CASES if c.expected and not c.lossless)  # the first that forks
    page = new_page(viewport={"width": 1280, "height": 1000})
    page.goto(app_url)
    cells = page.locator("#sv-grid td.sv-cell")
    expect(cells.first).to_be_visible(timeout=60_000)  # the first page's bundled trace is in
    page.get_by_role("tab", name="Field cases").click()
    expect(page.locator("#sv-cases article.sv-case")).to_have_count(len(CASES))
    card = page.locator(f"#sv-case-{case.fault}")
    expect(card.locator("a").first).to_have_attribute("target", "_blank")
    page.screenshot(path=SHOTS / "casebook.png", full_page=True)  # docs/casebook.png
    # The first page's views stay until the case's replace them: mark them.
    page.evaluate("document.querySelectorAll('#sv-grid td.sv-cell').forEach(td => "
                  "td.dataset.stale = '1')")
    card.get_by_role("button", name="Open this case").click()
    expect(page.locator("#sv-status")).to_contain_text(f"Field case: {case.title}", timeout=60_000)
    expect(page.get_by_role("tab", name="Run view")).to_have_attribute("aria-selected", "true")
    expect(page.locator("#sv-grid td.sv-cell[data-stale]")).to_have_count(0, timeout=60_000)
    # focused on its first fork, with its verdict
    fork = page.locator("#sv-grid td.sv-cell.sv-fork.sv-sel")
    expect(fork).to_be_visible(timeout=60_000)
    expect(page.locator("#sv-forensics")).to_contain_text(case.expected)
    seq, round_ = fork.get_attribute("data-seq"), fork.get_attribute("data-round")
    expect(page).to_have_url(re.compile(rf"\?run=.*&seq={seq}&round={round_}$"), timeout=60_000)
    page.screenshot(path=SHOTS / "casebook-opened.png", full_page=True)

    # Its link replays it in a fresh process, `python app.py` with nothing cached: from the bundle,
    # as it says.
    port = free_port()
    with serving("python app.py", [sys.executable, str(ROOT / "app.py")],
                 {"GRADIO_SERVER_PORT": str(port)}, tmp_path / "app.log",
                 f"http://127.0.0.1:{port}", "/", 300):
        _replays_in(new_page, f"http://127.0.0.1:{port}/?" + page.url.partition("?")[2], case, seq,
                    round_)


def _replays_in(new_page, link: str, case, seq: str, round_: str) -> None:
    """The case's share link, opened: its fork and verdict; then the Sweep tab runs
    the whole casebook."""
    from specviz.spec.casebook import CASES

    fresh = new_page(viewport={"width": 1280, "height": 1000})
    fresh.goto(link)
    status = fresh.locator("#sv-status")
    expect(status).to_contain_text("matched the shared run exactly", timeout=DECODE_MS)
    expect(status).to_contain_text("bundled with specviz")
    # The views are drawn after the status says so (on a busy machine, seconds after).
    cell = fresh.locator(f'#sv-grid td.sv-cell.sv-fork.sv-sel[data-seq="{seq}"]')
    expect(cell).to_have_attribute("data-round", round_, timeout=60_000)
    expect(fresh.locator("#sv-forensics")).to_contain_text(case.expected)

    # The Sweep tab runs the whole casebook as one sweep: a cell for each case (each run
    # from the bundle).
    fresh.get_by_role("tab", name="Sweep").click()
    fresh.locator("#sv-sweep-casebook").click()
    expect(fresh.locator("#sv-sweep-exact td.sv-hcell")).to_have_count(len(CASES),
                                                                       timeout=DECODE_MS)
    expect(fresh.locator("#sv-sweep-summary")).to_contain_text(f"{len(CASES)} runs")
    fresh.screenshot(path=SHOTS / "casebook-sweep.png", full_page=True)


def test_an_engine_check_draws_the_rounds_it_reported_seen_from_outside(new_page, app_url, tiny,
                                                                        tmp_path):
    """An engine that reports only how many drafts each round kept (OpenVINO's steps): the grid
    draws its rounds, request by request, and the timeline groups each output's tokens so."""
    from specviz.decoding.reference import reference
    from specviz.run import check
    from specviz.spec.run import TINY_DRAFT, TINY_TARGET, RunSpec

    spec = RunSpec.build(method="engine", target=TINY_TARGET, draft=TINY_DRAFT, dtype="float64",
                         device="cpu", prompts=("Name three rivers.", "Count to ten."),
                         max_new_tokens=12, k=3)
    ids = tiny.encode(list(spec.prompts))
    lines = []
    for prompt, out in zip(ids, reference(tiny, ids, 12).outputs):
        cut = [1] + [3] * ((len(out.ids) - 1) // 3)
        cut += [len(out.ids) - sum(cut)] if len(out.ids) > sum(cut) else []
        rounds = [{"drafts": [], "accepted": max(c - 1, 0), "shown": i == 0}
                  for i, c in enumerate(cut)]
        lines.append(json.dumps({"prompt_ids": prompt, "output_ids": out.ids, "rounds": rounds}))
    trace = check.from_files(spec, tiny, ("\n".join(lines).encode(), "outputs.jsonl"))
    path = tmp_path / "engine.json"
    path.write_text(trace.to_json())
    page = new_page(viewport={"width": 1280, "height": 900})
    _open_trace_file(page, app_url, path)
    cells = page.locator("#sv-grid table.sv-engine-grid td.sv-cell")
    expect(cells).to_have_count(sum(len(s.engine.rounds) - 1 for s in trace.sequences))
    assert "seen from outside" in cells.first.get_attribute("title")
    expect(cells.first).to_have_text("2/3")  # 2 drafts kept, of the engine's k
    rounds = page.locator("#sv-timeline .sv-round")
    expect(rounds).to_have_count(len(trace.sequences[0].engine.rounds))
    # a click on the other request's round focuses that request
    page.locator('#sv-grid td.sv-cell[data-seq="1"]').first.click()
    expect(page.locator("#sv-timeline .sv-timeline")).to_have_attribute("data-seq", "1",
                                                                        timeout=60_000)
    page.locator("#sv-grid").screenshot(path=SHOTS / "engine-rounds-grid.png")
