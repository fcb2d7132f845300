"""What a run writes while it goes: a progress bar, metrics.jsonl, eval.jsonl, samples.jsonl,
TensorBoard when installed and wandb with --track; the run's last line."""

import contextlib
import errno
import json
import math
import os
import stat
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from common.distributed import print0
from common.errors import PathError


LOG_FILES = ("metrics.jsonl", "eval.jsonl", "samples.jsonl")  # in the run's output_dir
# What the Logger writes in the run's output_dir; checkpoint-N/ are common/run/checkpoints.py's.
RUN_FILES = ("args.json", *LOG_FILES, "tb")
# The key of a log line that counts its NaN and inf values, each written as null (absent when 0).
NONFINITE = "nonfinite"


def json_line(record):
    """`record` as one line of strict JSON. json.dumps would write NaN and inf as bare NaN and
    Infinity, which jq and strict JSON readers reject; they become null (inside lists and dicts
    too), and the line counts them under "nonfinite". allow_nan=False makes any value missed here an
    error rather than a line no tool reads."""
    count = 0

    def finite(value):
        nonlocal count
        if isinstance(value, float) and not math.isfinite(value):
            count += 1
            return None
        if isinstance(value, dict):
            return {k: finite(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [finite(v) for v in value]
        return value

    record = finite(record)
    if count:
        record[NONFINITE] = count
    return json.dumps(record, allow_nan=False)


def plain_mode(path, mode):
    """mkstemp and mkdtemp make a 0600 file, a 0700 folder; a run's files and checkpoints get the
    mode open() and mkdir() give under the umask, so that others may read a shared run folder."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, mode & ~umask)


# What each kind of file-system entry is called in a message, by stat's S_IFMT bits.
KINDS = {stat.S_IFDIR: "a folder", stat.S_IFLNK: "a symbolic link",
         stat.S_IFIFO: "a named pipe (FIFO)", stat.S_IFSOCK: "a socket",
         stat.S_IFCHR: "a device", stat.S_IFBLK: "a device"}
# A run continues after its disk filled up by resuming; eval.py has no resume, it runs again.
RESUME = "then run the same command with --resume: it continues from the last complete checkpoint"


def kind_of(path):
    """What is at `path`, unfollowed: None (nothing), "a file" (a regular one), or KINDS' name."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    return "a file" if stat.S_ISREG(mode) else KINDS.get(stat.S_IFMT(mode), "no regular file")


def refuse_special(path, instead="pass another --output_dir"):
    """PathError if `path` is a folder, a named pipe, a socket or a device: what no rename of a
    new file replaces (a folder), or what opening waits on forever (a pipe without a reader). A
    symbolic link is each caller's policy: a rename replaces it, open_log and the run folder's
    check refuse it. `instead`: what to do other than removing it, ending the message."""
    kind = kind_of(path)
    if kind not in (None, "a file", "a symbolic link"):
        raise PathError(f"{path} is {kind}, where a file is written: remove it (rm -r {path}), or "
                        f"{instead}.")


@contextlib.contextmanager
def disk_room(what, then=RESUME, need=0):
    """A full disk (or a full quota) while writing `what` is one line that says so, not a
    traceback: every write of the logs, checkpoints and eval.py's results goes through here, so
    that the class is closed wherever a run writes. `then`: what to do once there is room. need:
    the bytes being written, for writers whose error does not say why (torch.save's is "unexpected
    pos 576 vs 534"): their failure is the disk's when it has less room than that."""
    try:
        yield
    except Exception as e:
        if not out_of_room(e, Path(what).parent, need):
            raise
        raise disk_full(what, e, then) from None


def disk_full(what, error, then=RESUME):
    """The one-line error of a full disk met while writing `what`."""
    said = error.strerror if isinstance(error, OSError) and error.strerror else None
    return PathError(f"the disk is full ({said or os.strerror(errno.ENOSPC)}) while writing "
                     f"{what}: free some space (or pass a folder on another disk), {then}.")


def out_of_room(error, folder, need=0):
    """Whether `error`, raised while writing into `folder`, came from a full disk or quota: its
    errno, its text (safetensors says "os error 28"), or less room left than `need` bytes."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = f"{error} {error.__context__}"
    if any(os.strerror(code) in text for code in (errno.ENOSPC, errno.EDQUOT)):
        return True
    try:
        room = os.statvfs(folder)
    except OSError:
        return False
    return room.f_bavail * room.f_frsize < need


def replace_file(path, text, then=RESUME):
    """Write `text` to `path` by a rename of a new file made beside it: a kill leaves the old file
    or the new one whole, and a symbolic link planted at `path` is replaced, never followed. A
    folder or a named pipe there is refused; a full disk leaves the old file and no temporary."""
    refuse_special(path, "write elsewhere")
    with disk_room(path, then):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            plain_mode(tmp, 0o666)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise


def check_new_file(path, flag, overwrite):
    """Stop, before any work, unless `path` may take a new file: nothing there, or, with
    --overwrite, a file. The rule of a training run's folder (check_run_folder) for a file written
    outside one (eval.py's results and summary): a symbolic link is refused even with --overwrite
    (the write would land where it points), and a folder, a named pipe, a socket or a device too."""
    kind = kind_of(path)
    if kind == "a symbolic link":
        raise PathError(f"{flag}: {path} is a symbolic link (to {os.readlink(path)}), and nothing "
                        f"is written through a link: remove it (rm {path}), or pass another "
                        f"{flag}.")
    if kind not in (None, "a file"):
        raise PathError(f"{flag}: {path} is {kind}, not a file: pass the path of a file to write "
                        f"(another {flag}).")
    if kind == "a file" and not overwrite:
        raise PathError(f"{flag} {path} exists (an earlier evaluation): pass --overwrite to "
                        f"replace it, or another {flag}.")


def open_log(path):
    """`path` opened to append lines, created if missing. A symbolic link there is refused, not
    followed (the run would write through it, outside its folder), and so is anything but a regular
    file. O_NONBLOCK: a named pipe there fails at once instead of waiting for a reader that never
    comes; the kind is checked on what was opened too, so that a swap after any check is caught."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK,
                     0o644)
    except OSError as e:
        _refuse_unopened(path, e)
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # a pipe with a reader, a device
        os.close(fd)
        _refuse_log(path)
    os.set_blocking(fd, True)
    return os.fdopen(fd, "a")


def _refuse_unopened(path, error):
    """open_log's errors, for a path that os.open refused: what is there, or a full disk."""
    if kind_of(path) not in (None, "a file"):  # a link, a pipe without a reader, a folder
        _refuse_log(path)
    if out_of_room(error, path.parent):
        raise disk_full(path, error) from None


def _refuse_log(path):
    """The PathError of a log that open_log will not append to, by what is there."""
    if kind_of(path) == "a symbolic link":
        raise PathError(f"{path} is a symbolic link (to {os.readlink(path)}): a run follows no "
                        "link in its folder; remove it, or pass another --output_dir.")
    refuse_special(path)
    raise PathError(f"{path} is no regular file: remove it, or pass another --output_dir.")


def mean_of(stats):
    """A list of metric dicts -> each key's mean over the dicts that hold it."""
    keys = dict.fromkeys(k for s in stats for k in s)
    return {k: sum(s[k] for s in stats if k in s) / sum(k in s for s in stats) for k in keys}


def every(step, interval):
    """Whether an every-`interval`-updates event (eval, save) falls on update `step`; interval 0:
    never."""
    return bool(interval) and step % interval == 0


def report_end(first_acc, final_acc, path, adapter=False):
    """The last line of a run: held-out accuracy before and after, and where the policy went."""
    accuracy = " -> ".join(f"{a:.3f}" for a in (first_acc, final_acc) if a is not None)
    # the exact call that loads it, so that a reader can paste it; eval.py takes either folder
    loads = (_adapter_loads(path) if adapter else
             f"transformers.AutoModelForCausalLM.from_pretrained({str(path)!r}) loads it")
    print0(f"held-out greedy accuracy {accuracy or 'not measured'}; policy saved to {path} "
           f"({loads})")


def _adapter_loads(path):
    """report_end's words for a LoRA policy: the calls that load and evaluate its adapter."""
    return (f"a LoRA adapter: peft.AutoPeftModelForCausalLM.from_pretrained({str(path)!r}) loads "
            f"it with its base, python eval.py --model_name_or_path {path} evaluates it")


class Logger:
    """A progress bar, {output_dir}/metrics.jsonl (one JSON object per logged update),
    samples.jsonl, eval.jsonl, TensorBoard when installed, and wandb with track=True. On ranks other
    than 0 every method is a no-op. Every line is strict JSON (json_line): a NaN or inf is null, and
    the line's "nonfinite" key says how many there were.

    A run from update 0 starts the three files anew; lines an earlier run left there (a run killed
    before its first checkpoint, continued with --resume) are kept as metrics.1.jsonl and so on. A
    resumed run cuts them back to the lines of updates up to initial_step, the checkpoint's update,
    so that lines written after that checkpoint by the killed run are not doubled (a line cut short
    by the kill goes too)."""

    def __init__(self, args, initial_step=0, enabled=True):
        self.enabled = enabled
        if not enabled:
            return
        from tqdm.auto import tqdm

        self.dir = Path(args.output_dir)
        with disk_room(self.dir):
            self.dir.mkdir(parents=True, exist_ok=True)
        config = asdict(args)
        replace_file(self.dir / "args.json", json.dumps(config, indent=2, default=str))
        files = [self.dir / name for name in LOG_FILES]
        for path in files:
            if initial_step > 0:
                _keep_lines_up_to(path, initial_step)
            else:  # a run from update 0 never writes over the lines of an earlier one
                _set_aside(path)
        self.metrics_file, self.eval_file, self.samples_file = (open_log(path) for path in files)
        self.start = time.time()
        self.bar = tqdm(total=args.max_steps, initial=initial_step, desc="updates",
                        dynamic_ncols=True)
        self.tb = None
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(self.dir / "tb"))
        except ImportError:  # an optional extra: the jsonl logs hold the same numbers
            print0("TensorBoard logs are not written: tensorboard is not installed (pip install -r "
                   "requirements-extra.txt)")
        self.wandb = self._wandb_run(args, config) if args.track else None
        self.warned, self.kl_history = set(), []

    def _wandb_run(self, args, config):
        """--track: the Weights & Biases run that every logged line goes to as well."""
        import wandb

        return wandb.init(project=args.wandb_project, name=self.dir.name, config=config)

    def log(self, step, metrics):
        """One JSON line per update in metrics.jsonl."""
        if not self.enabled:
            return
        self._write(self.metrics_file, step, metrics)
        self.bar.update(1)
        self._show(step, metrics)
        self._watch(step, metrics)

    def _watch(self, step, metrics):
        """Say once, in the log, when a run looks like it is diverging: the policy moved far from
        the one that sampled (approx_kl inf, above 1, or 10 times its usual size), or its entropy
        collapsed to about 0."""
        kl, entropy = metrics.get("approx_kl"), metrics.get("entropy")
        history = self.kl_history
        usual = sorted(history)[len(history) // 2] if len(history) >= 5 else None
        far = usual is not None and kl is not None and kl > max(0.05, 10 * usual)
        if kl is not None and (not math.isfinite(kl) or kl > 1.0 or far):
            self._warn_once("approx_kl", self._far_from_sampler(kl, step, usual))
        elif kl is not None:
            self.kl_history.append(kl)
        if entropy is not None and entropy < 1e-3:
            self._warn_once("entropy", self._collapsed(entropy, step))

    @staticmethod
    def _far_from_sampler(kl, step, usual):
        """_watch's warning, for an approx_kl that says the policy moved far."""
        return (f"warning: approx_kl is {kl:.4g} at update {step} (usually "
                f"{'n/a' if usual is None else f'{usual:.3g}'}): the policy moved far from the one "
                "that sampled, a sign of divergence; consider a lower --learning_rate.")

    @staticmethod
    def _collapsed(entropy, step):
        """_watch's warning, for an entropy that collapsed to about 0."""
        return (f"warning: the policy's entropy collapsed to {entropy:.2g} at update {step}: its "
                "samples are (nearly) all the same, so they carry little learning signal.")

    def _warn_once(self, kind, text):
        if kind not in self.warned:
            self.warned.add(kind)
            self.bar.write(text)

    def log_eval(self, step, metrics):
        """Evaluations go to eval.jsonl (step 0 is before any update)."""
        if not self.enabled:
            return
        self._write(self.eval_file, step, metrics)
        self._show(step, metrics)

    def _write(self, file, step, metrics):
        with disk_room(file.name):
            file.write(json_line({"step": step, "time": round(time.time() - self.start, 2),
                                  **metrics}) + "\n")
            file.flush()
        if self.tb:
            for k, v in metrics.items():
                self.tb.add_scalar(k, v, step)
        if self.wandb:
            self.wandb.log(metrics, step=step)

    def _show(self, step, metrics):
        shown = {k: metrics[k] for k in ("reward/mean", "accuracy", "eval/accuracy",
                                         "kl_ref") if k in metrics}
        self.bar.set_postfix({k: f"{v:.3f}" for k, v in shown.items()}, refresh=True)

    def log_samples(self, step, samples, show=1):
        """samples: list of dicts (prompt, response, reward, ...). All go to samples.jsonl; `show`
        are printed so that reward hacking is visible while the run goes."""
        if not self.enabled:
            return
        with disk_room(self.samples_file.name):
            for s in samples:
                self.samples_file.write(json_line({"step": step, **s}) + "\n")
            self.samples_file.flush()
        for s in samples[:show]:
            said = f" reward={s['reward']} " if "reward" in s else " "  # sft.py's: a solution
            self.bar.write(f"[step {step}]{said} {s.get('response', '')[:300]!r}")

    def close(self):
        if not self.enabled:
            return
        self.bar.close()
        for f in (self.metrics_file, self.eval_file, self.samples_file):
            f.close()
        if self.tb:
            self.tb.close()
        if self.wandb:
            self.wandb.finish()


def _set_aside(path):
    """Rename a non-empty log to the first free name.k.jsonl, and start an empty one."""
    refuse_special(path)
    if path.exists() and path.stat().st_size:
        _keep_aside(path)
    open_log(path).close()


def _keep_aside(path):
    """_set_aside's rename, for a log that an earlier run left lines in."""
    k = 1
    while os.path.lexists(aside := path.with_name(f"{path.stem}.{k}{path.suffix}")):
        k += 1
    os.replace(path, aside)
    print0(f"{path.name}: the earlier run's lines are kept in {aside.name}")


def _keep_lines_up_to(path, step):
    """Rewrite a jsonl log keeping the whole lines whose "step" is <= step."""
    refuse_special(path)
    if not path.exists():
        open_log(path).close()
        return
    kept = []
    # a link's target is not read (it may be a pipe): the rename below replaces the link
    lines = path.read_text().splitlines() if kind_of(path) == "a file" else []
    for line in lines:
        try:
            if json.loads(line)["step"] <= step:
                kept.append(line + "\n")
        except (ValueError, KeyError, TypeError):
            pass  # cut short by a kill
    replace_file(path, "".join(kept))  # a kill during the rewrite must not lose the lines
