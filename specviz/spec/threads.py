"""The field's threads a fault cites (spec/faults.py): an issue or a pull request of a repository,
named by its short name. Plain data: no torch.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

REPOS = {  # the short names threads are cited by -> GitHub repository
    "vLLM": "vllm-project/vllm", "vllm-metal": "vllm-project/vllm-metal",
    "vllm-ascend": "vllm-project/vllm-ascend", "SGLang": "sgl-project/sglang",
    "sglang-jax": "sgl-project/sglang-jax", "llama.cpp": "ggml-org/llama.cpp",
    "TensorRT-LLM": "NVIDIA/TensorRT-LLM", "transformers": "huggingface/transformers",
    "mlx-lm": "ml-explore/mlx-lm", "mlx-swift-lm": "ml-explore/mlx-swift-lm",
    "openvino.genai": "openvinotoolkit/openvino.genai", "oMLX": "jundot/omlx",
    "mlxcel": "lablup/mlxcel", "DeepSpec": "deepseek-ai/DeepSpec",
    "koboldcpp": "LostRuins/koboldcpp", "Atlas": "Avarok-Cybersecurity/atlas",
    "mistral.rs": "EricLBuehler/mistral.rs",
    "speculative-sampling": "jaymody/speculative-sampling",
    "verl-SpeCo": "verl-project/verl-SpeCo", "Automodel": "NVIDIA-NeMo/Automodel",
    "vllm-rbln": "RBLN-SW/vllm-rbln", "TGI": "huggingface/text-generation-inference",
}


@dataclass(frozen=True)
class Thread:
    repo: str  # a short name of REPOS
    number: int
    pr: bool = True  # a pull request, else an issue

    @classmethod
    def parse(cls, label: str) -> Thread:
        """The thread a label names ("vLLM PR #10350", "mlx-lm #846"): the inverse of `label`."""
        found = re.fullmatch(r"(\S+) (PR )?#(\d+)", label)
        if not found or found[1] not in REPOS:
            raise ValueError(f"not a thread of a known repository: {label!r}")
        return cls(found[1], int(found[3]), pr=bool(found[2]))

    @property
    def label(self) -> str:
        return f"{self.repo} {'PR ' if self.pr else ''}#{self.number}"

    @property
    def url(self) -> str:  # GitHub serves a pull request at its issue address too
        kind = "pull" if self.pr else "issues"
        return f"https://github.com/{REPOS[self.repo]}/{kind}/{self.number}"
