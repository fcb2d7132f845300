"""The reasoning block of a thinking model's response, and the rule that grades only what follows it
(data/README.md, "Thinking models").

    tags = Reasoning()                                    # <think> ... </think>
    tags.split("<think>36? no, 38</think> The answer is 36.")  # ("<think>36? no, 38", " The ...")
    Reasoning(opened=True).split("still thinking")        # ("still thinking", None): no answer

The rule, as text (what the verifier reads), in order:
- no tag at all: no block, and the whole response is the answer, graded as it always was;
- the answer is what follows the LAST close tag: the scratch work before it, a first guess and a
  second block included, is never graded, so a model that reconsiders is paid for where it ends;
- an open tag after the last close (or, where the prompt opened the block, no close at all) is a
  block that never closed: the response has no answer (reward 0), and the run counts it.
"""

from dataclasses import dataclass

THINK_TAGS = ("<think>", "</think>")  # Qwen3's, DeepSeek-R1's and SmolLM3's, and R1-zero's prompts
# the names transformers' response templates give a reasoning field (a tokenizer's own tags)
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


@dataclass(frozen=True)
class Reasoning:
    """A response's reasoning block: its tags; opened, the prompt ends inside it (an R1 distill's
    template), so the response starts there; budget, --max_thinking_tokens (`ThinkingBudget`)."""
    open: str = THINK_TAGS[0]
    close: str = THINK_TAGS[1]
    opened: bool = False
    budget: int | None = None

    def split(self, response: str) -> tuple:
        """-> (thinking, answer): thinking None with no block, answer None where it never closed."""
        end = response.rfind(self.close)
        if end >= 0 and self.open not in response[end:]:
            return response[:end], response[end + len(self.close):]
        if end >= 0 or self.opened or self.open in response:  # a block left open
            return response, None
        return None, response

    def token_split(self, response: str, ids: list, decode) -> tuple:
        """(tokens the thinking took, whether its block never closed, tokens of the answer) of a
        response and its token ids, decode(ids) -> its text: the thinking is every token up to
        the end of the last close tag (all of them where the block never closed, none where there
        is no block), so the two counts sum to the response's length. The end is the first prefix
        of the ids whose text holds every close tag of the response: a tag may span tokens."""
        thinking, answer = self.split(response)
        if thinking is None:
            return 0, False, len(ids)
        if answer is None:
            return len(ids), True, 0
        closes, low, high = response.count(self.close), 0, len(ids)
        while low < high:  # the shortest prefix that holds them all
            mid = (low + high) // 2
            if decode(ids[:mid]).count(self.close) >= closes:
                high = mid
            else:
                low = mid + 1
        return low, False, len(ids) - low

    @staticmethod
    def opens_in(prompt: str, tags=THINK_TAGS) -> bool:
        """Whether a rendered prompt ends inside an open block: its last open tag has no close
        after it (Qwen3 with enable_thinking=False writes an empty, closed block: not opened)."""
        start = prompt.rfind(tags[0])
        return start >= 0 and tags[1] not in prompt[start:]


def declared_tags(tokenizer) -> tuple:
    """The reasoning tags a tokenizer declares in its response template (transformers'
    `response_template`, a field named reasoning_content, thinking or reasoning with literal
    `open` and `close`), else `<think>` and `</think>`."""
    fields = (getattr(tokenizer, "response_template", None) or {}).get("fields", {})
    for name in REASONING_FIELDS:
        field = fields.get(name) if isinstance(fields, dict) else None
        tags = [field.get(k) if isinstance(field, dict) else None for k in ("open", "close")]
        tags = [t[0] if isinstance(t, list) and t else t for t in tags]
        if all(isinstance(t, str) and t.strip() for t in tags):
            return tags[0].strip(), tags[1].strip()
    return THINK_TAGS
