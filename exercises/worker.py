"""The student's side of the grading mode (exercises/grade.py): a process that runs one student's
functions on the inputs it is sent, and sends back their outputs. It holds no solution and no
checker: the oracle, the comparison and the verdict stay in the grader's process.

    python -I -B -c "$(cat worker.py)" REQUESTS RESPONSES LIMITS    # by the grader, not by hand

The grader starts it from this file's text, in a fresh empty folder. Before any of the student's
code runs, this file's own code takes the two pipes it was given (the grader's requests in, its
answers out), sets the limits (memory, file size, processes, CPU time), gives up root's
capabilities where it runs as root, and leaves the project off its path; the student's files then
come as text through the pipe, one exercise at a time. Each message is a length-prefixed JSON object, and a tensor
travels as its dtype, shape and bytes: nothing the grader reads back is run or unpickled.

It imports only the standard library and torch (and numpy, for students who use it).
"""

import base64
import ctypes
import json
import os
import signal
import struct
import sys
import traceback
import types

import torch

MAX_MESSAGE = 64 << 20  # bytes: more than any output of the exercises, less than a flood
HEADER = struct.Struct(">Q")
DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.uint8, torch.int8,
    torch.int16, torch.int32, torch.int64, torch.bool)}


# ---- the wire: values as JSON, tensors as their bytes -------------------------------------------


class Opaque:
    """An output the wire does not carry (a numpy array, a generator): its type and text only, so
    that it is shown to the student and equals nothing."""

    def __init__(self, kind, text):
        self.kind, self.text = str(kind)[:100], str(text)[:300]

    def __repr__(self):
        return self.text


def encode(value, depth=0):
    """A value as tagged JSON: tensors, numbers, strings, None, and tuples, lists and dicts of
    them; anything else as its type and text."""
    if depth > 20:
        return {"t": "other", "kind": "nesting", "text": "a value nested more than 20 deep"}
    if isinstance(value, torch.Tensor):
        try:
            t = value.detach().cpu().contiguous()
            name = str(t.dtype).removeprefix("torch.")
            if name in DTYPES and t.layout == torch.strided:
                data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
                return {"t": "tensor", "dtype": name, "shape": list(t.shape),
                        "data": base64.b64encode(data).decode()}
        except Exception:
            pass
    elif isinstance(value, bool) or value is None:
        return {"t": "atom", "v": value}
    elif isinstance(value, int):
        return {"t": "int", "v": str(value)}  # an int of any size, as its digits
    elif isinstance(value, float):
        return {"t": "float", "v": value}
    elif isinstance(value, str):
        return {"t": "str", "v": value[:10000]}
    elif isinstance(value, (tuple, list)):
        return {"t": "tuple" if isinstance(value, tuple) else "list",
                "v": [encode(v, depth + 1) for v in list(value)[:10000]]}
    elif isinstance(value, dict):
        return {"t": "dict", "v": [[str(k), encode(v, depth + 1)]
                                   for k, v in list(value.items())[:10000]]}
    try:
        text = repr(value)
    except Exception:
        text = f"an object of type {type(value).__name__}"
    return {"t": "other", "kind": type(value).__name__, "text": text[:300]}


def decode(obj, depth=0):
    """encode()'s inverse, strict: anything out of form raises ValueError."""
    if depth > 21 or not isinstance(obj, dict):
        raise ValueError("a value out of form")
    tag, value = obj.get("t"), obj.get("v")
    if tag == "tensor":
        dtype, shape = DTYPES.get(obj.get("dtype")), obj.get("shape")
        if dtype is None or not isinstance(shape, list) or len(shape) > 8 or not all(
                type(n) is int and 0 <= n < 2**31 for n in shape):
            raise ValueError("a tensor out of form")
        data = base64.b64decode(obj.get("data", ""), validate=True)
        numel = 1
        for n in shape:
            numel *= n
        if len(data) != numel * torch.empty((), dtype=dtype).element_size():
            raise ValueError("a tensor whose bytes do not fill its shape")
        if not numel:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(bytearray(data), dtype=dtype).reshape(shape).clone()
    if tag == "atom" and (value is None or isinstance(value, bool)):
        return value
    if tag == "int" and isinstance(value, str) and len(value) < 5000:
        return int(value)
    if tag == "float" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if tag == "str" and isinstance(value, str):
        return value
    if tag in ("tuple", "list") and isinstance(value, list):
        items = [decode(v, depth + 1) for v in value]
        return tuple(items) if tag == "tuple" else items
    if tag == "dict" and isinstance(value, list) and all(
            isinstance(kv, list) and len(kv) == 2 and isinstance(kv[0], str) for kv in value):
        return {k: decode(v, depth + 1) for k, v in value}
    if tag == "other":
        return Opaque(obj.get("kind"), obj.get("text"))
    raise ValueError("a value out of form")


def send(fd, message: dict, wait=None) -> None:
    """A framed message on fd. wait() -> None blocks until fd can be written (the grader's
    deadline, on a non-blocking pipe, so that a worker that stops reading cannot hold it)."""
    data = json.dumps(message).encode()
    data = HEADER.pack(len(data)) + data
    while data:
        if wait:
            wait()
        try:
            data = data[os.write(fd, data):]
        except BlockingIOError:
            continue


def receive(fd, wait=None) -> dict:
    """The next message on fd. wait(seconds) -> None blocks until fd can be read (the grader's
    deadline); EOFError when the other side is gone, ValueError on a message out of form."""
    size = HEADER.unpack(_read(fd, HEADER.size, wait))[0]
    if size > MAX_MESSAGE:
        raise ValueError(f"a message of {size:,} bytes, more than the {MAX_MESSAGE >> 20} MiB "
                         "an output may take")
    message = json.loads(_read(fd, size, wait))
    if not isinstance(message, dict):
        raise ValueError("a message that is not an object")
    return message


def _read(fd, n, wait):
    chunks = []
    while n:
        if wait:
            wait()
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


# ---- the gradient of an output ------------------------------------------------------------------
# exercises/exercise.py compares these for the student's function and the oracle's: both are
# computed here, the student's in this process.


def projected_gradients(fn, kwargs, names):
    """{name: d sum(w * output) / d input} for the inputs `names`, with w a fixed random
    projection; None where the output carries no gradient at all."""
    given = dict(kwargs)
    leaves = {}
    for name in names:
        leaves[name] = kwargs[name].detach().double().requires_grad_()
        # a copy of the leaf goes in, so that an in-place line in the function stays legal
        given[name] = leaves[name].to(kwargs[name].dtype).clone()
    out = fn(**given)
    outputs = [t for t in (out if isinstance(out, (tuple, list)) else (out,))
               if isinstance(t, torch.Tensor) and t.is_floating_point()]
    g = torch.Generator().manual_seed(0)
    weights = [torch.randn(t.shape, generator=g, dtype=torch.float64) for t in outputs]
    terms = [(w * t.double()).sum() for w, t in zip(weights, outputs) if t.requires_grad]
    if not terms:
        return None
    grads = torch.autograd.grad(sum(terms), list(leaves.values()), allow_unused=True)
    return {name: torch.zeros_like(leaves[name]) if grad is None else grad
            for name, grad in zip(leaves, grads)}


# ---- the process --------------------------------------------------------------------------------


def confine(limits: dict) -> None:
    """The limits, set by this file before any student's code is imported."""
    import resource  # here, not above: the checker imports this file on any system, Windows too

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: gone when the grader is
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    x = torch.ones(2, requires_grad=True)  # the threads torch starts on first use, started now
    (x * 2).sum().backward()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails, and says so
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_seconds"],) * 2)
    with open("/proc/self/statm") as f:  # what torch took already, plus the student's share
        mapped = int(f.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (mapped + limits["memory_bytes"],) * 2)
    # No new process or thread: the count is of every process of this user, so 1 is none more.
    # Linux does not hold root to it: under root the grader kills what is left after each student.
    resource.setrlimit(resource.RLIMIT_NPROC, (1, 1))
    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS: nothing exec'd gains rights
    libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: another student's process cannot read this one
    if os.geteuid() == 0:  # root without its capabilities: no reading other processes' files
        for cap in range(64):  # the bounding set, so that an exec'd program regains none
            libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
        if libc.capset(header, (ctypes.c_uint32 * 6)()) != 0:
            raise OSError(ctypes.get_errno(), "capset failed")


def load(module, name, source):
    """The student's function from its file's text, or why not, as the grader words it
    (exercises/grade.py). The text comes through the pipe, not from a file another process could
    change before it is read."""
    try:
        code = compile(source, f"{module}.py", "exec")
    except (SyntaxError, ValueError) as e:  # IndentationError too; ValueError: a NUL byte
        return None, {"error": "syntax", "type": "SyntaxError" if isinstance(e, ValueError)
                      else type(e).__name__, "message": str(getattr(e, "msg", e)),
                      "line": getattr(e, "lineno", None) or 1}
    loaded = types.ModuleType(module)
    loaded.__file__ = f"{module}.py"
    sys.modules[module] = loaded
    try:
        exec(code, loaded.__dict__)  # the student's own file: what this process is for
    except BaseException as e:
        lines = [f.lineno for f in traceback.extract_tb(e.__traceback__)
                 if f.filename == f"{module}.py"]
        return None, {"error": "raised", "type": type(e).__name__, "message": str(e)[:500],
                      "line": lines[-1] if lines else None}
    fn = getattr(loaded, name, None)
    if not callable(fn):
        return None, {"error": "no_function"}
    return fn, {"loaded": True}


def call(fn, request) -> dict:
    kwargs = decode(request["kwargs"])
    before = {k: encode(v) for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
    try:
        if request.get("grad"):
            return {"grads": encode(projected_gradients(fn, kwargs, request["grad"]))}
        out = fn(**kwargs)
    except SystemExit as e:
        return {"raised": "SystemExit", "code": encode(e.code)}
    except BaseException as e:  # KeyboardInterrupt too: the student's, said as theirs
        try:
            said = str(e)[:500]
        except BaseException:
            said = ""
        return {"raised": type(e).__name__, "message": said}
    # An input changed in place goes back as it is now, so that the grader sees it changed.
    after = {k: encode(kwargs[k]) for k in before}
    return {"output": encode(out), "changed": {k: v for k, v in after.items() if v != before[k]}}


def main(argv) -> None:
    requests, responses = int(argv[0]), int(argv[1])
    try:
        import numpy  # noqa: F401 (a student's file may use it: imported before the limits)
    except ImportError:
        pass
    confine(json.loads(argv[2]))
    sys.path[:] = [os.getcwd()] + [p for p in sys.path if p and "site-packages" in p
                                   or p.startswith(sys.base_prefix)]
    functions = {}
    send(responses, {"ready": True})
    while True:
        try:
            request = receive(requests)
        except EOFError:
            return
        answer = {"id": request.get("id")}
        if request["op"] == "load":
            fn, said = load(request["module"], request["name"],
                            base64.b64decode(request["source"]))
            functions[request["module"]] = fn
            answer.update(said)
        else:
            answer.update(call(functions[request["module"]], request))
        sys.stdout.flush()
        send(responses, answer)


if __name__ == "__main__":
    main(sys.argv[1:])
