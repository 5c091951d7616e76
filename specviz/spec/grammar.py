"""Structured output's setting: a JSON schema, compiled by llguidance (the grammar engine vLLM and
SGLang also run) to check it when a run is asked for; decoding/grammar.py applies it. No torch.

JSON is written without free whitespace (vLLM's `disable_any_whitespace`; llguidance's
`whitespace_flexible` off), so that a small model cannot fill its budget with blank lines.
"""
from __future__ import annotations

import llguidance

MAX_SCHEMA_CHARS = 20_000


def compile_schema(schema: str) -> str:
    """llguidance's grammar for a JSON schema; one it cannot compile raises ValueError with its
    reason."""
    if len(schema) > MAX_SCHEMA_CHARS:
        raise ValueError(f"a JSON schema may have at most {MAX_SCHEMA_CHARS} characters")
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            schema, defaults={"whitespace_flexible": False})
    except ValueError as e:  # not JSON at all
        raise ValueError(f"the JSON schema does not compile: {str(e)[:300]}") from None
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise ValueError("the JSON schema does not compile: " + "; ".join(messages)[:300])
    return grammar
