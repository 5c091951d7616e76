"""OpenVINO GenAI: under speculative decoding a sequence's score (GenerationResult.m_scores) is not
the sum of the per-token log-probabilities it reports beside it; without speculation it is.

    python openvino_score.py MODEL_IR

MODEL_IR: any causal LM exported with `optimum-cli export openvino --task
text-generation-with-past --weight-format fp32` (measured on SmolLM2-135M-Instruct). Prompt lookup
needs no draft model. Needs only openvino-genai and numpy."""
import sys

import openvino_genai as genai

PROMPT = ("Copy this list: apples, pears, plums, cherries, apples, pears, plums, cherries. "
          "Again: apples, pears,")
model = sys.argv[1]
for lookup in (False, True):
    scheduler = genai.SchedulerConfig()
    scheduler.cache_size = 1
    properties = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
    if lookup:
        properties["prompt_lookup"] = True
    pipe = genai.ContinuousBatchingPipeline(model, scheduler, "CPU", properties)
    config = genai.GenerationConfig()
    config.max_new_tokens, config.logprobs = 32, 1
    if lookup:
        config.num_assistant_tokens, config.max_ngram_size = 5, 3
    ids = genai.Tokenizer(model).encode(PROMPT).input_ids
    handle = pipe.add_request(0, ids, config)
    logprobs, score = [], None
    while pipe.has_non_finished_requests():
        pipe.step()
        for out in handle.read().values() if handle.can_read() else ():
            logprobs += list(out.generated_log_probs)
            score = out.score
    print(f"{'prompt lookup' if lookup else 'no speculation'}: {len(logprobs)} tokens, score "
          f"{score:.5f}, sum of their log-probabilities {sum(logprobs):.5f}, "
          f"off by {abs(score - sum(logprobs)):.5f}")
