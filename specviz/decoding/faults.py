"""The faults as the engine meets them: each fault (spec/faults.py) swaps one decision of the
correct engine, faithful to what the paper found in published batch implementations. The engine
asks a `Policy` at each decision point; with no faults the policy is the correct engine. Faults
compose: any set can be asked for."""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from specviz.decoding import trees
from specviz.decoding.batch import positions as mask_positions
from specviz.decoding.grammar import Matcher
from specviz.decoding.sampling import (ACCEPT, DRAFT, Row, Sampler, Samplers, Streams,
                                       inverse_cdf)
from specviz.decoding.trees import Tree
from specviz.spec.faults import FAULTS, expand, needing


@dataclass(frozen=True)
class Policy:
    """The engine's swappable decisions. `Policy(())` is the correct engine."""

    faults: tuple[str, ...] = ()

    # presets expanded: a name the engine does not know raises, never runs correct
    def __post_init__(self) -> None:
        object.__setattr__(self, "faults", expand(self.faults))

    def has(self, fault: str) -> bool:
        return fault in self.faults

    def positions(self, valid: torch.Tensor, stale: torch.Tensor) -> torch.Tensor:
        """Position ids for every slot of the layout.

        From slots, a position counts every slot the row occupies before it:
        with left padding the pads too; with right padding (the row's storage
        starts at slot 0 and its pads lie beyond) only real and stale slots."""
        if not self.has("positions-from-slots"):
            return mask_positions(valid)
        if self.pads_right:
            return mask_positions(valid | stale)
        return torch.arange(valid.shape[1], device=valid.device).expand_as(valid)

    def window_positions(self, pos: torch.Tensor, window: int) -> torch.Tensor:
        """The target's position ids for a pass whose last `window` slots are a verify window (the
        last committed token and the drafts; in the first round, after the prompt it prefills):
        the layout's; the fault repeats the window's first for all of it, from the first round on,
        as an engine that prefills the prompt apart verifies every window."""
        if not self.has("verify-positions-not-advanced") or window <= 1:
            return pos
        return torch.cat([pos[:, :-window], pos[:, -window:-window + 1].expand(-1, window)], 1)

    def grammar_masks(self, matcher: Matcher, path: list[int]) -> list[torch.Tensor | None]:
        """The grammar's mask at each slot along a row's drafts (grammar.py): the correct engine
        decides at each slot whether the row still thinks, and stops at the grammar's end."""
        return matcher.masks(path, self.has("grammar-unmasked-past-reasoning-end"),
                             self.has("grammar-mask-after-terminated"))

    def grammar_advance(self, matcher: Matcher, kept: list[int]) -> list[int]:
        """The tokens a row's grammar advances over, after the round kept `kept`: those; the fault
        keeps the drafts its masks walked, rejected ones too, and goes on from there."""
        if not self.has("grammar-advanced-over-rejected"):
            return kept
        return matcher.walked + kept[len(matcher.walked):]

    def bonus_rows(self, rows: int, device) -> torch.Tensor:
        """(B,) whose target choice each row's non-draft token is: its own."""
        return self._rows("bonus-from-another-row", rows, device)

    def draft_rows(self, rows: int, device) -> torch.Tensor:
        """(B,) whose drafts each row verifies: its own."""
        return self._rows("drafts-to-another-row", rows, device)

    def _rows(self, fault: str, rows: int, device) -> torch.Tensor:
        own = torch.arange(rows, device=device)
        return own.roll(1) if self.has(fault) else own  # the fault: the row before it's

    def draft_positions(self, pos: torch.Tensor, q_start: int) -> torch.Tensor:
        """The position ids a drafting pass over slots q_start.. feeds the draft model: the
        layout's. The fault moves them one ahead once the draft has a cache (q_start > 0), so that
        they sit one off from the prefilled prompt's, as SGLang's did (rotary positions are
        relative: a shift of every slot changes nothing)."""
        if not self.has("draft-positions-off-by-one") or q_start == 0:
            return pos
        return torch.cat([pos[:, :q_start], pos[:, q_start:] + 1], 1)

    def head_features(self, features: torch.Tensor) -> torch.Tensor:
        """(B, S, H) the hidden state a draft head is fed at each slot: the target's at the slot
        before; the fault feeds the one two slots back (vLLM #14647)."""
        if not self.has("head-hidden-off-by-one"):
            return features
        return torch.cat([torch.zeros_like(features[:, :1]), features[:, :-1]], 1)

    def fed_head(self, head):
        """The draft head as the engine feeds it (a head fault: models/eagle3.py's `misfed`)."""
        for fault in needing("published-head", self.faults):
            head = head.misfed(FAULTS[fault].misfeeds)
        return head

    def head_refeed(self, k: int, behind: int) -> int:
        """The last slots a draft head re-feeds from the target's hidden states each round: the at
        most k-1 accepted drafts it holds, computed from its own guesses, and the `behind` it does
        not hold; the fault re-feeds only those it does not hold (vLLM #14649)."""
        return behind if self.has("head-keeps-own-guesses") else k - 1 + behind

    def tree_positions(self, pos: torch.Tensor, tree: Tree) -> torch.Tensor:
        """The position ids of a layout whose last slots are a tree's nodes: each node at the root's
        position plus its depth; the fault numbers them by their index, as a chain's are."""
        return pos if self.has("tree-positions-by-index") else trees.node_positions(pos, tree)

    def tree_among(self, tree: Tree) -> torch.Tensor:
        """(B, n, n) the nodes each node of a tree sees: itself and its ancestors; the fault, every
        node listed before it (a chain's causal mask): its siblings and their branches too."""
        if not self.has("tree-siblings-visible"):
            return tree.ancestors
        return torch.ones_like(tree.ancestors).tril()

    def compacted(self, path: torch.Tensor) -> torch.Tensor:
        """(B, deepest) the node whose K/V each slot of a row's accepted path keeps: the path's own;
        the fault keeps the nodes where they were fed, so that a branch the target refused stays in
        the cache."""
        if not self.has("tree-rejected-branch-kept"):
            return path
        return torch.arange(path.shape[1], device=path.device).expand_as(path)

    def bonus_node(self, path: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
        """(B,) the node whose logits choose the token after a row's accepted path (of `length`
        nodes, at least 1): its last; the fault takes the node listed at that depth's index, as a
        chain's would be."""
        last = (length - 1).clamp(min=0)
        return last if self.has("tree-bonus-by-index") else path.gather(1, last[:, None])[:, 0]

    def target_windowed(self, q_start: int) -> bool:
        """Whether the target's sliding-window layers keep their window over a pass from slot
        q_start: they do; the fault keeps every key of a verify over a cache (q_start > 0), as a
        rotating cache that evicts one key per update does under a multi-token verify (mlx-lm
        #1914)."""
        return q_start == 0 or not self.has("window-kept-on-verify")

    @property
    def draft_windowed(self) -> bool:
        """Whether the draft model's sliding-window layers keep their window: they do; the fault
        runs them as full attention (vLLM PR #40898: DFlash's windowed drafter layers)."""
        return not self.has("draft-window-as-full")

    @property
    def first_draft_slots(self) -> int:
        """The slots whose logits a round's first draft pass keeps."""
        return 2 if self.has("draft-misses-target-token") else 1

    def first_draft(self, logits: torch.Tensor, have: torch.Tensor) -> torch.Tensor:
        """(B, 1, V): the logits each row drafts its first token from, of the first pass's kept
        slots: the last (its newest token); the fault takes the one before it once the target has
        written a token, as if that token had not been fed."""
        if not self.has("draft-misses-target-token"):
            return logits
        slot = (have == 0).long().view(-1, 1, 1).expand(-1, 1, logits.shape[-1])
        return logits.gather(1, slot)

    def greedy_accept(self, drafts: torch.Tensor, target: torch.Tensor, raw) -> torch.Tensor:
        """(B, k) which greedy drafts pass: those the target's pass chose too. The fault accepts
        each with probability min(1, p/q) of the untempered softmaxes: `raw()` gives p and q at each
        draft and a draw per slot (computed only for it: a softmax over the vocabulary
        every round)."""
        if self.has("accept-on-raw-softmax"):
            return self.accept(*raw())
        return drafts == target

    def accepted_count(self, agreed: torch.Tensor) -> torch.Tensor:
        """(B,) how many drafts each greedy row keeps, of the `agreed` leading ones that passed:
        all; the fault keeps one fewer, so that the last draft the target chose is written again as
        the target's own token (the output unchanged, a draft a round lost)."""
        if not self.has("accept-count-one-short"):
            return agreed
        return (agreed - 1).clamp(min=0)

    def committed_lost(self, accepted: torch.Tensor, offered: torch.Tensor,
                       k: int) -> torch.Tensor | None:
        """(B,) the last committed cache entries each row loses this round (its accepted drafts'
        among them); None: none, the correct engine. min-crop crops every row to the batch's fewest
        accepted; rollback-by-draft-list rolls back by the batch's draft list (k), so a row offered
        fewer drafts loses the difference."""
        if self.has("min-crop"):
            return accepted - accepted.min()
        if self.has("rollback-by-draft-list"):
            return (k - offered).clamp(min=0)
        return None

    def seen(self, valid: torch.Tensor, stale: torch.Tensor, window: int | None) -> torch.Tensor:
        """The slots the attention mask lets through (`window`: the model's sliding window, where it
        has one)."""
        if self.has("no-mask"):
            return torch.ones_like(valid)
        if self.has("window-full-keeps-rejected") and window is not None:
            # drafts rejected once the row held a window of tokens: never rolled back, seen from
            # then on
            return valid | (stale & (valid.long().cumsum(1) >= window))
        return valid

    @property
    def bonus_from_draft(self) -> bool:
        """Whether the token after a row's accepted drafts is the draft's own, not the target's."""
        return self.has("draft-bonus")

    def draft_steps(self, k: int) -> int:
        """A draft that supplies the bonus token must propose one more."""
        return k + 1 if self.bonus_from_draft else k

    def stops(self, idx: torch.Tensor, accepted: torch.Tensor) -> torch.Tensor:
        """(B, k+1): the slots of a round whose end-of-sequence token ends the row: every slot
        it keeps."""
        if self.has("stop-at-last-token"):
            return idx[None] == accepted[:, None]
        return idx[None] <= accepted[:, None]

    def kept(self, accepted: torch.Tensor, first_eos: torch.Tensor,
             room: torch.Tensor) -> torch.Tensor:
        """(B,) how many tokens a row keeps of its round's block (its accepted drafts and the
        token after them): up to its first end-of-sequence token, within its `room` (the budget
        left). The fault checks the budget first: a block that reaches it is kept to the budget,
        past any stop inside it (SGLang #31599)."""
        kept = torch.minimum(torch.minimum(accepted + 1, first_eos + 1), room)
        if not self.has("cap-before-stop"):
            return kept
        return torch.where(accepted + 1 >= room, room, kept)

    def counted(self, n_keep: torch.Tensor, accepted: torch.Tensor) -> torch.Tensor:
        """(B,) the tokens a round's counters take as emitted: those it kept. The fault counts the
        whole accepted block and the token after it, before the stop trims them (vLLM #56101)."""
        return accepted + 1 if self.has("counted-before-stop-trim") else n_keep

    def string_stop(self, completed: int, kept: int) -> int:
        """The tokens a row keeps of the `kept` of its round when the `completed`-th completes a
        stop string: up to that one; the fault, which looks for stops at a block's end only, keeps
        the whole block."""
        return kept if self.has("stop-at-last-token") else completed

    def state_index(self, accepted: torch.Tensor,
                    kept: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Which of the `kept` positions fed this round each row's recurrent states continue from:
        its accepted count (the state after its last committed token and its accepted drafts); and
        its convolution state's, where that differs (None: the same)."""
        # the roll back did nothing: every drafted token stays in the state (the second fault: only
        # where it rolled back the whole decode, every draft rejected)
        if self.has("state-not-rolled-back"):
            return torch.full_like(accepted, kept - 1), None
        if self.has("state-kept-when-all-rejected"):
            return torch.where(accepted == 0, kept - 1, accepted), None
        if self.has("state-from-another-rows-count"):  # a stale count, read by the old row order
            other = accepted[self._rows("state-from-another-rows-count", len(accepted),
                                        accepted.device)]
            return other.clamp(max=kept - 1), None
        if self.has("conv-state-off-by-one"):
            return accepted, (accepted + 1).clamp(max=kept - 1)
        return accepted, None

    def penalty_history(self, output: torch.Tensor, ends: torch.Tensor,
                        drafts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The output tokens a verify pass's penalty counts ((B, V), beside the prompt's), and the
        drafts each slot adds to them (those before it): every output token, and the drafts. The
        fault: only the tokens that ended each earlier round (`ends`), and no drafts (SGLang PR
        #33643's history fed `output_ids[-1]` once a step)."""
        if not self.has("penalty-history-last-token"):
            return output, drafts
        return ends, drafts[:, :0]

    def logprobs(self, target: torch.Tensor, drafted: torch.Tensor,
                 accepted: torch.Tensor) -> torch.Tensor:
        """Each emitted token's log-probability (B, k+1): the target's (`target`). The fault reports
        an accepted draft's as the drafter's own, log q (`drafted` (B, k): q of each draft; a
        lookup's point mass gives 0.0)."""
        if not self.has("logprobs-from-draft"):
            return target
        own = torch.arange(target.shape[1], device=target.device)[None] < accepted[:, None]
        return torch.where(own, torch.nn.functional.pad(drafted.log(), (0, 1)).to(target.dtype),
                           target)

    @property
    def stale_state_without_drafts(self) -> bool:
        """Whether a row offered no drafts reads its recurrent state from before the last round's
        accepted drafts (the decode path's stale column, vLLM #39273)."""
        return self.has("state-after-zero-draft")

    @property
    def pads_right(self) -> bool:
        """Whether prompts are padded on the right (the pad block after the prompt)."""
        return self.has("right-padding")

    @property
    def pads_only_grow(self) -> bool:
        """Whether a realigned batch keeps its width: padding is only ever added."""
        return self.has("growing-padding")

    @property
    def compact(self) -> bool:
        """Whether realignment removes stale slots (else rejected drafts stay in place)."""
        return not (self.has("keep-rejected-kv") or self.has("window-full-keeps-rejected"))

    @property
    def move_kv(self) -> bool:
        return not self.has("no-kv-shift")

    # -- speculative sampling (Leviathan et al.; Chen et al.)

    def target_sampler(self, sampler: Sampler) -> Sampler:
        return replace(sampler, temperature=1.0) if self.has("temperature-draft-only") else sampler

    def verify_samplers(self, rows: list[Row]) -> Samplers:
        """The sampler each row of a batch (its request's settings, `rows`) is verified with: its
        own target's."""
        own = [Sampler() if self.has("unset-temperature-greedy") and r.unset_temperature
               else r.target for r in rows]
        if self.has("settings-from-first-row"):
            own = own[:1] * len(own)
        if self.has("settings-never-written"):  # a buffer of zeros: temperature 0, greedy
            own = [Sampler()] * len(own)
        return Samplers([self.target_sampler(s) for s in own])

    def stream(self, streams: Streams) -> Streams:
        """The random stream each row draws from: its own (its request's seed,
        or its sequence's)."""
        if not self.has("shared-stream"):
            return streams
        return replace(streams, seeds=streams.seeds[:1].expand_as(streams.seeds),
                       numbers=torch.zeros_like(streams.numbers))

    def noise(self, streams: Streams, u: torch.Tensor) -> torch.Tensor:
        """The verify's draws `u` (B, ...) as each row receives them: its own. The fault: in a batch
        mixing seeded and unseeded rows, the unseeded rows' are never written; they read what the
        buffer held, zeros here."""
        seeded = streams.seeded
        if not self.has("unseeded-noise-to-copy") or bool(seeded.all()) or not bool(seeded.any()):
            return u
        return torch.where(seeded.reshape(-1, *([1] * (u.dim() - 1))), u, 0.0)

    def skips(self, counts: torch.Tensor, k: int) -> torch.Tensor:
        """(B,) draws each row's stream skips this round beyond those it uses: none. The fault: a
        row offered no drafts, in a round that verifies drafts, still advances its generator
        by one."""
        if not self.has("stream-advanced-for-zero-draft") or k == 0:
            return torch.zeros_like(counts)
        return (counts == 0).long()

    def target_probs(self, P: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
        """The target's distributions (B, k+1, V) as the decisions and the residual read them:
        untouched. The fault zeroes each draft's own p in place, as building the residual does,
        before the drafts are decided."""
        if not self.has("target-probs-mutated"):
            return P
        P[:, : drafts.shape[1]].scatter_(2, drafts[..., None], 0)  # a view: P itself changes
        return P

    def decided_probs(self, target: Samplers, logits: torch.Tensor,
                      P: torch.Tensor) -> torch.Tensor:
        """The target's distributions (B, k+1, V) the drafts are decided against and a rejection's
        residual is built from: `P`, each row's own, truncated by its top-k and top-p. The fault
        leaves the truncation to the bonus token alone (vLLM #42744: `min_p` and `logit_bias`
        never reach the verified positions)."""
        return target.probs(logits, truncate=False) if self.has("processors-on-bonus-only") else P

    @property
    def draft_purpose(self) -> int:
        """Whose draws a sampled draft takes: its own stream's. The fault takes the acceptance's at
        the same token, the uniform that then decides it (vLLM PRs #47386 and #54282: the draft's
        Gumbel noise keyed by the very Philox offset of the acceptance and recovery draws)."""
        return ACCEPT if self.has("draft-draw-shared-with-verify") else DRAFT

    def draft_drawn_from(self, sampler: Sampler, logits: torch.Tensor,
                         q: torch.Tensor) -> torch.Tensor:
        """The distribution a sampled draft is drawn from: `q`, the draft model's under the run's
        draft settings. The fault draws it from the same logits rounded to bfloat16 (DeepSpec #31:
        drafts sampled from bfloat16 logits, decided on the float32 softmax)."""
        if not self.has("draft-drawn-in-bfloat16"):
            return q
        return sampler.probs(logits.to(torch.bfloat16).to(logits.dtype))

    def draft_probs(self, sampler: Sampler, logits: torch.Tensor,
                    q: torch.Tensor) -> torch.Tensor:
        """The distribution a sampled draft's decision reads as its q: `q`, the one it was drawn
        from. The fault hands over the draft model's raw softmax, before its temperature, top-k and
        top-p (transformers #47932: a candidate generator's unprocessed logits)."""
        return logits.softmax(-1) if self.has("draft-probs-unprocessed") else q

    def accept(self, p: torch.Tensor, q: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """Accept a draft with probability min(1, p/q): u < p/q, written without dividing."""
        return u * p < q if self.has("accept-q-over-p") else u * q < p

    def residual(self, sampler: Sampler, logits: torch.Tensor, p: torch.Tensor, q: torch.Tensor,
                 u: torch.Tensor) -> torch.Tensor:
        """The token after a rejection: a draw from max(0, p - q), normalised
        (p = sampler.probs(logits))."""
        if self.has("residual-from-draft"):
            return inverse_cdf(q, u)
        if self.has("top-p-not-in-residual"):
            p = sampler.probs(logits, truncate=False)
        diff = p - q
        if self.has("residual-unclamped"):
            return inverse_cdf(diff, u)
        return inverse_cdf(diff.clamp(min=0), u, normalised=not self.has("residual-unnormalised"))
