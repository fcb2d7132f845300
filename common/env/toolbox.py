"""The tools of tools.py: what the model may call inside its response, and how a call is found.

A call is `<name>argument</name>`; its result goes back to the model as `<output>result</output>`:

    find_call("So <calc>214 + 23 * 105</calc><", ("calc",))   # ("calc", "214 + 23 * 105")
    run_tool("calc", "214 + 23 * 105")                           # "2629"
    run_tool("calc", "__import__('os')")                         # "error: not arithmetic ..."

With --tool_format template the chat template shows the tools (`tool_schema`, JSON schemas) and a
call is JSON in Qwen's and Hermes' tags, read with json.loads and checked against the schema:

    answer_call('<tool_call>{"name": "calc", "arguments": {"expression": "2 * 3"}}</tool_call>',
                ("calc",), "template")                             # "6"

No tool ever runs model text as code: `calc` is common/env/answers.py's AST whitelist (+ - * / and
brackets, exact fractions), and solve / simplify / factor parse the text with the grader's
whitelisted parser and run sympy in a grader worker, within the grader's budget of CPU time
(common/env/grader.py, `run_sympy_tool`); a sum (`\\sum_{k=1}^{10} k`) is added up there. A tool
that fails, for any reason, answers with a text that starts with "error:", which the model reads;
nothing is raised.
"""

import json

from common.env.answers import safe_arith
from common.env.grader import SYMPY_TOOLS, run_sympy_tool

MAX_ARGUMENT = 300  # characters of a call's argument: calculator expressions are short
# --tool_format template: a call is JSON in Qwen's and Hermes' tags, its one argument a string
CALL_OPEN, CALL_CLOSE, ARGUMENT = "<tool_call>", "</tool_call>", "expression"
MAX_CALL = 500  # characters of a call's JSON: its argument and the name around it


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


def stop_strings(names, tool_format="tags") -> tuple:
    """The closing tags: sampling stops at the first one, and the tool runs."""
    if tool_format == "template":
        return (CALL_CLOSE,)
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


def answer_call(text: str, names, tool_format="tags") -> str | None:
    """The tool's answer to the call that the end of `text` closes (tags: `<calc>2 * 3</calc>`;
    template: `<tool_call>{json}</tool_call>`), or None where no call ends it. Never raises: what is
    wrong with a call is its answer, one line that starts with "error:"."""
    if tool_format == "tags":
        call = find_call(text, names)
        return None if call is None else run_tool(*call)
    at = text.rfind(CALL_CLOSE)
    if at < 0 or len(text) - at - len(CALL_CLOSE) > 8:  # the stop string did not end the turn
        return None
    opened = text.rfind(CALL_OPEN, 0, at)
    if opened < 0:
        return f"error: no {CALL_OPEN}"
    try:
        name, argument = read_json_call(text[opened + len(CALL_OPEN):at], names)
    except ValueError as e:  # nothing runs
        return f"error: {e}"
    return run_tool(name, argument)


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


def show_tools(env, names, num_few_shot, tool_format="tags"):
    """The env's prompts name the tools (after the task's own instructions, or after the user's
    --system_prompt: a model is never offered tools it was not told of) and, where the calculator
    is one, work the example with it (tools.py's prompts). Once per env. With --tool_format
    template the chat template names the tools, and the prompts show no worked example."""
    if env is None:
        return
    if tool_format == "template":
        # The template's own text says how a call is written, and a model whose template takes
        # tools was tuned on that format. An example in it would need an assistant turn with a
        # call and a tool message before the question, which MathEnv's prompts (question and
        # worked answer pairs) do not hold; a worked answer in tags would teach the wrong format,
        # and one by hand would teach not to call.
        env.few_shot = []
        return
    if names:
        env.system_prompt = system_prompt(env.system_prompt, names)
    if num_few_shot and (not names or "calc" in names):
        env.few_shot = [dict(EXAMPLE, solution=WITH_CALC if names else WITHOUT)]


# ---- --tool_format template: the chat template shows the tools; a call is JSON
# name -> (what the tool does, what its argument is), as the template shows them
DOCS = {
    "calc": ("A calculator: the exact value of an arithmetic expression (+ - * / and brackets), "
             "as an integer or a reduced fraction.", "the expression, e.g. 214 + 23 * 105"),
    "solve": ("sympy's solve: the solutions of an equation in one unknown (an expression is "
              "solved for = 0).", "the equation, e.g. x^2 = 4"),
    "simplify": ("sympy's simplify: the expression in a simpler form (a sum is added up).",
                 "the expression, e.g. (x^2 - 1)/(x - 1)"),
    "factor": ("sympy's factor: the expression as a product of factors.",
               "the expression, e.g. x^2 - 4"),
}


def tool_schema(name: str) -> dict:
    """Tool `name` as the JSON schema a chat template shows (apply_chat_template's `tools`): the
    dict transformers' get_json_schema makes of `def calc(expression: str) -> str` and its Google-
    style docstring, which is what TRL's `tools=` passes. Written out, as the tools are not typed
    functions of one name each (`calc` above takes the raw text)."""
    description, argument = DOCS[name]
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object",
                       "properties": {ARGUMENT: {"type": "string", "description": argument}},
                       "required": [ARGUMENT]},
        "return": {"type": "string"}}}


def read_json_call(body: str, names) -> tuple:
    """(name, argument) of a call's JSON, {"name": "calc", "arguments": {"expression": "2 * 3"}},
    read with json.loads (model text is never eval'd) and checked against the tool's schema: a
    ValueError says in one line what is wrong (an error the model reads; nothing runs)."""
    if len(body) > MAX_CALL:
        raise ValueError(f"the call is longer than {MAX_CALL} characters")
    try:
        call = json.loads(body)
    except RecursionError:  # [[[[... past Python's stack
        raise ValueError("not JSON (nested too deep)") from None
    except ValueError as e:
        raise ValueError(f"not JSON ({e.msg} at character {e.pos})") from None
    if not (isinstance(call, dict) and isinstance(call.get("name"), str) and "arguments" in call):
        raise ValueError('a call is {"name": <tool>, "arguments": {...}}')
    name, arguments = call["name"], call["arguments"]
    if name not in names:
        raise ValueError(f"no tool {name[:40]!r}; the tools are {', '.join(names)}")
    if not isinstance(arguments, dict):
        raise ValueError(f"{name}'s arguments are an object, not "
                         f"{article(json_kind(arguments))}")
    check_arguments(tool_schema(name), arguments)
    return name, arguments[ARGUMENT]


def check_arguments(schema: dict, arguments: dict):
    """A ValueError, in one line, where `arguments` miss one the schema requires, name one it has
    not, or give one a value of another JSON type (a number is no string: nothing is converted)."""
    name, parameters = schema["function"]["name"], schema["function"]["parameters"]
    properties = parameters["properties"]
    missing = [key for key in parameters["required"] if key not in arguments]
    if missing:
        raise ValueError(f"{name} needs the argument {missing[0]!r}")
    unknown = [key for key in arguments if key not in properties]
    if unknown:
        raise ValueError(f"{name} has no argument {unknown[0][:40]!r}; it takes "
                         f"{', '.join(properties)}")
    for key, value in arguments.items():
        wanted, given = properties[key]["type"], json_kind(value)
        if given != wanted and (wanted, given) != ("number", "integer"):  # 6 is a number too
            raise ValueError(f"{name}'s {key!r} is {article(given)}; it takes {article(wanted)}")


def json_kind(value) -> str:
    """The JSON type of a value json.loads made: string, integer, number, boolean, array, object
    or null."""
    kinds = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array",
             dict: "object"}
    return kinds.get(type(value), "null")


def article(kind: str) -> str:
    """The kind with its article: "a string", "an integer", "null"."""
    return kind if kind == "null" else ("an " if kind[0] in "aeiou" else "a ") + kind
