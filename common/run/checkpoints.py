"""Checkpoints: a folder that AutoModelForCausalLM.from_pretrained (or peft) loads, plus
trainer_state.pt for --resume; where a run starts. Saves survive a kill at any moment, and no
checkpoint holds NaN."""

import contextlib
import json
import os
import re
import shutil
import socket
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from common.run.args import algorithm_of, runs_of
from common.distributed import all_gather_objects, print0
from common.errors import NonFiniteError, PathError, UsageError, UserError, at_exit
from common.run.logger import LOG_FILES, RUN_FILES, disk_room, kind_of, plain_mode
from common.models.loading import check_safetensors, load_policy, refuse_code
from common.models.sharding import full_state_dict, optimizer_state, untied


def _non_finite(tensors, prefix=""):
    """Names of the floating-point tensors holding NaN or inf, in a (nested) dict of tensors."""
    bad = []
    for name, t in tensors.items():
        if isinstance(t, dict):
            bad += _non_finite(t, f"{prefix}{name}.")
        elif torch.is_tensor(t) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
            bad.append(prefix + name)
    return bad


def save_checkpoint(path, model, tokenizer, step, optimizers=None, extra=None, merge_base=None,
                    algorithm=None):
    """Writes `path/` with the policy (save_pretrained, safetensors; a LoRA policy's adapter), its
    tokenizer, trainer_state.pt (the step, optimizer states, any extra state, e.g. a critic's
    weights, and the algorithm file that wrote it, which --resume checks) and manifest.json (every
    file's size). optimizers: {name: (module, optimizer)}. merge_base: a LoRA policy's base model,
    to also write the merged model in `path/merged`.

    Every rank calls it (under --fsdp the weights and optimizer states are gathered); rank 0 writes.
    A kill at any moment leaves either the previous checkpoint or the new one whole: the files are
    written into a new folder `path.<random>.tmp`, which `checkpoints` ignores, and renamed into
    place only when complete. The folder is made here, so that no link planted in the run folder
    (a checkpoint-N.tmp pointing elsewhere) receives the checkpoint. Weights holding NaN or inf are
    never written."""
    path = Path(path)
    weights = untied(model, full_state_dict(model))
    optimizer_states = {k: optimizer_state(m, o) for k, (m, o) in (optimizers or {}).items()}
    main = not dist.is_initialized() or dist.get_rank() == 0
    bad = _non_finite({**weights, "extra": extra or {}}) if main else None
    if dist.is_initialized():  # every rank stops, not only the one that looked
        bad = all_gather_objects(bad)[0]
    if bad:
        raise _nan_error(path, bad)
    if not main:
        return
    # a full disk is one line that says so (disk_room); the unfinished folder goes, so that the
    # room it took is free again, and --resume continues from the previous checkpoint
    need = sum(t.numel() * t.element_size() for t in weights.values() if torch.is_tensor(t))
    tmp = None
    try:
        with disk_room(path, need=need):
            path.parent.mkdir(parents=True, exist_ok=True)
            for left in path.parent.glob(f"{path.name}.*tmp"):  # by a save that was killed
                if not left.is_symlink():
                    shutil.rmtree(left, ignore_errors=True)
            tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f"{path.name}.", suffix=".tmp"))
            _write_checkpoint(path, tmp, model, weights, tokenizer, step, optimizer_states, extra,
                              merge_base, algorithm)
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise


def _nan_error(path, bad):
    """save_checkpoint's error, for weights or extra state that hold NaN or inf (`bad`)."""
    return NonFiniteError(f"not writing {path}: {bad[0]} ({len(bad)} tensors in all) holds NaN or "
                          "inf. The previous checkpoint is intact; --resume continues from it.")


def _write_checkpoint(path, tmp, model, weights, tokenizer, step, optimizer_states, extra,
                      merge_base, algorithm):
    """save_checkpoint's files, written into the new folder `tmp`, then renamed to `path`."""
    plain_mode(tmp, 0o777)
    model.save_pretrained(tmp, state_dict=weights, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    if merge_base:
        _save_merged(merge_base, tmp, tokenizer)
    state = {"step": step, "optimizers": optimizer_states, "extra": extra or {},
             "algorithm": algorithm}
    torch.save(state, tmp / "trainer_state.pt")
    sizes = {str(f.relative_to(tmp)): f.stat().st_size
             for f in sorted(tmp.rglob("*")) if f.is_file()}
    (tmp / "manifest.json").write_text(json.dumps(sizes, indent=1))
    if path.is_symlink():  # planted while the run went: the link goes, never what it names
        path.unlink()
    if path.exists():
        _swap_in(tmp, path)
    else:
        os.replace(tmp, path)


def _swap_in(tmp, path):
    """_write_checkpoint's rename where the same step was saved before."""
    # a swap by renames, so that a whole copy exists at every moment
    old = tempfile.mkdtemp(dir=path.parent, prefix=f"{path.name}.", suffix=".old")
    os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old)


def _save_merged(base_name, adapter_dir, tokenizer):
    """--merge_lora: the adapter just written in adapter_dir, merged into a fresh copy of its base
    model, as a folder that AutoModelForCausalLM.from_pretrained loads."""
    from peft import PeftModel

    merged = PeftModel.from_pretrained(load_policy(base_name), str(adapter_dir)).merge_and_unload()
    merged.save_pretrained(adapter_dir / "merged", safe_serialization=True)
    tokenizer.save_pretrained(adapter_dir / "merged")


def checkpoints(output_dir):
    """The checkpoint-N folders of output_dir, newest first; unfinished saves (checkpoint-N.tmp) are
    not among them."""
    found = [(int(m.group(1)), p) for p in Path(output_dir).glob("checkpoint-*")
             if (m := re.fullmatch(r"checkpoint-(\d+)", p.name)) and p.is_dir()]
    return [p for _, p in sorted(found, reverse=True)]


def load_trainer_state(path):
    """trainer_state.pt of a checkpoint, after checking that every file its manifest lists is there
    at its size (a truncated or missing file raises ValueError).

    A checkpoint is data, not code: the file is read with weights_only=True, which rebuilds tensors,
    numbers, strings and containers and nothing else. A shared run folder whose trainer_state.pt
    names any other Python object (which a plain pickle would call while loading) is refused."""
    path = Path(path)
    if (path / "manifest.json").exists():
        for name, size in json.loads((path / "manifest.json").read_text()).items():
            found = (path / name).stat().st_size if (path / name).is_file() else None
            if found != size:
                raise ValueError(f"{name} has {'no file' if found is None else f'{found} bytes'}, "
                                 f"the manifest says {size} bytes")
    else:  # written before manifests, or a copy that lost it: the weights' own headers say
        for weights in sorted(path.glob("*.safetensors")):
            check_safetensors(weights)
    with refuse_code(f"--resume: {path / 'trainer_state.pt'}", "Resume only from checkpoints "
                     "written by mathrl, or start a new --output_dir."):
        return torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=True)


# ------------------------------------------------------------------------------------------------
# The run's folder: without --output_dir, a fresh one per run, as Hydra's outputs/<date>/<time> and
# wandb's run folders do, so that a second `python grpo.py` never meets the first one's logs.
# ------------------------------------------------------------------------------------------------
LATEST = "latest"  # runs/<file>/latest: a link to the newest run folder of that file


def run_folder(args, is_main):
    """The folder this run writes to. --output_dir given: that folder, by today's rules (never
    clobbered, never written through a link). Not given: a new runs/<file>/<date>_<time>, claimed
    now by rank 0 (a -2, -3... after it when two runs start in one second) and named on every rank;
    with --resume, the folder runs/<file>/latest names, which must exist."""
    if args.output_dir is not None:
        return args.output_dir
    parent = runs_of(args)
    if args.resume:
        link = parent / LATEST
        if not link.is_symlink() or not (parent / os.readlink(link)).is_dir():
            raise PathError(f"--resume continues the latest run in {parent}, but {link} names "
                            "none: pass --output_dir FOLDER, the folder of the run to continue.")
        return str(parent / os.readlink(link))
    name = None
    if is_main:
        stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
        parent.mkdir(parents=True, exist_ok=True)
        for n in range(1, 1000):
            name = stamp if n == 1 else f"{stamp}-{n}"
            try:
                (parent / name).mkdir()
                break
            except FileExistsError:
                continue
        at_exit(_drop_if_empty, parent / name)
    folder = str(parent / all_gather_objects(name)[0])  # rank 0's name, on every rank
    print0(f"run folder: {folder}")
    return folder


def point_latest(folder):
    """Make runs/<file>/latest name `folder`, once its run has written its first files. The link is
    made beside and renamed over the old one, so that a reader never finds it missing. Where links
    cannot be made (some Windows setups) the printed run folder is the only pointer."""
    folder = Path(folder)
    link, temporary = folder.parent / LATEST, folder.parent / f".{LATEST}.{os.getpid()}"
    try:
        if temporary.is_symlink():
            temporary.unlink()
        os.symlink(folder.name, temporary, target_is_directory=True)
        os.replace(temporary, link)
    except OSError:
        pass


def _drop_if_empty(folder):
    """A run that stopped before writing anything (a model that failed to load) leaves no folder."""
    with contextlib.suppress(OSError):
        folder.rmdir()  # only an empty folder is removed


def resume_point(output_dir, resume, max_steps, args=None):
    """(start_step, checkpoint folder, trainer state): where a run starts, decided before any model
    loads. Without --resume a folder that already holds checkpoints, or the logs of a run killed
    before its first checkpoint, is an error (a later --resume would mix two runs; the logs would
    be lost); with --resume, `_resumed` finds it. args: the run's options, which the checkpoint
    must suit (check_resumable)."""
    check_run_folder(output_dir)
    found = checkpoints(output_dir)
    if resume:
        return _resumed(output_dir, found, max_steps, args)
    logs = [name for name in LOG_FILES
            if (Path(output_dir) / name).exists() and (Path(output_dir) / name).stat().st_size]
    if found or logs:
        raise _earlier_run(output_dir, found, logs)
    return 0, None, None


def _earlier_run(output_dir, found, logs):
    """resume_point's error without --resume, for a folder that holds an earlier run's files."""
    if found:
        return PathError(f"--output_dir {output_dir} already holds {found[0].name} from an "
                         "earlier run: pass --resume to continue it, or another --output_dir "
                         "for a new run.")
    return PathError(f"--output_dir {output_dir} holds the logs of an earlier run "
                     f"({', '.join(logs)}) but no checkpoint: pass another --output_dir for "
                     "a new run, or --resume to start again from update 0 with those logs "
                     "kept aside.")


def _resumed(output_dir, found, max_steps, args):
    """resume_point with --resume: the newest complete checkpoint, falling back past a corrupt one
    with a message; none at all starts from update 0, said plainly (the logger keeps the earlier
    lines aside); a checkpoint beyond --max_steps is an error; one at --max_steps means the run is
    finished, and the process exits. Under torchrun every rank must find the same checkpoint
    (same_checkpoint_on_every_rank)."""
    path, state = _newest_complete(found)
    same_checkpoint_on_every_rank(output_dir, path)
    if path is None:
        print0(f"--resume: no complete checkpoint in {output_dir}; starting from update 0")
        return 0, None, None
    if args is not None:
        check_resumable(path, state, args)
    if state["step"] > max_steps:
        raise UsageError(f"--resume: {path} is at update {state['step']}, beyond --max_steps "
                         f"{max_steps}; "
                         f"pass --max_steps {state['step']} or more (or another --output_dir).")
    if state["step"] == max_steps:
        print0(f"--resume: {path} is already at --max_steps {max_steps}: nothing to do "
               f"(raise --max_steps to train further)")
        raise SystemExit(0)
    print0(f"resuming from {path} at update {state['step']}")
    return state["step"], path, state


def check_run_folder(output_dir):
    """Stop, before any model loads, if a name the run writes in its folder (args.json, the logs,
    tb/, checkpoint-N and its temporary folders) is a symbolic link, or of another kind than the
    run writes there. The run writes only what it made there: a link planted by someone sharing
    the folder (args.json -> a file of yours) would take its writes elsewhere; a named pipe as
    metrics.jsonl would hold the run forever at its first line; a folder as args.json, or a file as
    checkpoint-N, failed with a traceback at the first write."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return
    for entry in sorted(folder.iterdir()):
        _check_entry(output_dir, entry)


def _check_entry(output_dir, entry):
    """check_run_folder's check of one entry the folder holds."""
    checkpoint = re.fullmatch(r"checkpoint-\d+(\..*)?", entry.name)
    written = entry.name in RUN_FILES or checkpoint
    if entry.is_symlink() and written:  # a checkpoint-best -> checkpoint-20 of yours may stay
        raise PathError(f"--output_dir {output_dir}: {entry.name} there is a symbolic link (to "
                        f"{os.readlink(entry)}), and a run follows no link in its folder: "
                        f"remove it (rm {entry}), or pass another --output_dir.")
    # folders: tb/ and checkpoint-N/ (a leftover checkpoint-N.x.tmp of any kind is removed
    # or passed over by the next save); files: args.json and the logs
    folder_kind = entry.name == "tb" or (checkpoint and not checkpoint.group(1))
    want = "a folder" if folder_kind else "a file" if entry.name in RUN_FILES else None
    kind = kind_of(entry)
    if want and kind != want:
        raise PathError(f"--output_dir {output_dir}: {entry.name} there is {kind}, where a run "
                        f"writes {want} of that name: remove it (rm -r {entry}), or pass "
                        "another --output_dir.")


def check_resumable(path, state, args):
    """Stop, naming the fix, unless the run can continue the checkpoint at `path`: written by the
    same algorithm file, and LoRA adapters of the asked rank, or a whole model without --lora_r, as
    it was trained. Without this a ppo.py checkpoint trained on under grpo.py, and the other mixes
    failed deep in the loading (KeyError: 'critic')."""
    algorithm, wrote = algorithm_of(args), state.get("algorithm")
    critic = hasattr(args, "critic_learning_rate")  # the PPO family's files train a critic
    if wrote is None:  # written before checkpoints named their file: its critic tells the family
        has_critic = "critic" in state.get("optimizers", {})
        if has_critic != critic:
            raise UsageError(f"--resume: {path} holds {'a' if has_critic else 'no'} critic, which "
                             f"{algorithm}.py {'does not train' if has_critic else 'trains'}: "
                             "another algorithm file wrote it. Resume it with that file, or pass "
                             "another --output_dir.")
    elif wrote != algorithm:
        raise UsageError(f"--resume: {path} was written by {wrote}.py, not {algorithm}.py: resume "
                         f"it with python {wrote}.py --resume, or pass another --output_dir.")
    pickled = sorted(f.name for f in path.glob("*.bin"))
    if pickled and not any(path.glob("*.safetensors")):  # what transformers and peft would load
        raise PathError(f"--resume: {path} holds {pickled[0]}, a pickled weights file, where "
                        "mathrl writes safetensors: loading it could run code, so it is refused. "
                        "Resume only from checkpoints written by mathrl, or start a new "
                        "--output_dir.")
    adapter = path / "adapter_config.json"
    if not adapter.is_file():
        if args.lora_r:
            raise UsageError(f"--resume: {path} holds a whole model (full fine-tuning), not LoRA "
                             "adapters: resume without --lora_r, as it was trained.")
        return
    config = json.loads(adapter.read_text())
    r, alpha = config.get("r"), config.get("lora_alpha")
    if args.lora_r != r or args.lora_alpha not in (None, alpha):
        raise UsageError(f"--resume: {path} holds LoRA adapters of rank {r} and alpha {alpha}: "
                         f"resume with --lora_r {r} (and --lora_alpha {alpha}, or none), as it "
                         "was trained.")


def _newest_complete(found):
    """(checkpoint folder, trainer state) of the first of `found` (newest first) that loads, or
    (None, None): a corrupt one is named and the one before it tried."""
    for path in found:
        try:
            return path, load_trainer_state(path)
        except UserError:  # a file that would run code is not corrupt: stop, and say so
            raise
        # a truncated file, a bad zip, a missing trainer_state.pt: try the one before
        except Exception as e:
            print0(f"--resume: {path} is corrupt ({type(e).__name__}: {e}); falling back to the "
                   "previous checkpoint")
    return None, None


def same_checkpoint_on_every_rank(output_dir, path):
    """Stop unless every rank resumes from the same checkpoint. Rank 0 alone writes checkpoints and
    each rank looks for them on its own disk, so on several nodes without a shared --output_dir the
    other nodes would find none and train on from update 0 beside rank 0's update N, silently."""
    seen = all_gather_objects((path.name if path else None, socket.gethostname()))
    said = [f"rank {rank} (on {host}) sees {name or 'no checkpoint'}"
            for rank, (name, host) in enumerate(seen)]
    other = next((rank for rank, (name, _) in enumerate(seen) if name != seen[0][0]), None)
    if other is not None:
        raise PathError(f"--resume: {said[other]} in {output_dir} but {said[0]}; on several nodes "
                        "--output_dir must be a shared filesystem that every node reads.")
