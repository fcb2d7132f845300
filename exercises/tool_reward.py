"""A reward for PS4.10 (exercises/bug.py), in TRL's convention (docs/your_own_task.md): 1 where the
response closed a calculator call and wrote on after the tool's answer, else 0. tools.py grades the
model's own text, so the answer itself is not in `completions`."""


def called_then_wrote(completions, **kwargs):
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [float(text.partition("</calc>")[2].strip() != "") for text in texts]
