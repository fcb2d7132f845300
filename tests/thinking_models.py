"""Tiny thinking chat models for tests: tiny-random's weights and tokenizer, with a small Jinja chat
template in the style of a thinking model's.

- qwen3: Qwen3's ChatML, `enable_thinking` (default true: the prompt opens `<think>`, as Qwen3's
  thinking-2507 templates do; false: an empty, closed block), and `tools` in Qwen's and Hermes'
  format (`<tools>` in the system turn, `<tool_call>{json}</tool_call>`, `<tool_response>`);
- r1_distill: a DeepSeek-R1 distill's: the prompt opens `<think>`, and earlier answers keep only what
  follows their `</think>`;
- smollm3: SmolLM3's: `/think` or `/no_think` at the end of the system prompt, or `enable_thinking`;
  in thinking mode the model opens the block itself.

    python tests/thinking_models.py qwen3 /tmp/tiny-qwen3     # a folder --model_name_or_path takes
"""

import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common.models.loading import load_tokenizer, tiny_random_dir  # noqa: E402

QWEN3 = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
    "{% elif messages[0].role == 'system' %}"
    "<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'user' %}<|im_start|>user\n{{ message.content }}<|im_end|>\n"
    "{% elif message.role == 'assistant' %}<|im_start|>assistant\n{{ message.content }}"
    "{% for call in message.tool_calls or [] %}\n<tool_call>\n{\"name\": \"{{ call.function.name }}\""
    ", \"arguments\": {{ call.function.arguments | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n"
    "</tool_response><|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}{% endif %}")

R1_DISTILL = (
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'user' %}<｜User｜>{{ message.content }}"
    "{% elif message.role == 'assistant' %}"
    "<｜Assistant｜>{{ message.content.split('</think>')[-1] }}<|im_end|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<｜Assistant｜><think>\n{% endif %}")

SMOLLM3 = (
    "{% set system = messages[0].content if messages[0].role == 'system' else '' %}"
    "{% set thinking = not system.rstrip().endswith('/no_think') %}"
    "{% if system.rstrip().endswith('/think') %}{% set thinking = true %}{% endif %}"
    "{% if enable_thinking is defined %}{% set thinking = enable_thinking %}{% endif %}"
    "<|im_start|>system\n## Metadata\n\nReasoning Mode: {{ '/think' if thinking else '/no_think' }}"
    "\n\n{{ system.replace('/no_think', '').replace('/think', '').rstrip() }}<|im_end|>\n"
    "{% for message in messages %}"
    "{% if message.role == 'user' %}<|im_start|>user\n{{ message.content }}<|im_end|>\n"
    "{% elif message.role == 'assistant' %}<|im_start|>assistant\n{{ message.content }}<|im_end|>\n"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if not thinking %}<think>\n\n</think>\n{% endif %}{% endif %}")

TEMPLATES = {"qwen3": QWEN3, "r1_distill": R1_DISTILL, "smollm3": SMOLLM3}


def save_thinking_model(style, folder):
    """tiny-random with the `style` template, written to `folder` (from_pretrained loads it)."""
    folder = Path(folder)
    shutil.copytree(tiny_random_dir(), folder, dirs_exist_ok=True)
    tokenizer = load_tokenizer("tiny-random")
    tokenizer.chat_template = TEMPLATES[style]
    tokenizer.save_pretrained(folder)
    return folder


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in TEMPLATES:
        sys.exit(f"usage: python tests/thinking_models.py {{{','.join(TEMPLATES)}}} FOLDER")
    print(save_thinking_model(sys.argv[1], sys.argv[2]))
