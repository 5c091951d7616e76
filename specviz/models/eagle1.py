"""An EAGLE-1 head as published: the layout vLLM loads for its `eagle` method, read from its own
folder as vLLM 0.32 reads it (model_executor/models/llama_eagle.py).

It hears the target's last hidden state (after its final norm, as the target returns it). `fc`
(2H to H, no bias) mixes the token's embedding with it; its decoder layers follow, the first
without an input norm, and neither a final norm nor an output head: the target's output head
reads the last layer's output directly, which the head also feeds itself for the next draft. A
head without `embed_tokens` shares the target's embedding.
"""
from __future__ import annotations


import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaModel

from specviz.models.head import PublishedHead
from specviz.models.headfiles import load_weights
from specviz.spec.strict import SpecError


class Eagle1Head(PublishedHead):
    """A published EAGLE-1 head over `target`."""

    layout, drafter = "EAGLE-1", "eagle1"

    def __init__(self, target, raw: dict, weights: dict[str, torch.Tensor], where: str):
        super().__init__()
        text = target.config.get_text_config()
        config = LlamaConfig(**{k: v for k, v in raw.items() if k != "architectures"})
        config.vocab_size = text.vocab_size
        if config.hidden_size != text.hidden_size:
            raise SpecError(f"the EAGLE-1 head at {where} is {config.hidden_size} wide; its "
                            f"target's hidden state is {text.hidden_size}")
        H = config.hidden_size
        with torch.random.fork_rng():
            body = LlamaModel(config)
        body.embed_tokens = None  # fed embeddings (its own, else the target's)
        body.layers[0].input_layernorm = torch.nn.Identity()
        body.norm = torch.nn.Identity()
        self.body = body
        self.fc = torch.nn.Linear(2 * H, H, bias=False)
        if "embed_tokens.weight" in weights:  # else the target's is shared
            self.embed_tokens = torch.nn.Embedding(text.vocab_size, H)
        load_weights(self, {(f"body.{k}" if k.startswith("layers.") else k): w
                            for k, w in weights.items()}, f"the EAGLE-1 head at {where}")
        self._target = (target,)  # read, not owned

    def inputs(self, tokens: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.cat([self.embedded(tokens), features], -1))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._target[0].get_output_embeddings()(hidden)
