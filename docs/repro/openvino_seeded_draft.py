"""OpenVINO GenAI: seeded sampling with a draft model does not repeat. The same requests, with the
same rng_seed, on the same pipeline, answered twice: without speculation every answer repeats; with
a draft model some do not.

    python openvino_seeded_draft.py MODEL_IR DRAFT_IR

Both exported with `optimum-cli export openvino --task text-generation-with-past --weight-format
fp32`, sharing a tokenizer (measured on SmolLM2-135M-Instruct and a copy of it with noise on its
weights). Needs only openvino-genai and numpy."""
import sys

import openvino_genai as genai

# 24 requests in one batch: with fewer, the batches were too small to show it on this CPU
PROMPTS = 3 * ["What is the capital of France?", "Write a haiku about the sea.",
               "Explain recursion in one sentence.", "List three prime numbers.",
               "Who wrote Hamlet?", "Count from one to ten.", "Name three rivers.",
               "Why is the sky blue?"]
model, draft = sys.argv[1], sys.argv[2]
f32 = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
tokenizer = genai.Tokenizer(model)
for speculate in (False, True):
    scheduler = genai.SchedulerConfig()
    scheduler.cache_size, scheduler.max_num_seqs = 1, len(PROMPTS)
    properties = dict(f32)
    if speculate:
        properties["draft_model"] = genai.draft_model(draft, "CPU", **f32)
    pipe = genai.ContinuousBatchingPipeline(model, scheduler, "CPU", properties)
    config = genai.GenerationConfig()
    config.max_new_tokens, config.do_sample, config.temperature = 32, True, 0.9
    config.top_k, config.rng_seed = 50, 5
    if speculate:
        config.num_assistant_tokens = 5
    ids = [tokenizer.encode(p).input_ids for p in PROMPTS]
    first, again = ([list(r.m_generation_ids[0]) for r in pipe.generate(ids, [config] * len(ids))]
                    for _ in range(2))
    differ = [i for i, (a, b) in enumerate(zip(first, again)) if a != b]
    print(f"{'draft model' if speculate else 'no speculation'}: {len(differ)} of {len(ids)} "
          f"requests answered otherwise the second time {differ}")
