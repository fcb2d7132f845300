"""--chat_template_kwargs: options a chat template reads (TRL's name), such as Qwen3's
`enable_thinking`, read from JSON, checked against the tokenizer's template before any weights
load, and passed to every `apply_chat_template` that builds a prompt (`template_kwargs`).

    kwargs = read_template_kwargs('{"enable_thinking": false}')   # {"enable_thinking": False}
    tokenizer.chat_template_kwargs = check_template_kwargs(tokenizer, kwargs, name)

tools.py --tool_format template: the tools the template shows in every prompt (`offer_tools`), and
the template's answer to a call (`tool_message`), the text that goes after the model's tokens.
"""

import json

from common.errors import UsageError

FLAG = "--chat_template_kwargs"
# apply_chat_template's own arguments: passed as a template option they would change how the
# prompt is built, not what the template reads
RESERVED = ("conversation", "tools", "documents", "chat_template", "add_generation_prompt",
            "continue_final_message", "tokenize", "padding", "truncation", "max_length",
            "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs")


def read_template_kwargs(text, template="chat") -> dict:
    """--chat_template_kwargs as a dict ({} when not given), or one line naming the fix. template:
    --template, whose plain prompts no chat template builds."""
    if text is None or isinstance(text, dict):
        return dict(text or {})
    if template == "plain":
        raise UsageError(f"{FLAG} passes options to the chat template, but --template plain "
                         f"builds prompts without one: drop {FLAG}, or use --template chat.")
    example = f"{FLAG} '{{\"enable_thinking\": true}}'"
    try:
        kwargs = json.loads(text)
    except ValueError as err:
        raise UsageError(f"{FLAG} {text!r}: not JSON ({err.msg}, at character {err.pos}); "
                         f"pass a JSON object, e.g. {example}.") from None
    if not isinstance(kwargs, dict):
        raise UsageError(f"{FLAG} {text!r}: a JSON {type(kwargs).__name__}, not an object; "
                         f"pass the template's options by name, e.g. {example}.")
    reserved = sorted(set(kwargs) & set(RESERVED))
    if reserved:
        raise UsageError(f"{FLAG}: {', '.join(reserved)} is apply_chat_template's own argument, "
                         "not a template option; drop it from the object.")
    return kwargs


def template_source(tokenizer) -> str | None:
    """The tokenizer's chat template text (every named one, where it holds several), or None."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        return "\n".join(template.values())
    return template


def template_variables(source: str) -> set:
    """The names a Jinja template reads that it does not set itself: the options it can take."""
    from jinja2 import Environment, meta

    return meta.find_undeclared_variables(Environment().parse(source))


def check_template_kwargs(tokenizer, kwargs: dict, name: str, say=print) -> dict:
    """`kwargs`, refused in one line where the tokenizer has no chat template or the template fails
    with them; an option the template never reads is a warning, as Jinja ignores it without a
    word. -> kwargs"""
    if not kwargs:
        return {}
    source = template_source(tokenizer)
    if source is None:
        raise UsageError(f"{FLAG}: {name}'s tokenizer has no chat template to pass them to; drop "
                         f"{FLAG}, or use a model with a chat template.")
    unread = sorted(set(kwargs) - template_variables(source))
    if unread:
        say(f"{FLAG}: {name}'s chat template never reads {', '.join(map(repr, unread))}; "
            "it has no effect there.")
    try:
        tokenizer.apply_chat_template([{"role": "user", "content": "1 + 1?"}], tokenize=False,
                                      add_generation_prompt=True, **kwargs)
    except Exception as err:  # a template's own raise_exception, or a type it cannot use
        said = " ".join(str(err).split())
        raise UsageError(f"{FLAG} {json.dumps(kwargs)}: {name}'s chat template fails with them "
                         f"({type(err).__name__}: {said}); pass the options it takes.") from None
    return kwargs


def template_kwargs(tokenizer) -> dict:
    """apply_chat_template's options for every prompt: the run's --chat_template_kwargs, which
    `load_tokenizer` keeps on the tokenizer, and the tools that `offer_tools` adds to them."""
    return getattr(tokenizer, "chat_template_kwargs", None) or {}


TOOLS_FLAG = "--tool_format template"
# a call to try the template's answer on, before any weights load
EXAMPLE_CALL = ('<tool_call>\n{"name": "calc", "arguments": {"expression": "214 + 23 * 105"}}\n'
                '</tool_call>')
MARK = "<<mathrl: the model's text ends here>>"


def offer_tools(tokenizer, schemas: list, name: str):
    """Have the chat template show the tools `schemas` (JSON schemas, as transformers'
    get_json_schema writes them) in every prompt, as apply_chat_template's `tools`; refused in one
    line where the template never reads `tools`, or does not answer a call with a tool message
    right after the model's text (`tool_message`)."""
    source = template_source(tokenizer)
    if source is None or "tools" not in template_variables(source):
        raise UsageError(f"{TOOLS_FLAG}: {name}'s chat template takes no tools (it never reads "
                         "`tools`); use --tool_format tags, or a model whose template does, such "
                         "as Qwen/Qwen2.5-1.5B-Instruct or Qwen3.")
    tokenizer.chat_template_kwargs = {**template_kwargs(tokenizer), "tools": list(schemas)}
    # the closing tag's last token may carry a newline: a template that trims it fails here, not
    # at the first such call of a run
    for said in (EXAMPLE_CALL, EXAMPLE_CALL + "\n"):
        if "2629" not in tool_message(tokenizer, said, "2629"):
            raise UsageError(f"{TOOLS_FLAG}: {name}'s chat template writes no tool message (the "
                             "role \"tool\"); use --tool_format tags.")


def tool_message(tokenizer, said: str, result: str) -> str:
    r"""What the chat template writes after the model's turn `said`, which ends in a tool call, to
    answer it with `result`: the end of the model's turn, the tool message and the next generation
    prompt, such as Qwen's "<|im_end|>\n<|im_start|>user\n<tool_response>\n2629\n</tool_response>
    <|im_end|>\n<|im_start|>assistant\n". Token in, token out: the model's ids stay as sampled,
    and only this text is encoded, to go after them.

    The conversation (a question, the assistant's `said`, the tool's `result`) is rendered twice,
    once with a mark at the end of `said`. The mark cuts that text into head + tail, and the
    unmarked text must be head + tail exactly: then the template wrote the end of `said` verbatim
    where the tail begins, and the tail is its answer to the call (`offer_tools` checks that the
    result is in it; a template may escape it, as JSON). Taking what the rendering of the whole
    conversation adds to the one that ends at `said` would not do: Qwen3's template writes the
    last assistant turn with an empty <think></think> and an earlier one without. The question is
    a stand-in: what a template writes after a call depends on the call and its result, not on
    the question, and the evaluation's prompts reach tools.py as token ids."""
    def render(text):
        messages = [{"role": "user", "content": "?"}, {"role": "assistant", "content": text},
                    {"role": "tool", "content": result}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                             **template_kwargs(tokenizer))

    try:
        full, marked = render(said), render(said + MARK)
    except Exception as err:  # a template's own raise_exception, e.g. for the role "tool"
        raise UsageError(f"{TOOLS_FLAG}: the chat template fails on a tool message "
                         f"({type(err).__name__}: {' '.join(str(err).split())}); use "
                         "--tool_format tags.") from None
    head, _, tail = marked.partition(MARK)
    if marked.count(MARK) != 1 or full != head + tail:
        raise UsageError(f"{TOOLS_FLAG}: the chat template does not answer a call with a tool "
                         "message right after the model's text, so its tokens cannot be added "
                         "to the sampled ones; use --tool_format tags.")
    return tail
