"""Draft heads: modules that draft from the target's own hidden states instead of a model of their
own (EAGLE, MTP), and so need no draft model. Every head is a shallow decoder `body` (a transformers
decoder model fed embeddings, with its own cache), `inputs(tokens, features)` that mix each slot's
token with the hidden state it is fed, and `logits(hidden)` through the target's output head;
drafters.py's `HeadDrafter` drafts with any.

An EAGLE-style head is a decoder layer (or a few) fed, at each slot, the token there (the target's
embedding of it) and the target's last hidden state at the slot before, mixed by one linear map; the
target's output head reads the layer's output as the next token's logits, and the output is the
head's guess of the target's next hidden state, which it feeds itself to draft further.

A head starts as copies of the target's first attention layers, with a mix that passes the embedding
plus a small share of the hidden state. The tiny pair's stays so, untrained: its drafts depend on
the target's hidden states (a head fed the wrong ones drafts differently) and are sometimes right
(two layers and a share of 0.01 accept about one draft in five, 537 of 2779 on the built-in prompts,
k 4); it shows how a head's state is kept. The embedded pair's is one layer trained on this machine
by EAGLE's recipe (`Recipe`, run/head_training.py), cached once.

An MTP head is the multi-token-prediction layer a checkpoint ships beside its model (DeepSeek-V3,
GLM-4.5, Mellum, Ling's hybrids...), loaded by transformers' own `MtpModel` and run as transformers
runs it: the token's embedding and the hidden state, each normalised, projected together, then the
layer's decoder block and its norm (MiMo's, Qwen3.5's and Qwen3-Next's, which transformers does
not read: models/mtplayouts.py). A checkpoint with several MTP
layers drafts with its first, fed its own output for every later draft (as vLLM does once k passes
the layers it has).
"""
from __future__ import annotations

import copy
import weakref
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers.modeling_layers import MtpModel

from specviz.models.architecture import attention_layers_only, is_recurrent
from specviz.models.checkpoints import cache_dir
from specviz.models.eagle1 import Eagle1Head
from specviz.models.eagle3 import Eagle3Head
from specviz.models.builtinheads import head_folder
from specviz.models.head import Head, one_layer_body, settle
from specviz.models.mtplayouts import LayoutHead, layout_of
from specviz.spec.drafters import DRAFTERS
from specviz.spec.run import EMBEDDED_TARGET, TINY_TARGET
from specviz.spec.strict import SpecError

# target -> its head's layers, and the share of the hidden state in its input (untrained)
SHAPES = {TINY_TARGET: (2, 0.01), EMBEDDED_TARGET: (1, 0.01)}


@dataclass(frozen=True)
class Recipe:
    """How a head is trained on this machine (run/head_training.py): EAGLE's recipe, small."""
    steps: int = 300
    seed: int = 0
    tokens_per_step: int = 512
    learning_rate: float = 3e-4
    prompts: str = "spec-bench"  # the built-in set it learns from; "all" is held out
    new_tokens: int = 160  # of each continuation of a training prompt by the target
    # continuations sampled (temperature `temperature`) beside the greedy one, for more contexts
    sampled: int = 2
    temperature: float = 0.8

    def weights(self, name: str) -> Path:
        """Where the head of target `name` trained so is cached, beside the embedded pair's
        converted weights."""
        slug = name.split(":")[-1]
        return cache_dir() / (f"{slug}-eagle-head-{self.prompts}-"
                              f"{self.new_tokens}x{1 + self.sampled}-"
                              f"steps{self.steps}-seed{self.seed}") / "head.safetensors"


TRAINED = {EMBEDDED_TARGET: Recipe()}  # heads trained on this machine, loaded from its cache


class EagleHead(Head):
    made = weakref.WeakKeyDictionary()  # target -> its head, made once

    def __init__(self, target, layers: int, share: float):
        super().__init__()
        indices, decoder = attention_layers_only(target)[:layers], target.model
        config = copy.deepcopy(target.config.get_text_config())
        config.num_hidden_layers = layers
        if getattr(config, "layer_types", None) is not None:
            config.layer_types = [config.layer_types[i] for i in indices]
        with torch.random.fork_rng():  # a fixed module without disturbing the caller's RNG
            body = type(decoder)(config)
        body.embed_tokens = None  # it is fed the target's embeddings
        for mine, theirs in zip(body.layers, indices):
            mine.load_state_dict(decoder.layers[theirs].state_dict())
        body.norm.load_state_dict(decoder.norm.state_dict())
        H = config.hidden_size
        self.fc = torch.nn.Linear(2 * H, H, bias=False)
        with torch.no_grad():
            self.fc.weight.copy_(torch.cat([torch.eye(H), share * torch.eye(H)], 1))
        self.body = body
        settle(self, target)
        # read, not owned: a tuple keeps it out of this module's parameters
        self._target = (target,)

    @classmethod
    def of(cls, target, name: str) -> EagleHead:
        """The head of `target`, whose id is `name`, made once."""
        if name not in SHAPES:
            raise SpecError(f"specviz has no EAGLE-style head for {name} yet: it has one for "
                            f"{', '.join(SHAPES)} only; draft with the draft model or prompt "
                            "lookup")
        if target not in cls.made:
            head = cls(target, *SHAPES[name])
            if name in TRAINED:
                head.load_trained(TRAINED[name].weights(name))
            cls.made[target] = head
        return cls.made[target]

    def load_trained(self, path: Path) -> None:
        """Its trained weights (a SpecError naming the command that trains them, where none
        are cached)."""
        if not path.exists():
            raise SpecError("this pair's EAGLE-style head is not trained on this machine yet: run "
                            "`specviz train-head` once (about 15 minutes on 2 CPU cores; it caches "
                            f"the head at {path.parent})")
        mine = self.state_dict()
        self.load_state_dict({name: w.to(dtype=mine[name].dtype, device=mine[name].device)
                              for name, w in load_file(path).items()})

    def inputs(self, tokens: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """The layer's input at each slot: the token's embedding mixed with the hidden state
        it is fed."""
        return self.fc(torch.cat([self._target[0].get_input_embeddings()(tokens), features], -1))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._target[0].get_output_embeddings()(hidden)



class MtpInputs(torch.nn.Module):
    """An MTP layer's input: the token's embedding and the hidden state, each normalised,
    projected together."""

    def __init__(self, layer):
        super().__init__()
        self.enorm, self.hnorm, self.eh_proj = layer.enorm, layer.hnorm, layer.eh_proj
        # Inkling's checkpoints' order
        self.hidden_first = getattr(layer.config, "mtp_hidden_states_first", False)

    def forward(self, embedded: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        mixed = [self.enorm(embedded), self.hnorm(features)]
        return self.eh_proj(torch.cat(mixed[::-1] if self.hidden_first else mixed, -1))


class MtpHead(Head):
    made = weakref.WeakKeyDictionary()  # target -> its head, loaded once

    def __init__(self, target, mtp: MtpModel):
        super().__init__()
        layer, body = mtp.layers[0], one_layer_body(target, mtp.config)
        body.layers[0] = layer.mtp_block
        body.norm = layer.post_norm if layer.use_post_norm else (
            mtp.shared_post_norm if mtp.use_shared_post_norm else torch.nn.Identity())
        self.body, self.mix = body, MtpInputs(layer)
        self._mtp = (mtp,)  # read, not owned: its embedding and output head are the target's own
        settle(self, target)

    @classmethod
    def of(cls, target, name: str) -> MtpHead | LayoutHead:
        """The first MTP layer `target`'s checkpoint `name` ships, loaded once (MiMo's, Qwen3.5's
        and Qwen3-Next's, which transformers does not read, as vLLM reads them)."""
        if layout_of(target) is not None:
            return LayoutHead.of(target, name)
        if not getattr(target.config.get_text_config(), "num_mtp_layers", None):
            raise SpecError(f"{name} ships no multi-token-prediction (MTP) layer that transformers "
                            "can load (its config has no num_mtp_layers): draft with the draft "
                            "model, prompt lookup or an EAGLE-style head")
        if target not in cls.made:
            _stored_after_the_decoder(target)
            try:
                mtp = MtpModel.from_pretrained(target, device_map={"": target.device})
            except (OSError, ValueError, RuntimeError) as e:
                raise SpecError(f"transformers could not load {name}'s MTP layers: {e}") from e
            head = cls(target, mtp)
            if is_recurrent(head.body):
                raise SpecError(f"{name}'s MTP layer carries a recurrent state, which a head's "
                                "cache (cut back each round) cannot hold: draft with the draft "
                                "model or prompt lookup")
            cls.made[target] = head
        return cls.made[target]

    def inputs(self, tokens: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        return self.mix(self._mtp[0].embed_tokens(tokens), features)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._mtp[0]._project_to_logits(hidden)


def _stored_after_the_decoder(target) -> None:
    """`target`'s checkpoint's MTP layers are read where vLLM reads them too: right after the
    decoder's own (model.layers.{L}, for a decoder of L layers). transformers names the released
    models' places alone (DeepSeek-V3's model.layers.61), which a smaller checkpoint of the same
    layout does not use."""
    text = target.config.get_text_config()
    after = [rf"model\.layers\.{text.num_hidden_layers + i}\." for i in range(text.num_mtp_layers)]
    known = list(target._keys_to_ignore_on_load_unexpected or [])
    target._keys_to_ignore_on_load_unexpected = known + [p for p in after if p not in known]


# drafter (spec/drafters.py) -> its head over (target, the target's id, a published head's folder)
HEADS = {"eagle": lambda target, name, _: EagleHead.of(target, name),
         "mtp": lambda target, name, _: MtpHead.of(target, name),
         "eagle1": lambda target, _, folder: Eagle1Head.of(target, folder),
         "eagle3": lambda target, name, folder: Eagle3Head.of(
             target, folder and head_folder(folder, target, name))}


def head_of(spec, pair):
    """The head run `spec` drafts with over `pair` (None: it drafts with no head)."""
    if "hidden" not in DRAFTERS[spec.drafter].hears:
        return None
    return head_for(spec.drafter, pair.target, spec.target, spec.head)


def head_for(drafter: str, target, name: str, source: str | None = None):
    """The head drafter `drafter` drafts with over `target`, whose id is `name`: its own, or
    the published one in folder `source`."""
    return HEADS[drafter](target, name, source)
