"""Watching a decode from outside: every round, what reached the models against the truth.

The runner knows the batch-size-1 reference before the method runs. A `Watch`
taps the target and the draft (tap.py); the engine only says when a round
starts and ends, and which sequence each batch row is. At the end of a round:

- at a sequence's first divergence, the row that emitted it is checked
  against what it should have been fed: its last real token, its true
  positions, a mask that shows exactly its real tokens (those within its
  window, on a sliding-window layer), and logits equal to a
  fresh batch-size-1 recomputation of its real tokens (no cache, same dtype).
  When the logits differ, the whole pass is rebuilt from correct inputs (each
  row's cache from a fresh prefill, true positions, a plain mask) to tell a
  wrong computation (a kernel) from a wrong state, and the row's visible cache
  entries are replayed alone with true positions and a plain mask, to tell a
  corrupt cache from the rest; in a hybrid model, the row's own recurrent states
  are replayed over fresh K/V, to tell a corrupt recurrent state (I5) from the rest;
- in audit mode, every row (or a sample of rows per round) gets the same
  logits comparison, for the target and for the draft, fork or not: state can
  go wrong long before an output forks, or without it ever forking. A sampled
  run has no reference to fork from: there the first audited row of each
  sequence whose state departs beyond the yardstick's tolerance is inspected
  as a fork's emitting row is, to name what was wrong with it.

Findings are raw numbers; whitebox.py turns them into verdicts against the
rounding yardstick (yardstick.py).
"""
from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass

import torch

from specviz.decoding import kvcache
from specviz.decoding.penalties import Penalties
from specviz.forensics.recompute import copy_in, fresh_logits
from specviz.forensics.tap import Call, Tap
from specviz.models.architecture import attention_layers, is_recurrent, sliding_windows

WRITTEN_AT_SLOTS = 4  # visible cache entries whose provenance is searched, the worst-fitting first


@dataclass
class ForkState:
    """The emitting row at a sequence's first divergence, checked against the truth."""

    round: int
    row: int
    slot: int  # the verified slot whose logits chose the fork token
    state_diff: float  # largest |emitting - fresh batch-size-1 logit| over the row's verified slots
    # the pass rebuilt from correct inputs: the same difference (None: not rebuilt)
    kernel_diff: float | None
    # the same, rebuilt in float64 against a fresh float64 pass (None: no copy)
    kernel_diff_float64: float | None
    tokens_ok: bool  # the first token fed was the sequence's last real token
    # position ids of the verified slots (None: the model was given none)
    positions_fed: list[int] | None
    positions_expected: list[int]
    visible: list[int] | None  # key slots each verified slot could attend to (None: no mask given)
    visible_expected: list[int]
    # the row's visible cache alone, true positions, plain mask: largest |logit - fresh|
    kv_diff: float | None
    # a hybrid: the row's own recurrent states over fresh K/V (None: none, or clean)
    recurrent_diff: float | None
    # [true position, position its first-layer key was computed at (-1: none fits)]
    written_at: list[list[int]]
    emitting_argmax: int  # the emitting pass's own choice at the fork slot
    emitting_margin: float  # its top-1 minus top-2 logit there


class Watch:
    def __init__(self, pair, prompt_ids: list[list[int]], reference_ids: list[list[int]] | None,
                 audit_rows: int = 0, tolerance: float | None = None,
                 penalties: Penalties = Penalties()):
        self.pair = pair
        self.penalties = penalties  # the run's: the emitting pass chose from its logits penalised
        # a state within it is clean: its inputs need no narrowing (None: always narrow)
        self.tolerance = tolerance
        self.prompts = prompt_ids
        self.references = reference_ids
        self.audit_rows = audit_rows  # rows audited per round; 0: audit off
        self.seen = [0] * len(prompt_ids)  # tokens of each sequence already looked at
        self.rounds = 0
        # seq -> the emitting row at its first divergence; without a reference (a sampled run), the
        # row at its first audited round whose state departs beyond `tolerance`
        self.forks: dict[int, ForkState] = {}
        # (round, dtype) -> rebuilt logits
        self._rebuilds: dict[tuple[int, torch.dtype], torch.Tensor | None] = {}
        # (round, seq) -> target, draft differences
        self.audit: dict[tuple[int, int], tuple[float, float | None]] = {}
        self._target = Tap(pair.target, keep_cache=True)
        self._draft = Tap(pair.draft, keep_cache=False)

    @contextlib.contextmanager
    def watching(self):
        with self._target, self._draft:
            yield self

    def start(self) -> None:
        """A round begins: forget earlier calls (a prefill of newly admitted rows,
        the last round)."""
        self._target.clear()
        self._draft.clear()

    def end(self, seqs: list[int], gen: dict, along: torch.Tensor | None = None) -> None:
        """A round ended: row r of the batch was sequence seqs[r], and `gen[seq].ids` holds its
        tokens so far. A round that verified token trees (decoding/trees.py) gives `along` (B, k+1):
        which of the pass's verified slots each row's accepted path (and the branch it refused next)
        was fed at; each row is then judged along its path, as a chain, against the truth."""
        r = self.rounds
        self.rounds += 1
        verify = self._target.calls[-1] if self._target.calls else None
        drafted = self._draft.calls[0] if self._draft.calls else None
        if verify is None or verify.logits is None:
            return
        audited = self._audited(len(seqs), r)
        befores = [self.seen[s] for s in seqs]
        # each row's real tokens
        truths = [self.prompts[s] + gen[s].ids[:before] for s, before in zip(seqs, befores)]
        # our own recomputations are not the engine's calls
        with self._target.off(), self._draft.off():
            for row, (s, before, truth) in enumerate(zip(seqs, befores, truths)):
                ids = gen[s].ids
                self.seen[s] = len(ids)
                at = None if along is None else [i for i in along[row].tolist() if i >= 0]
                if s not in self.forks and (fork := self._fork(s, before, ids)) is not None:
                    self.forks[s] = self._inspect(verify, r, row, truths, fork - before, s, at)
                if row in audited:
                    self.audit[(r, s)] = (self._state_diff(verify, row, truth, at)[0],
                                          self._draft_diff(drafted, row, truth))
                    if (self.references is None and s not in self.forks
                            and self.tolerance is not None
                            and self.audit[(r, s)][0] > self.tolerance):
                        self.forks[s] = self._inspect(verify, r, row, truths, 0, s, at)

    def _audited(self, rows: int, r: int) -> set[int]:
        if self.audit_rows >= rows:
            return set(range(rows))
        # seeded: a rerun audits the same rows
        return set(random.Random(r).sample(range(rows), self.audit_rows))

    def _fork(self, s: int, before: int, ids: list[int]) -> int | None:
        if self.references is None:
            return None
        ref = self.references[s]
        return next((i for i in range(before, len(ids)) if i >= len(ref) or ids[i] != ref[i]), None)

    def _state_diff(self, call: Call, row: int, truth: list[int],
                    at: list[int] | None) -> tuple[float, list[int], torch.Tensor]:
        """Largest |emitting - fresh| logit over the row's verified slots (`at`: those of its path
        through a tree), the tokens it was fed there, and the fresh logits."""
        vocab = self.pair.vocab_size
        keep = call.logits.shape[1]
        at = list(range(keep)) if at is None else at
        fed = [call.input_ids[row, -keep:].tolist()[i] for i in at]
        fresh = fresh_logits(self.pair.target, truth + fed[1:], len(at), vocab)
        emitting = call.logits[row, at, :vocab].double().cpu()
        return float((emitting - fresh).abs().max()), fed, fresh

    def _draft_diff(self, call: Call | None, row: int, truth: list[int]) -> float | None:
        """The draft's first pass of the round (its next token after the last real one) against a
        fresh draft pass."""
        if call is None or call.logits is None:
            return None
        vocab = self.pair.vocab_size
        fresh = fresh_logits(self.pair.draft, truth, 1, vocab)[0]
        return float((call.logits[row, -1, :vocab].double().cpu() - fresh).abs().max())

    def _inspect(self, call: Call, r: int, row: int, truths: list[list[int]], slot: int, seq: int,
                 at: list[int] | None) -> ForkState:
        truth = truths[row]
        diff, fed, fresh = self._state_diff(call, row, truth, at)
        keep, verified = len(fed), call.logits.shape[1]
        along = list(range(verified)) if at is None else at
        expected = list(range(len(truth) - 1, len(truth) - 1 + keep))
        fed_pos = (None if call.position_ids is None
                   else [call.position_ids[row, -verified:].tolist()[i] for i in along])
        window = self._window(call)
        # what each slot should see
        seen = [p + 1 if window is None else min(p + 1, window) for p in expected]
        vis = call.visible(row, verified)
        vis = None if vis is None else vis[along]
        emitting = call.logits[row, along, : self.pair.vocab_size].double()
        # by the row's true history: its prompt, its tokens and the drafts before each slot
        if self.penalties:
            prompt = self.prompts[seq]
            emitting = self.penalties.along(emitting, prompt, truth[len(prompt):] + fed[1:])
        emitting = emitting[slot]
        top = emitting.topk(2).values
        clean = self.tolerance is not None and diff <= self.tolerance  # nothing to narrow down
        visible = None if vis is None else vis.sum(1).tolist()
        # The computation is suspect only where every input was right: a wrong input already names
        # the state. A tree's pass is not rebuilt (its kernels are judged on chains).
        inputs_right = (fed[0] == truth[-1] and fed_pos in (None, expected)
                        and visible in (None, seen) and at is None)
        return ForkState(
            round=r, row=row, slot=slot, state_diff=diff, tokens_ok=fed[0] == truth[-1],
            kernel_diff=(None if clean or not inputs_right else
                         self._rebuilt_diff(r, call, row, truths, self.pair.target, fresh)),
            kernel_diff_float64=(self._kernel_float64(r, call, row, truths, fed)
                                 if inputs_right else None),
            positions_fed=fed_pos, positions_expected=expected,
            visible=visible, visible_expected=seen,
            kv_diff=(None if clean else
                     self._kv_alone(call, row, truth, fed, expected, vis, fresh, seen[0] - 1)),
            recurrent_diff=(None if clean else
                            self._recurrent_alone(call, row, truth, fed, expected, fresh)),
            written_at=[] if clean else self._written_at(call, row, truth, vis, seen[0] - 1),
            emitting_argmax=int(emitting.argmax()), emitting_margin=float(top[0] - top[1]),
        )

    def _kernel_float64(self, r: int, call: Call, row: int, truths: list[list[int]],
                        fed: list[int]) -> float | None:
        """The pass rebuilt from correct inputs in float64, against a fresh float64 pass: rounding
        is nil there, so a difference is the computation's own, whatever the run's dtype (None
        without a float64 copy)."""
        model = copy_in(self.pair.target, torch.float64)
        if model is None:
            return None
        fresh = fresh_logits(model, truths[row] + fed[1:], len(fed), self.pair.vocab_size)
        return self._rebuilt_diff(r, call, row, truths, model, fresh)

    def _rebuilt_diff(self, r: int, call: Call, row: int, truths: list[list[int]], model,
                      fresh) -> float | None:
        key = (r, model.dtype)  # one rebuild per pass and precision, for every row that forks in it
        if key not in self._rebuilds:
            # earlier passes' are done
            self._rebuilds = {k: v for k, v in self._rebuilds.items() if k[0] == r}
            self._rebuilds[key] = self._rebuild(call, truths, model)
        logits = self._rebuilds[key]
        return None if logits is None else float((logits[row] - fresh).abs().max())

    @torch.inference_mode()
    def _rebuild(self, call: Call, truths: list[list[int]], model) -> torch.Tensor | None:
        """The emitting pass again with every input rebuilt correct, through `model`: each row's
        cache from a fresh prefill of its real tokens (no cache there: another kernel path), its own
        last token and the same drafts fed at their true positions, a plain padding mask; the same
        rows, the same number of queries over a cache. What differs from a fresh pass now is the
        computation's, not the state's. (B, keep, vocab) float64; None when some row has no real
        token before its last (nothing to cache)."""
        if any(len(t) < 2 for t in truths):
            return None
        keep = call.logits.shape[1]
        device = model.get_input_embeddings().weight.device
        caches = []
        for t in truths:
            caches.append(kvcache.new(model))
            model(input_ids=torch.tensor([t[:-1]], device=device), cache=caches[-1],
                  logits_to_keep=1)
        cache = kvcache.merge(caches)
        width = kvcache.length(cache)
        fed = [[t[-1]] + call.input_ids[b, call.input_ids.shape[1] - keep + 1:].tolist()
               for b, t in enumerate(truths)]
        mask = torch.tensor([[0] * (width - len(t) + 1) + [1] * (len(t) - 1 + keep)
                             for t in truths], device=device)
        positions = torch.tensor([list(range(len(t) - 1, len(t) - 1 + keep)) for t in truths],
                                 device=device)
        # a hybrid's recurrent layers take the verified slots one at a time
        with kvcache.keeping(cache, keep):
            out = model(input_ids=torch.tensor(fed, device=device), attention_mask=mask,
                        position_ids=positions, cache=cache)
        return out.logits[..., : self.pair.vocab_size].double().cpu()

    def _window(self, call: Call) -> int | None:
        """The sliding window of the layers whose mask `Call.visible` reads (None: those see the
        whole row)."""
        windows = sliding_windows(self.pair.target)
        if not windows or isinstance(call.mask, dict) and "full_attention" in call.mask:
            return None
        return windows["sliding_attention"]

    def _shown(self, call: Call, vis, expected_count: int) -> torch.Tensor | None:
        """The cache slots the row's first verified slot could see; None when there is no cache or
        the mask showed the wrong number of entries (then the mask is at fault, not the cache)."""
        if not call.past or vis is None:
            return None
        shown = vis[0, : call.past[0][0].shape[2]].nonzero().flatten()
        return shown if len(shown) == expected_count else None

    @torch.inference_mode()
    def _written_at(self, call: Call, row: int, truth: list[int], vis,
                    before: int) -> list[list[int]]:
        """Where the visible cache entries that fit their token worst were computed. A first-layer
        key depends on its token and its position only, so an entry whose key fits its own token at
        another position was written with a wrong position id; one that fits no position of its
        token belongs to another token. (Not where a recurrent layer comes before the first
        attention layer: there a key depends on the tokens before it too.)"""
        shown = self._shown(call, vis, before)
        if shown is None or not len(shown) or attention_layers(self.pair.target)[0] != 0:
            return []
        # the position of the first entry shown (0 unless a window hides some)
        first = len(truth) - 1 - before
        # (heads, slots, dim)
        cached = call.past[0][0][row][:, shown.to(call.past[0][0].device)].double().cpu()
        fresh = _first_layer_keys(self.pair.target, truth[:-1],
                                  list(range(len(truth) - 1)))[:, first:]
        err = _key_error(cached, fresh)  # (slots,)
        found = []
        span = int(call.position_ids.max()) + 1 if call.position_ids is not None else len(truth)
        for i in err.argsort(descending=True)[:WRITTEN_AT_SLOTS].tolist():
            at = first + i
            keys = _first_layer_keys(self.pair.target, [truth[at]] * max(span, at + 1),
                                     list(range(max(span, at + 1))))
            alt = _key_error(cached[:, i: i + 1].expand(-1, keys.shape[1], -1), keys)
            best = int(alt.argmin())
            # another position fits far better than its own
            if best != at and alt[best] * 8 < err[i]:
                found.append([at, best])
            elif err[i] > 8 * err.median():
                found.append([at, -1])
        return found

    @torch.inference_mode()
    def _fresh_cache(self, truth: list[int]):
        """A cache of the row's real tokens but the last, from a fresh batch-size-1 prefill: the
        truth its K/V and its recurrent states are checked against."""
        cache = kvcache.new(self.pair.target)
        device = self.pair.target.get_input_embeddings().weight.device
        self.pair.target(input_ids=torch.tensor([truth[:-1]], device=device), cache=cache,
                         logits_to_keep=1)
        return cache

    @torch.inference_mode()
    def _replay(self, kv, states, fed: list[int], expected: list[int], fresh) -> float:
        """The verified slots fed again over exactly this cache (K/V and recurrent states), at their
        true positions under a plain mask: the largest |logit - fresh|."""
        device = self.pair.target.get_input_embeddings().weight.device
        cache = kvcache.assembled(self.pair.target, kv, states)
        # as the engine feeds them (and Mamba-1 needs: one at a time)
        with kvcache.keeping(cache, len(fed)):
            out = self.pair.target(input_ids=torch.tensor([fed], device=device), cache=cache,
                                   position_ids=torch.tensor([expected], device=device),
                                   attention_mask=torch.ones(1, kvcache.length(cache) + len(fed),
                                                             dtype=torch.long, device=device))
        return float((out.logits[0, :, : self.pair.vocab_size].double().cpu() - fresh).abs().max())

    def _kv_alone(self, call: Call, row: int, truth: list[int], fed: list[int], expected: list[int],
                  vis, fresh, before: int) -> float | None:
        """Replay the verified slots over only the cache entries the row's mask showed (with fresh
        recurrent states, in a hybrid), true positions and a plain mask. Equal to fresh: the cache
        held the right entries. None where `_shown` is."""
        shown = self._shown(call, vis, before)
        if shown is None:
            return None
        kv = [(k[row: row + 1, :, shown.to(k.device)], v[row: row + 1, :, shown.to(v.device)])
              for k, v in call.past]
        states = kvcache.layers_states(self._fresh_cache(truth)) if call.states else []
        return self._replay(kv, states, fed, expected, fresh)

    def _recurrent_alone(self, call: Call, row: int, truth: list[int], fed: list[int],
                         expected: list[int], fresh) -> float | None:
        """A hybrid's check of I5: the verified slots replayed with the row's own recurrent states,
        as they stood before the emitting pass, over fresh K/V of its tokens. Equal to fresh: its
        states held its tokens. None for a model without recurrent layers."""
        if not call.states or not is_recurrent(self.pair.target):
            return None
        own = [{key: t[row: row + 1] for key, t in state.items()} for state in call.states]
        return self._replay(kvcache.layers_kv(self._fresh_cache(truth)), own, fed, expected, fresh)


class _FirstLayerDone(Exception):
    """Raised once the first layer has cached its keys: the layers after it are not needed."""


def _first_layer_keys(model, ids: list[int], positions: list[int]) -> torch.Tensor:
    """The first layer's keys of `ids` at `positions`, one sequence, fresh cache: (heads, len, dim)
    float64. The pass stops after the first layer (a 30-layer target would otherwise run 30 times
    the work). The first layer attends (`_written_at` asks only then)."""
    device = model.get_input_embeddings().weight.device
    cache = kvcache.new(model)

    def stop(*_):
        raise _FirstLayerDone

    handle = model.model.layers[0].register_forward_hook(stop)
    try:
        model(input_ids=torch.tensor([ids], device=device),
              position_ids=torch.tensor([positions], device=device), cache=cache, logits_to_keep=1)
    except _FirstLayerDone:
        pass
    finally:
        handle.remove()
    return kvcache.layers_kv(cache)[0][0][0].double().cpu()


def _key_error(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per slot: the largest |a - b| over heads and dims, relative to b's largest entry there.
    (heads, slots, dim) -> (slots,)"""
    return (a - b).abs().amax((0, 2)) / b.abs().amax((0, 2)).clamp(min=1e-30)
