"""The tools of tools.py: what the model may call inside its response, and how a call is found.

A call is `<name>argument</name>`; its result goes back to the model as `<output>result</output>`:

    find_call("So <calc>214 + 23 * 105</calc><", ("calc",))   # ("calc", "214 + 23 * 105")
    run_tool("calc", "214 + 23 * 105")                           # "2629"
    run_tool("calc", "__import__('os')")                         # "error: not arithmetic ..."

No tool ever runs model text as code: `calc` is common/env/answers.py's AST whitelist (+ - * / and
brackets, exact fractions), and solve / simplify / factor parse the text with the grader's
whitelisted parser and run sympy in a grader worker, within the grader's budget of CPU time
(common/env/grader.py, `run_sympy_tool`); a sum (`\\sum_{k=1}^{10} k`) is added up there. A tool
that fails, for any reason, answers with a text that starts with "error:", which the model reads;
nothing is raised.
"""

from common.env.answers import safe_arith
from common.env.grader import SYMPY_TOOLS, run_sympy_tool

MAX_ARGUMENT = 300  # characters of a call's argument: calculator expressions are short


def calc(text: str) -> str:
    """The exact value of an arithmetic expression, as an integer or a reduced fraction."""
    value = safe_arith(text.replace(",", ""))  # 1,234 is a thousand and more, not a tuple
    if value is None:
        return f"error: not arithmetic (+ - * / and brackets): {text.strip()[:40]!r}"
    if value.denominator == 1:
        return str(value.numerator)
    return f"{value.numerator}/{value.denominator}"


# name -> (what the system prompt says it does, the function)
TOOLS = {"calc": ("a calculator: <calc>214 + 23 * 105</calc> gives its value", calc)}
for _name in SYMPY_TOOLS:
    TOOLS[_name] = (f"sympy's {_name}: <{_name}>x^2 - 4</{_name}>",
                    lambda text, name=_name: run_sympy_tool(name, text))


def parse_tools(spec: str) -> tuple:
    """--tools "calc,factor" -> ("calc", "factor"); "none" -> (). ValueError names the choices."""
    names = () if spec.strip() == "none" else tuple(n.strip() for n in spec.split(",") if n.strip())
    unknown = [n for n in names if n not in TOOLS]
    if unknown or len(set(names)) != len(names):
        raise ValueError(f"--tools {spec!r}: a comma list of {', '.join(TOOLS)} without repeats, "
                         "or none")
    return names


def stop_strings(names) -> tuple:
    """The closing tags: sampling stops at the first one, and the tool runs."""
    return tuple(f"</{name}>" for name in names)


def find_call(text: str, names) -> tuple | None:
    """(name, argument) of the last call that the end of `text` closes (the closing tag may be
    followed by the few characters its last token carries, as in "</calc><"), else None. A closing
    tag with no opening one is a call with no argument, which the tool answers with an error."""
    closes = [(text.rfind(f"</{name}>"), name) for name in names]
    at, name = max(closes)
    if at < 0 or len(text) - at - len(f"</{name}>") > 8:  # the stop string ended the turn
        return None
    opened = text.rfind(f"<{name}>", 0, at)
    return name, None if opened < 0 else text[opened + len(name) + 2:at]


def run_tool(name: str, argument) -> str:
    """The tool's answer to a call, as text; an "error: ..." text where it fails. Never raises."""
    if argument is None:
        return f"error: no <{name}>"  # short: it takes the response's tokens
    if len(argument) > MAX_ARGUMENT:
        return f"error: the argument is longer than {MAX_ARGUMENT} characters"
    try:
        return TOOLS[name][1](argument)
    except Exception as e:  # a tool is plumbing the model must survive: its error is its answer
        return f"error: {type(e).__name__}"


def output_text(result: str) -> str:
    """What goes back into the context after a call."""
    return f"<output>{result}</output>"


def system_prompt(task_prompt: str, names) -> str:
    """The task's instructions (or the user's --system_prompt), and one line per tool."""
    return " ".join([task_prompt] * bool(task_prompt) + [
        "You can use tools; each call's result appears after it as <output>...</output>."]
        + [f"{TOOLS[n][0]}." for n in names])


# --num_few_shot 1 (the default) puts this problem before the question, worked with the calculator;
# with --tools none, worked without it, so that the two runs differ in the tool alone.
EXAMPLE = {"question": "Mia has 214 cards and buys 23 bags with 105 cards in each bag. How many "
                       "cards does Mia have now?", "answer": "2629"}
WITH_CALC = "<calc>214 + 23 * 105</calc><output>2629</output>\nThe answer is 2629."
WITHOUT = "214 + 23 * 105 = 2629\nThe answer is 2629."


def show_tools(env, names, num_few_shot):
    """The env's prompts name the tools (after the task's own instructions, or after the user's
    --system_prompt: a model is never offered tools it was not told of) and, where the calculator
    is one, work the example with it (tools.py's prompts). Once per env."""
    if env is None:
        return
    if names:
        env.system_prompt = system_prompt(env.system_prompt, names)
    if num_few_shot and (not names or "calc" in names):
        env.few_shot = [dict(EXAMPLE, solution=WITH_CALC if names else WITHOUT)]
