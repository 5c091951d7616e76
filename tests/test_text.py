"""Whole characters in every text view: a character split over several tokens is shown whole, as the
tokenizer decodes the sequence, and marked whole where the sequences fork."""
import html
import json
import re

from conftest import FLAGS_PROMPT
from hostile import parse_html

from specviz.app import summary, tokens, views
from specviz.cli.main import main
from specviz.trace import text
from specviz.trace.migrations import SCHEMA_VERSION
from specviz.trace.schema import Trace

REPLACEMENT = "\ufffd"


def _columns(page: str) -> list[tuple[str, str, str]]:
    """(before, marked, after) text of each column of the compare view."""
    out = []
    for column in page.split('<div class="sv-col">')[1:]:
        body = column.split('<div class="sv-text">', 1)[1]
        before, _, rest = body.partition('<mark class="sv-fork">')
        marked, _, after = rest.partition("</mark>")
        out.append(tuple("".join(parse_html(part).text) for part in (before, marked, after)))
    return out


def test_the_compare_view_shows_whole_characters(cjk_emoji, embedded):
    split = 0
    for s in cjk_emoji.sequences:
        split += s.output_pieces.count(None)
        page = tokens.compare_html(cjk_emoji, views.Focus(s.seq, None))
        for (before, marked, after), ids in zip(_columns(page), (s.reference_ids, s.output_ids)):
            # as the tokenizer decodes it all
            assert before + marked + after == embedded.tokenizer.decode(ids)
    assert split >= 10 and sum(s.equivalent is False for s in cjk_emoji.sequences) >= 2


def test_a_fork_inside_a_character_marks_the_whole_character(cjk_emoji, embedded):
    """東 and 来 share their first token: forking at the second marks both characters whole."""
    tok = embedded.tokenizer
    reference = tok.encode("東京", add_special_tokens=False)
    output = [reference[0], tok.encode("来", add_special_tokens=False)[-1], *reference[2:]]
    assert tok.decode(output) == "来京" and len(reference) == 4
    before = cjk_emoji.prompts[0].ids[-1]
    forked = cjk_emoji.sequences[0].model_copy(update={
        "output_ids": output, "output_pieces": text.pieces(tok, output, before),
        "reference_ids": reference, "reference_pieces": text.pieces(tok, reference, before),
        "first_divergence": 1, "equivalent": False})
    trace = cjk_emoji.model_copy(update={"sequences": [forked, *cjk_emoji.sequences[1:]]})
    columns = _columns(tokens.compare_html(trace, views.Focus(0, None)))
    assert columns == [("", "東", "京"), ("", "来", "京")]


def test_chips_show_whole_characters_and_say_when_a_token_only_starts_one(cjk_emoji, embedded):
    parts = 0
    for s in cjk_emoji.sequences:
        page = tokens.timeline_html(cjk_emoji, views.Focus(s.seq, None))
        chips = [tuple(map(html.unescape, m)) for m in re.findall(
            r'<span class="sv-tok ([^"]*)" data-index="\d+" title="([^"]*)">([^<]*)</span>', page)]
        assert len(chips) == len(s.output_ids)
        whole = "".join(shown for cls, _, shown in chips if "sv-part" not in cls)
        assert whole.replace("↵", "\n").replace("∅", "") == embedded.tokenizer.decode(s.output_ids)
        starts = [(tip, shown) for cls, tip, shown in chips if "sv-part" in cls]
        assert all(shown == views.PART and "the first bytes of" in tip for tip, shown in starts)
        parts += len(starts)
    assert parts >= 10


def test_a_trace_reads_whole_characters_back_without_the_tokenizer(cjk_emoji):
    back = Trace.from_json(cjk_emoji.to_json())
    assert [s.output_pieces for s in back.sequences] == [s.output_pieces
                                                         for s in cjk_emoji.sequences]


def test_a_version_2_trace_still_opens(cjk_emoji):
    old = json.loads(cjk_emoji.to_json()) | {"schema_version": 2}
    for s in old["sequences"]:
        del s["output_pieces"], s["reference_pieces"]
    back = Trace.from_json(json.dumps(old))
    # what version 2 showed: each token alone
    assert back.schema_version == SCHEMA_VERSION and back.sequences[0].output_pieces == [
        cjk_emoji.vocab[i] for i in cjk_emoji.sequences[0].output_ids]


def test_a_split_character_goes_whole_on_the_token_that_completes_it(embedded):
    tok = embedded.tokenizer
    ids = tok.encode(" 東京 🙂 naïve", add_special_tokens=False)
    pieces = text.pieces(tok, ids, tok.encode("Hi", add_special_tokens=False)[-1])
    # " 東" takes 3 tokens, "京" 2
    assert pieces == [None, None, " 東", None, "京", " 🙂", " na", "ïve"]
    assert text.character_at(pieces, 1) == (0, 3) and text.character_at(pieces, 4) == (3, 5)


def test_prompts_are_cut_between_characters(cjk_emoji, tiny, capsys):
    table = summary.summary_frame(cjk_emoji)
    cut = table["prompt"][2]
    # 48 characters: 5 whole flags
    assert FLAGS_PROMPT.index("🇫🇷") == 43 and cut == FLAGS_PROMPT[: 43 + 2 * 5] + "…"
    prompt = "x" * 69 + "🇫🇷🇯🇵"
    assert main(["run", "--pair", "tiny", "--dtype", "float64", "--device", "cpu", "--method",
                 "reference", "--prompt", prompt, "--max-new-tokens", "2"]) == 0
    assert repr("x" * 69 + "🇫🇷…") in capsys.readouterr().out
