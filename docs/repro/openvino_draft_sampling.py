"""OpenVINO GenAI: speculative sampling with a draft model does not sample from the target's
distribution as configured. With top_k = 1, sampling must give the greedy tokens whatever the
temperature and whatever the draft proposes; with a draft model that is not the target, it does
not.

    python openvino_draft_sampling.py MODEL_IR DRAFT_IR

Both exported with `optimum-cli export openvino --task text-generation-with-past --weight-format
fp32`, sharing a tokenizer (measured on SmolLM2-135M-Instruct and a copy of it with noise on its
weights; with the model as its own draft, every request was greedy). Needs only openvino-genai and
numpy."""
import sys

import openvino_genai as genai

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.",
           "Explain recursion in one sentence.", "List three prime numbers."]
model, draft = sys.argv[1], sys.argv[2]
f32 = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
ids = [genai.Tokenizer(model).encode(p).input_ids for p in PROMPTS]


def answers(speculate: bool, sample: bool) -> list[list[int]]:
    scheduler = genai.SchedulerConfig()
    scheduler.cache_size, scheduler.max_num_seqs = 1, len(PROMPTS)
    properties = dict(f32)
    if speculate:
        properties["draft_model"] = genai.draft_model(draft, "CPU", **f32)
    pipe = genai.ContinuousBatchingPipeline(model, scheduler, "CPU", properties)
    config = genai.GenerationConfig()
    config.max_new_tokens = 32
    if sample:
        config.do_sample, config.temperature, config.top_k, config.rng_seed = True, 0.9, 1, 5
    if speculate:
        config.num_assistant_tokens = 5
    return [list(r.m_generation_ids[0]) for r in pipe.generate(ids, [config] * len(ids))]


greedy = answers(speculate=False, sample=False)
for speculate in (False, True):
    sampled = answers(speculate, sample=True)
    differ = [i for i, (a, b) in enumerate(zip(greedy, sampled)) if a != b]
    print(f"top_k=1 sampling, {'draft model' if speculate else 'no speculation'}: {len(differ)} "
          f"of {len(ids)} requests differ from greedy {differ}")
