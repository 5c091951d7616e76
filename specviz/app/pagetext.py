"""The page's fixed words and scripts: its intro, the acceptance grid's help, the token legend, and
the JavaScript it runs in the browser (clicks on a round, the share link in the address bar)."""
from __future__ import annotations

CLICKS = """
element.addEventListener('click', (e) => {
  const c = e.target.closest('[data-round]');
  if (c && c.dataset.round !== '') {
    trigger('click', {seq: Number(c.dataset.seq), round: Number(c.dataset.round)});
  }
});
"""
# After every render: put the link in the address bar and the share box.
UPDATE_URL = """
(q) => {
  if (!q) return '';
  history.replaceState(null, '', location.pathname + q);
  return location.origin + location.pathname + q;
}
"""
# The Compare tab's link, whole, without taking the address bar from the Run view's.
FULL_URL = "(q) => q ? location.origin + location.pathname + q : ''"
PAGE_INTRO = """# specviz
Batch speculative decoding, checked token by token against the target model alone — or, for a
sampled run (temperature above 0), by whether its tokens are drawn from the target's distribution.
Pick an example or set up a run; every view below follows one focused sequence and round — click a
grid cell, a round in the timeline or a table row to move it. The address bar is always a share
link."""
LEGEND = ('<div class="sv-legend"><span class="sv-tok sv-draft">accepted draft</span>'
          '<span class="sv-tok sv-correction">target correction</span>'
          '<span class="sv-tok sv-bonus">bonus</span>'
          '<span class="sv-tok sv-rejected">rejected draft</span>'
          '<span class="sv-tok sv-fork">first divergence</span>'
          '<span class="sv-tok sv-draft sv-branch">accepted off a token tree\'s first branch</span>'
          '<span class="sv-tok sv-impossible">impossible under the target</span>'
          '<span class="sv-tok sv-mismatch">decision against its draw</span>'
          '<span class="sv-nodraft">no drafts offered: the target\'s own token follows</span>'
          "</div>")
GRID_HELP = ("### Acceptance grid — sequences × their rounds, accepted / drafts offered "
             "(click a cell)\n"
             "Each cell counts against the drafts its own row was offered, which prompt lookup and "
             "the token budget make differ between rows; a hatched — cell: no drafts offered, the "
             "target's own token alone; an underlined cell: a token tree, counted along the path "
             "it accepted (its accepted nodes, and the first child refused). Red outline: the "
             "round that emitted a sequence's first divergence. Violet corner (audited runs): the "
             "round a row's state first left rounding. Sampled runs: a red corner marks a round "
             "that emitted a token impossible under the target, a dotted violet outline a decision "
             "that does not follow its draw.")
