"""Bad input never hangs, lies or writes outside its run (issue 52): a number out of range, a data
file that is too big, not UTF-8 or repeats its rows, a checkpoint of another file or kind, a link
planted in the run folder, a path given with ~. Each is one line, `error: ...`, naming the flag or
file and the fix, with exit status 1, no traceback, and before any model loads where it can be found
that early. tests/test_reliability.py holds the earlier checks of the same kind."""

import importlib
import math
import os
import sys
import time
import typing
from dataclasses import fields, replace
from pathlib import Path

import pytest
import warm  # tests/warm.py: `python X.py` runs forked from a warm process

from dev.algorithms import ALGORITHMS
from common.errors import PathError, UsageError
from common.run.checks import check_options

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--model_name_or_path", "tiny-random", "--max_new_tokens", "8", "--num_eval_problems", "4",
        "--num_prompts", "2", "--num_generations", "4", "--micro_batch_size", "2"]


def fails_in_one_line(cmd, says, within=120, loading=False):
    """Run `cmd` (python X.py ...): it must exit 1 within `within` seconds with the one line
    `error: <says>...` on stderr, nothing else there, and no traceback. -> the line. `within` is
    far above the ~5 s these runs take, even on busy cores, and below what the hangs took (a 200 MB
    line was still being read after 120 s). loading: the error comes while a model loads, after
    the loaders' progress bars and warnings on stderr; the error is then its last line."""
    start = time.time()
    out = warm.run([sys.executable, *cmd], cwd=ROOT, capture_output=True, text=True, timeout=600)
    took = time.time() - start
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-2000:]
    said = out.stderr.splitlines()[-1:] if loading else out.stderr.splitlines()
    assert "Traceback" not in out.stderr and len(said) == 1 and out.stderr.endswith("\n"), out.stderr[-3000:]
    assert said[0].startswith(f"error: {says}"), out.stderr
    assert took < within, f"{took:.0f} s"
    return said[0]


# ---- numbers: every one in its range, every real one finite, sizes that memory holds ----------------------
@pytest.mark.parametrize("flags,says", [
    # a flat distribution sampled, and the run exited 0
    (["--temperature", "inf"], "--temperature inf: must be a finite number (the default is 0.7)."),
    # weights of 1e30 after two updates, exit 0
    (["--learning_rate", "1e30"], "--learning_rate 1e+30: must be in [0, 1] (the default is 5e-06)."),
    # merged weights of 2e8 after two updates, exit 0
    (["--lora_r", "4", "--lora_alpha", "1000000000000"],
     ("--lora_alpha 1000000000000: adapters are scaled by lora_alpha / lora_r = 2.5e+11, which must be at "
      "most 64 (the default, 2 * lora_r, scales by 2); pass --lora_alpha 256 or less.")),
    # silently became 2 * lora_r
    (["--lora_r", "4", "--lora_alpha", "0"], "--lora_alpha 0: must be >= 1 (leave it out for its default)."),
    # 8 GB in a minute
    (["--num_prompts", "1000000000000"], "--num_prompts 1000000000000: must be in [1, 65536] (the default is 4)."),
    # each within its bound, the product beyond any memory
    (["--num_prompts", "65536", "--num_generations", "4096"],
     "--num_prompts 65536 x --num_generations 4096 over 1 process(es) is 268435456 sequences a rank"),
    # tracebacks from peft and from the sampling loop
    (["--lora_r", "-1"], "--lora_r -1: must be in [0, 4096] (the default is 0)."),
])
def test_a_number_out_of_range_is_one_line_before_any_model_loads(flags, says, tmp_path):
    # the checks grpo.py makes before it loads a model, in this process: the same message
    import grpo
    from common.run.args import parse_args
    with pytest.raises(UsageError) as e:
        check_options(parse_args(grpo.Args, [*TINY, *flags, "--output_dir", str(tmp_path / "run")]), grpo.check_args, world_size=1)
    assert str(e.value).startswith(says)
    if flags[0] in ("--temperature", "--lora_r"):  # and as a user sees it, through the real file
        fails_in_one_line(["grpo.py", *TINY, *flags, "--output_dir", str(tmp_path / "run")], says)
        assert not (tmp_path / "run").exists()  # refused before the run wrote anything


def _float_fields(args_class):
    """The options that hold a real number or a list of them (float, Optional[float], list[float]...)."""
    hints = typing.get_type_hints(args_class)
    return [f.name for f in fields(args_class) if "float" in str(hints[f.name])]


@pytest.mark.parametrize("algo", [*ALGORITHMS, "eval"])
def test_every_real_valued_option_of_every_file_must_be_finite(algo, tmp_path):
    # a class check: an option added later is covered without a line of its own
    module = importlib.import_module(algo)
    args = replace(module.Args(), model_name_or_path="tiny-random")
    if algo == "eval":
        args = replace(args, output=str(tmp_path / "out.jsonl"))
        check = module.check_args
    else:
        args = replace(args, output_dir=str(tmp_path))


        def check(a):
            check_options(a, module.check_args, world_size=1)
    names = _float_fields(module.Args)
    # sft.py samples nothing in training: no temperature, no top_p
    assert ({"learning_rate", "reward_weights"} if algo == "sft" else
            {"temperature", "top_p", "reward_weights"}) <= set(names)
    for name in names:
        value = [1.0, math.nan] if name == "reward_weights" else math.inf
        if name == "max_grad_norm":  # inf is its "no clipping"
            value = math.nan
        with pytest.raises(UsageError, match=rf"^--{name} ") as e:
            check(replace(args, **{name: value}))
        assert "finite" in str(e.value) or "must be" in str(e.value), e.value


def test_help_shows_each_number_option_s_range():
    from common.run.args import make_parser
    from grpo import Args

    text = " ".join(make_parser(Args).format_help().split())
    assert "prompts per update, over all ranks (default: 4; in [1, 65536])" in text
    assert "(default: 5e-06; in [0, 1])" in text  # --learning_rate
    assert "lora_alpha / lora_r, at most 64 (None: 2 * lora_r) (default: None; >= 1)" in text


# ---- data files: a size per row, UTF-8 named where it breaks ------------------------------------------------
ROW = '{"question": "What is 2 + 3?", "answer": "5", "level": 1}'


def test_a_data_line_too_long_to_be_a_row_is_one_line_naming_the_file_and_line(tmp_path):
    from common.env.tasks import MAX_LINE_BYTES

    data = tmp_path / "train.jsonl"
    # a 200 MB line took over 14 GB and two minutes before this; one byte over the limit will do
    data.write_text(ROW + "\n" + '{"question": "' + "x" * MAX_LINE_BYTES + '", "answer": "1"}\n')
    fails_in_one_line(["grpo.py", *TINY, "--dataset_path", str(data), "--output_dir", str(tmp_path / "run")],
                      f"{data}, line 2: longer than 8 MB, the most one row may take")
    assert not (tmp_path / "run").exists()


def test_a_data_file_that_is_not_utf8_names_the_line_and_the_byte(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_bytes((ROW + "\n").encode() + '{"question": "Combien font 2 + 3, café?", "answer": "5"}\n'
                     .encode("latin-1"))
    byte = len(ROW) + 1 + len('{"question": "Combien font 2 + 3, caf')
    fails_in_one_line(["grpo.py", *TINY, "--dataset_path", str(data), "--output_dir", str(tmp_path / "run")],
                      f"{data}, line 2: not UTF-8 (byte 0xe9 at byte {byte} of the file): save it as UTF-8, "
                      "e.g. iconv -f latin1 -t utf-8 train.jsonl > fixed.jsonl.")


def test_data_files_too_big_nested_or_not_parquet_are_refused_and_a_bom_is_read(tmp_path, monkeypatch):
    from common.env import tasks

    json_file = tmp_path / "train.json"
    json_file.write_text("[" + ",".join([ROW] * 20_000) + "]")  # 1.11 MB
    assert len(tasks.read_rows(json_file, "arithmetic")) == 20_000
    monkeypatch.setattr(tasks, "MAX_JSON_BYTES", 2**20)  # parsed whole: a size for the file
    with pytest.raises(UsageError, match=r"train.json: 1.11 MB, beyond the 1 MB a .json file, parsed at once, "
                                         r"may take: write it as .jsonl"):
        tasks.read_rows(json_file, "arithmetic")
    (tmp_path / "deep.jsonl").write_text("[" * 100_000 + "\n")
    with pytest.raises(UsageError, match=r"deep.jsonl, line 1: JSON nested too deeply"):
        tasks.read_rows(tmp_path / "deep.jsonl", "arithmetic")
    (tmp_path / "bad.parquet").write_text(ROW)
    with pytest.raises(UsageError, match=r"bad.parquet: not a parquet file that pyarrow reads"):
        tasks.read_rows(tmp_path / "bad.parquet", "arithmetic")
    # a byte-order mark (Windows editors write one) is not part of the first row
    (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + (ROW + "\n" + ROW).encode())
    assert [r["answer"] for r in tasks.read_rows(tmp_path / "bom.jsonl", "arithmetic")] == ["5", "5"]


# ---- a data file's held-out fifth: no question on both sides --------------------------------------------------
def _rows(questions):
    return "".join(f'{{"question": "What is {q} + 1?", "answer": "{q + 1}", "level": 1}}\n' for q in questions)


def test_a_repeated_question_is_held_out_or_trained_on_with_all_its_copies(tmp_path):
    from common.env.math_env import make_envs
    from grpo import Args

    path = tmp_path / "train.jsonl"
    # 20 questions, the first 10 three times over: they leaked into both halves
    path.write_text(_rows(list(range(10)) * 3 + list(range(10, 20))))
    said = []
    train, held = make_envs(Args(dataset_path=str(path), num_eval_problems=200), say=said.append)
    trained = {ex["question"] for ex in train.examples}
    evaluated = [ex["question"] for ex in held.examples]
    assert len(evaluated) == 4 == len(set(evaluated))  # a fifth of the 20 questions, once each
    assert not trained & set(evaluated)
    assert len(trained) == 16 and len(train) + sum(3 if int(q.split()[2]) < 10 else 1 for q in evaluated) == 40
    assert said[-1] == (f"{path}: no --eval_dataset_path, so 4 of its 20 distinct questions are held out "
                        f"for evaluation and {len(train)} rows of the others train (40 rows: a repeated "
                        "question is held out or trained on with all its copies)")
    # a file without repeats splits as it did when rows were drawn: the same seeded sample of rows
    import random

    path.write_text(_rows(range(20)))
    said = []
    train, held = make_envs(Args(dataset_path=str(path), num_eval_problems=200), say=said.append)
    drawn = sorted(random.Random(0).sample(range(20), 4))
    assert [ex["question"] for ex in held.examples] == [f"What is {i} + 1?" for i in drawn]
    assert said[-1] == f"{path}: no --eval_dataset_path, so 4 of its 20 rows are held out for evaluation and 16 train"


# ---- checkpoints: only the file and the kind of model that wrote one resumes it ----------------------------
def _checkpoint(run_dir, algorithm=None, lora=False, step=1, state=None):
    """run_dir/checkpoint-{step} as a run of `algorithm` writes it (None: as checkpoints were written
    before they named their file); lora: a LoRA policy's adapter. state: the trainer state to plant
    instead, with the manifest made to agree."""
    import json

    import torch

    from common.run.checkpoints import save_checkpoint
    from common.models.loading import base_model_path, load_tokenizer, tiny_random_model
    from common.models.sharding import add_lora

    model = tiny_random_model()
    if lora:
        model = add_lora(model, 4, 8, "all-linear", base_model_path("tiny-random"))
    path = run_dir / f"checkpoint-{step}"
    if state is None or not path.exists():
        save_checkpoint(path, model, load_tokenizer("tiny-random"), step, algorithm=algorithm)
    if state is not None or algorithm is None:
        torch.save(state or {"step": step, "optimizers": {"policy": {}}, "extra": {}}, path / "trainer_state.pt")
        manifest = json.loads((path / "manifest.json").read_text())
        manifest["trainer_state.pt"] = (path / "trainer_state.pt").stat().st_size
        (path / "manifest.json").write_text(json.dumps(manifest))
    return path


CRITIC_STATE = {"step": 1, "optimizers": {"policy": {}, "critic": {}}, "extra": {"critic": {}}}


@pytest.mark.parametrize("file,written,flags,says", [
    # trained on from ppo's policy, silently
    ("grpo.py", {"algorithm": "ppo"}, [],
     ("--resume: {ckpt} was written by ppo.py, not grpo.py: resume it with python ppo.py --resume, or pass "
     "another --output_dir.")),
    # KeyError: 'critic'
    ("ppo.py", {"algorithm": "grpo"}, [], "--resume: {ckpt} was written by grpo.py, not ppo.py"),
    # a checkpoint from before they named their file: its critic says the family
    ("ppo.py", {}, [], ("--resume: {ckpt} holds no critic, which ppo.py trains: another algorithm file "
     "wrote it. Resume it with that file, or pass another --output_dir.")),
    ("grpo.py", {"state": CRITIC_STATE}, [], "--resume: {ckpt} holds a critic, which grpo.py does not train"),
    # ValueError: optimizer got an empty parameter list
    ("grpo.py", {"algorithm": "grpo", "lora": True}, [],
     ("--resume: {ckpt} holds LoRA adapters of rank 4 and alpha 8: resume with --lora_r 4 (and --lora_alpha 8, "
     "or none), as it was trained.")),
    # ValueError: Can't find 'adapter_config.json'
    ("grpo.py", {"algorithm": "grpo"}, ["--lora_r", "4"],
     ("--resume: {ckpt} holds a whole model (full fine-tuning), not LoRA adapters: resume without --lora_r, as "
     "it was trained.")),
])
def test_a_checkpoint_of_another_file_or_kind_is_refused_before_any_model_loads(file, written, flags, says,
                                                                                   tmp_path):
    ckpt = _checkpoint(tmp_path / "run", **written)
    before = sorted(p.name for p in (tmp_path / "run").iterdir())
    fails_in_one_line([file, *TINY, "--max_steps", "2", "--output_dir", str(tmp_path / "run"), "--resume", *flags],
                      says.format(ckpt=ckpt))
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == before  # nothing written


def test_lora_adapters_resume_only_at_the_rank_and_alpha_they_were_trained_with(tmp_path):
    from common.run.checkpoints import check_resumable, load_trainer_state
    from grpo import Args

    ckpt = _checkpoint(tmp_path, algorithm="grpo", lora=True)  # rank 4, alpha 8
    state = load_trainer_state(ckpt)
    for r, alpha in [(4, None), (4, 8)]:
        check_resumable(ckpt, state, Args(lora_r=r, lora_alpha=alpha))
    for r, alpha in [(8, None), (4, 16), (0, None)]:
        with pytest.raises(UsageError, match=rf"^--resume: {ckpt} holds LoRA adapters of rank 4 and alpha 8: "
                                             r"resume with --lora_r 4 \(and --lora_alpha 8, or none\)"):
            check_resumable(ckpt, state, Args(lora_r=r, lora_alpha=alpha))


def test_a_checkpoint_from_before_they_named_their_file_still_resumes_under_its_own(tmp_path):
    from common.run.checkpoints import load_trainer_state

    def grpo(max_steps, *flags):
        out = warm.run([sys.executable, "grpo.py", *TINY, "--max_steps", str(max_steps), "--output_dir",
                        str(tmp_path / "run"), *flags], cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        return out

    grpo(1)
    ckpt = tmp_path / "run" / "checkpoint-1"
    state = load_trainer_state(ckpt)
    assert state.pop("algorithm") == "grpo"  # recorded now; as checkpoints were before, without it
    _checkpoint(tmp_path / "run", algorithm="grpo", state=state)
    assert "algorithm" not in load_trainer_state(ckpt)
    assert f"resuming from {ckpt} at update 1" in grpo(2, "--resume").stdout


class Payload:
    """What a poisoned weights file carries: unpickling it calls os.system."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("lora", [False, True])
def test_poisoned_pickled_weights_are_one_line_and_run_nothing(lora, tmp_path):
    import torch

    ckpt = _checkpoint(tmp_path / "run", algorithm="grpo", lora=lora)
    (ckpt / ("adapter_model" if lora else "model")).with_suffix(".safetensors").unlink()
    (ckpt / "manifest.json").unlink()
    marker = tmp_path / "payload-ran"
    name = "adapter_model" if lora else "pytorch_model"  # the names transformers and peft load
    torch.save({"x": Payload(marker)}, ckpt / f"{name}.bin")
    lora_flags = ["--lora_r", "4"] if lora else []
    # --resume: refused before any model loads
    fails_in_one_line(["grpo.py", *TINY, *lora_flags, "--max_steps", "2", "--output_dir", str(tmp_path / "run"),
                       "--resume"],
                      f"--resume: {ckpt} holds {name}.bin, a pickled weights file, where mathrl writes "
                      "safetensors: loading it could run code, so it is refused.")
    # as the model to start from (eval.py loads it the same way): refused as torch reads it
    what = f"the adapter in {ckpt}" if lora else f"the weights file of {ckpt}"
    fails_in_one_line(["eval.py", "--model_name_or_path", str(ckpt), "--num_eval_problems", "2",
                       "--max_new_tokens", "4", "--output", str(tmp_path / "e.jsonl")],
                      f"{what} holds more than tensors and numbers (it names posix.system); loading it "
                      "could run code, so it is refused. Load weights saved as safetensors",
                      loading=True)
    assert not marker.exists()


def test_a_checkpoint_cut_short_without_its_manifest_is_named_and_passed_over(tmp_path, capsys):
    from common.run.checkpoints import resume_point

    first = _checkpoint(tmp_path, algorithm="grpo", step=1)
    second = _checkpoint(tmp_path, algorithm="grpo", step=2)
    (second / "manifest.json").unlink()
    whole = (second / "model.safetensors").stat().st_size
    os.truncate(second / "model.safetensors", whole - 1000)  # a copy that stopped early
    step, path, _ = resume_point(tmp_path, True, 5)  # it failed deep in safetensors, with a traceback
    assert (step, path) == (1, first)
    assert (f"--resume: {second} is corrupt (ValueError: model.safetensors has {whole - 1000} bytes, its "
            f"header says {whole}); falling back to the previous checkpoint") in capsys.readouterr().out


# ---- the run folder: nothing written through a link planted there ------------------------------------------
# one name of each kind (a file rewritten on --resume, a log appended to, a checkpoint's temporary, a folder):
# each case is a run of grpo.py, and the suite's time is counted
@pytest.mark.parametrize("name,resume", [("args.json", True), ("metrics.jsonl", True), ("checkpoint-2.tmp", True),
                                         ("tb", False)])
def test_a_link_planted_in_the_run_folder_is_refused_and_its_target_untouched(name, resume, tmp_path):
    run_dir, victim = tmp_path / "run", tmp_path / "yours"
    victim.mkdir()
    (victim / "file.txt").write_text("precious")
    if resume:
        _checkpoint(run_dir, algorithm="grpo")
    run_dir.mkdir(exist_ok=True)
    target = victim / "file.txt" if name.endswith(("json", "jsonl")) else victim
    (run_dir / name).symlink_to(target)
    # args.json was overwritten on --resume; checkpoint-2.tmp received the whole checkpoint
    fails_in_one_line(["grpo.py", *TINY, "--max_steps", "2", "--output_dir", str(run_dir),
                       *(["--resume"] if resume else [])],
                      f"--output_dir {run_dir}: {name} there is a symbolic link (to {target}), and a run follows no "
                      f"link in its folder: remove it (rm {run_dir / name}), or pass another --output_dir.")
    assert sorted(p.name for p in victim.iterdir()) == ["file.txt"]
    assert (victim / "file.txt").read_text() == "precious"


def test_links_planted_while_a_run_goes_are_replaced_or_refused_never_followed(tmp_path):
    # after the check at the start: the writes themselves make new files and follow no link
    from common.run.checkpoints import checkpoints, load_trainer_state
    from common.run.logger import Logger
    from grpo import Args

    victim = tmp_path / "yours"
    victim.mkdir()
    (victim / "file.txt").write_text("precious")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "args.json").symlink_to(victim / "file.txt")
    (run_dir / "checkpoint-1.tmp").symlink_to(victim)
    (run_dir / "checkpoint-2").symlink_to(victim)
    Logger(Args(output_dir=str(run_dir)), initial_step=0).close()  # args.json: a new file in place of the link
    assert not (run_dir / "args.json").is_symlink() and '"output_dir"' in (run_dir / "args.json").read_text()
    _checkpoint(run_dir, algorithm="grpo", step=1)  # written into a folder of its own, then renamed
    _checkpoint(run_dir, algorithm="grpo", step=2)  # the link goes, not what it names
    assert checkpoints(run_dir) == [run_dir / "checkpoint-2", run_dir / "checkpoint-1"]
    # made as mkdir and open make them: others may read a shared run folder
    umask = os.umask(0)
    os.umask(umask)
    assert (run_dir / "checkpoint-1").stat().st_mode & 0o777 == 0o777 & ~umask
    assert (run_dir / "args.json").stat().st_mode & 0o777 == 0o666 & ~umask
    assert not (run_dir / "checkpoint-2").is_symlink() and load_trainer_state(run_dir / "checkpoint-2")["step"] == 2
    # a resumed run's logs are rewritten by a rename: the link is replaced
    (run_dir / "metrics.jsonl").unlink()
    (run_dir / "metrics.jsonl").symlink_to(victim / "file.txt")
    logger = Logger(Args(output_dir=str(run_dir)), initial_step=1)
    logger.log(2, {"x": 1.0})
    logger.close()
    assert not (run_dir / "metrics.jsonl").is_symlink() and '"x": 1.0' in (run_dir / "metrics.jsonl").read_text()
    # a log opened to append is refused
    (run_dir / "eval.jsonl").unlink()
    (run_dir / "eval.jsonl").symlink_to(victim / "empty.txt")
    with pytest.raises(PathError, match=r"eval.jsonl is a symbolic link \(to .*empty.txt\): a run follows no link"):
        Logger(Args(output_dir=str(run_dir)), initial_step=0)
    assert sorted(p.name for p in victim.iterdir()) == ["file.txt"]
    assert (victim / "file.txt").read_text() == "precious"


# ---- ~ in a path option is the home folder ---------------------------------------------------------------
@pytest.mark.parametrize("algo", [*ALGORITHMS, "eval"])
def test_every_path_option_of_every_file_takes_a_home_folder(algo, tmp_path, monkeypatch):
    from common.run.args import PATH_OPTIONS, parse_args

    monkeypatch.setenv("HOME", str(tmp_path))
    module = importlib.import_module(algo)
    paths = [f.name for f in fields(module.Args) if f.name.endswith(("_path", "_dir")) or f.name in PATH_OPTIONS]
    assert {"dataset_path", "model_name_or_path"} <= set(paths)
    argv = [x for name in paths for x in (f"--{name}={'~/' + name}",)]
    args = parse_args(module.Args, argv)
    for name in paths:
        expected = str(tmp_path / name)
        assert getattr(args, name) == ([expected] if name == "reward_fn" else expected), name
    assert parse_args(module.Args, ["--dataset_name", "arithmetic"]).dataset_name == "arithmetic"


def test_an_output_dir_given_with_a_home_folder_is_there_not_a_folder_named_tilde(tmp_path):
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    from common.models.loading import cache_dir

    # the model cache stays where it is (under the real home it would be fetched again)
    env = {**os.environ, "HOME": str(home), "MATHRL_CACHE": str(cache_dir())}
    out = warm.run([sys.executable, str(ROOT / "grpo.py"), *TINY, "--max_steps", "1", "--output_dir=~/run"],
                   cwd=cwd, capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (home / "run" / "checkpoint-1" / "model.safetensors").is_file()
    assert list(cwd.iterdir()) == []  # there was a folder literally named ~ here
    assert sorted(p.name for p in home.iterdir()) == ["run"]


def test_a_model_folder_that_does_not_load_is_one_line_naming_what_it_must_hold(tmp_path):
    # a config and nothing else: transformers' ValueError, over five lines, with a traceback
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text('{"model_type": "llama"}')
    said = fails_in_one_line(["eval.py", "--model_name_or_path", str(tmp_path / "model"), "--num_eval_problems",
                              "2", "--output", str(tmp_path / "e.jsonl")],
                             f"Could not load --model_name_or_path '{tmp_path / 'model'}': ", loading=True)
    assert said.endswith("Pass a folder written by save_pretrained (a checkpoint-N folder), which holds "
                         "config.json, the weights and the tokenizer's files.")


def test_a_link_the_run_never_writes_may_stay_in_its_folder(tmp_path):
    from common.run.checkpoints import check_run_folder

    _checkpoint(tmp_path, algorithm="grpo", step=20)
    (tmp_path / "checkpoint-best").symlink_to(tmp_path / "checkpoint-20")  # a reader's shortcut
    (tmp_path / "notes.txt").symlink_to(tmp_path / "checkpoint-20" / "config.json")
    check_run_folder(tmp_path)
    (tmp_path / "checkpoint-21.x.tmp").symlink_to(tmp_path / "checkpoint-20")
    with pytest.raises(PathError, match="checkpoint-21.x.tmp there is a symbolic link"):
        check_run_folder(tmp_path)
