"""--chat_template_kwargs: options a chat template reads (TRL's name), such as Qwen3's
`enable_thinking`, read from JSON, checked against the tokenizer's template before any weights
load, and passed to every `apply_chat_template` that builds a prompt (`template_kwargs`).

    kwargs = read_template_kwargs('{"enable_thinking": false}')   # {"enable_thinking": False}
    tokenizer.chat_template_kwargs = check_template_kwargs(tokenizer, kwargs, name)
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
    """The run's --chat_template_kwargs, which `load_tokenizer` keeps on the tokenizer."""
    return getattr(tokenizer, "chat_template_kwargs", None) or {}
