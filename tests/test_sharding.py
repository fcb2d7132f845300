"""--fsdp (FSDP2 over 2 CPU processes, gloo) and --lora_r (peft): the same parameters as one whole
process after an update, a bit-exact resume, checkpoints that load, a LoRA update that moves the
adapters only, a LoRA checkpoint that eval.py, peft (offline) and --resume load, the adapters-off
reference that is the base model, and one gather per rollout."""

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from common.env.math_env import make_env
from common.run.evaluation import evaluate
from common.models.hf import decoder_layers
from common.models.logprobs import token_logprobs
from common.models.loading import load_policy, load_tokenizer, tiny_random_model
from common.models.sampler import encode_prompts
from common.models.sharding import AdapterOff, add_lora, shard
from sampling import fast_generate
import warm  # tests/warm.py: `python X.py` runs forked from a warm process

pytest.importorskip("peft")
ROOT = Path(__file__).resolve().parents[1]
TINY = ["tests/run_with_test_reward.py", "--model_name_or_path", "tiny-random", "--max_new_tokens",
        "8", "--learning_rate", "1e-3", "--temperature", "1.0", "--num_eval_problems", "0"]
# one update's work, the same global batch on 1 and 2 processes; ppo with a reference, 2 epochs
CASES = {
    "grpo": ["--num_prompts", "2", "--num_generations", "4", "--loss_type", "dapo"],
    "ppo": ["--num_prompts", "4", "--num_mini_batches", "1", "--num_ppo_epochs", "2", "--beta",
            "0.05", "--critic_learning_rate", "1e-3"],
    "appo": ["--num_envs", "2", "--num_steps", "2", "--num_mini_batches", "2", "--max_episode_steps",
             "3", "--critic_hidden_size", "16", "--critic_learning_rate", "1e-3", "--skip_kl", "0"],
}
LORA = ["--lora_r", "8", "--learning_rate", "1e-2"]


def free_port():
    """A port no one listens on: pytest -n 2 can run two of these torchrun tests at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(argv, processes=1):
    if processes == 1:
        cmd, env = [sys.executable, TINY[0], argv[0], *TINY[1:], *argv[1:]], None
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes),
               "--master_port", str(free_port()), TINY[0], argv[0], *TINY[1:], *argv[1:], "--fsdp"]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = warm.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


def weights(folder):
    name = "adapter_model" if (Path(folder) / "adapter_model.safetensors").exists() else "model"
    return load_file(str(Path(folder) / f"{name}.safetensors"))


def largest_difference(a, b):
    assert sorted(a) == sorted(b)
    return max((a[k] - b[k]).abs().max().item() for k in a)


# LoRA with a critic (ppo's second transformer, appo's value head) runs with -m slow: the LoRA path
# and the critics' sharding are each covered by the fast four
@pytest.mark.slow  # the second tier: torchrun, FSDP2
@pytest.mark.parametrize("algo,lora", [
    pytest.param(algo, lora, id=f"{algo}-{'lora' if lora else 'full'}",
                 marks=[pytest.mark.slow] if lora and algo != "grpo" else [])
    for algo in CASES for lora in (False, True)])
def test_two_fsdp_processes_match_one_whole_process(algo, lora, tmp_path):
    argv = [algo, *CASES[algo], *(LORA if lora else []), "--max_steps", "1"]
    run([*argv, "--output_dir", str(tmp_path / "one")])
    run([*argv, "--output_dir", str(tmp_path / "two")], processes=2)
    one, two = tmp_path / "one/checkpoint-1", tmp_path / "two/checkpoint-1"
    # Adam moves every weight by about lr (1e-3; LoRA 1e-2) at its first step, so a wrong average or
    # normaliser shows as ~lr; the two runs round differently, by up to ~3e-5 (test_grpo.py)
    assert largest_difference(weights(one), weights(two)) < 1e-4
    if algo != "grpo":  # the critic too: ppo's second transformer, appo's value head
        critics = [torch.load(f / "trainer_state.pt", weights_only=False)["extra"]["critic"]
                   for f in (one, two)]
        assert largest_difference(*critics) < 1e-4
    if lora:  # the checkpoint holds the adapters alone: 2 layers x 7 linear modules x (A, B)
        assert len(weights(two)) == (28 if algo != "appo" else 8)  # appo: q_proj, v_proj (OpenR)


@pytest.mark.slow  # the second tier: torchrun, FSDP2
def test_fsdp_resume_is_bit_exact_and_the_checkpoint_loads(tmp_path):
    argv = ["grpo", *CASES["grpo"], "--save_interval", "1"]
    run([*argv, "--max_steps", "2", "--output_dir", str(tmp_path / "straight")], processes=2)
    run([*argv, "--max_steps", "1", "--output_dir", str(tmp_path / "split")], processes=2)
    run([*argv, "--max_steps", "2", "--output_dir", str(tmp_path / "split"), "--resume"],
        processes=2)
    straight, split = tmp_path / "straight/checkpoint-2", tmp_path / "split/checkpoint-2"
    assert largest_difference(weights(straight), weights(split)) == 0.0
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(straight)
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied, as tiny-random is
    start = tiny_random_model().state_dict()
    assert 1e-4 < largest_difference(weights(straight), {k: start[k] for k in weights(straight)})


def test_lora_moves_the_adapters_only_and_merges_as_w_plus_scaled_ba(tmp_path):
    run(["grpo", *CASES["grpo"], *LORA, "--lora_alpha", "4", "--lora_target_modules",
         "q_proj,v_proj", "--max_steps", "1", "--merge_lora", "--output_dir", str(tmp_path)])
    adapter = weights(tmp_path / "checkpoint-1")
    merged = load_file(str(tmp_path / "checkpoint-1/merged/model.safetensors"))
    start = tiny_random_model().state_dict()
    assert len(adapter) == 8  # 2 layers x (q_proj, v_proj) x (A, B)
    for name, w in merged.items():
        if ".q_proj." in name or ".v_proj." in name:
            prefix = "base_model.model." + name.replace(".weight", "")
            a, b = adapter[prefix + ".lora_A.weight"], adapter[prefix + ".lora_B.weight"]
            assert b.abs().max() > 0  # B starts at 0: the update moved it
            # alpha / r = 4 / 8
            assert torch.allclose(w, start[name] + 0.5 * b @ a, atol=1e-6)
        else:  # every other weight is the base model's, exactly
            assert torch.equal(w, start[name]), name
    # eval.py and the benches load the adapter folder as its merged model
    loaded = load_policy(str(tmp_path / "checkpoint-1")).state_dict()
    assert all(torch.equal(loaded[name], w) for name, w in merged.items())
    state = torch.load(tmp_path / "checkpoint-1/trainer_state.pt", weights_only=False)
    moments = state["optimizers"]["policy"]["state"].values()
    assert sum(m["exp_avg"].numel() for m in moments) == sum(v.numel() for v in adapter.values())


def test_the_adapters_off_reference_is_the_base_model_exactly():
    torch.manual_seed(0)
    tok = load_tokenizer("tiny-random")
    base = load_policy("tiny-random")
    policy = add_lora(load_policy("tiny-random"), 8, 16, "all-linear", "tiny-random")
    with torch.no_grad():  # adapters that change the output (B starts at 0)
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    prompts = encode_prompts(tok, ["What is 2 + 3?", "What is 17 - 9?"])
    gen = fast_generate(base, tok, prompts, 6, 1.0, 1.0, seeds=[1, 2])
    ids, mask = gen.sequences()
    R = gen.response_ids.shape[1]
    with torch.no_grad():
        expected = token_logprobs(base, ids, mask, R)[0]
        assert torch.equal(token_logprobs(AdapterOff(policy), ids, mask, R)[0], expected)
        assert not torch.allclose(token_logprobs(policy, ids, mask, R)[0], expected, atol=1e-3)


# ---- a LoRA checkpoint without --merge_lora: eval.py, peft offline and --resume load it ---------
LORA_RUN = ["grpo", *CASES["grpo"], *LORA, "--save_interval", "1"]


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """A 2-update LoRA run on tiny-random, a checkpoint after each update: (folder, its stdout)."""
    out = tmp_path_factory.mktemp("lora")
    return out, run([*LORA_RUN, "--max_steps", "2", "--output_dir", str(out)])


def offline(code, **kw):
    """Runs `code` in a fresh process with the hub switched off, as on a machine without one."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=600, env=env, **kw)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


@pytest.mark.slow  # the second tier: a LoRA run
def test_a_lora_checkpoint_records_a_base_folder_that_peft_loads_offline(lora_run, tmp_path):
    folder, stdout = lora_run
    checkpoint = folder / "checkpoint-2"
    base = json.loads((checkpoint / "adapter_config.json").read_text())["base_model_name_or_path"]
    # a folder on this machine, not the reserved name that only mathrl resolves
    assert Path(base).is_absolute() and (Path(base) / "config.json").is_file()
    start = tiny_random_model().state_dict()
    assert largest_difference(weights(base), {k: start[k] for k in weights(base)}) == 0.0
    # the run's last line gives the command that loads it: run exactly that, offline
    command = re.search(r"peft\.AutoPeftModelForCausalLM\.from_pretrained\([^)]*\)",
                        stdout.strip().splitlines()[-1]).group(0)
    assert command == f"peft.AutoPeftModelForCausalLM.from_pretrained('{checkpoint}')"
    offline(f"import peft, torch\nmodel = {command}.merge_and_unload()\n"
            f"torch.save(model.state_dict(), {str(tmp_path / 'merged.pt')!r})")
    merged = torch.load(tmp_path / "merged.pt")
    # the base with the trained adapter merged in: what mathrl itself loads from the checkpoint
    expected = load_policy(str(checkpoint)).state_dict()
    assert largest_difference(merged, expected) == 0.0
    assert largest_difference(merged, start) > 1e-3  # the adapter moved it (lr 1e-2)


@pytest.mark.slow  # the second tier: a LoRA run
def test_eval_py_evaluates_a_lora_checkpoint(lora_run, tmp_path):
    checkpoint = lora_run[0] / "checkpoint-2"
    stdout = subprocess.run(
        [sys.executable, "eval.py", "--model_name_or_path", str(checkpoint), "--dataset_name",
         "arithmetic", "--num_eval_problems", "4", "--max_new_tokens", "8", "--output",
         str(tmp_path / "e.jsonl")], cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert stdout.returncode == 0, stdout.stdout[-3000:] + stdout.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "e.jsonl").read_text().splitlines()]
    # the greedy responses of the training evaluator on the adapter merged into its base
    env = make_env("arithmetic", "test", difficulty="1-2")
    acc, expected = evaluate(load_policy(str(checkpoint)), load_tokenizer(str(checkpoint)), env, 4,
                             8, return_records=True)
    assert [r["responses"][0]["response"] for r in records] == [r["response"] for r in expected]
    assert f"accuracy: {acc:.4f} ({round(acc * 4)}/4 correct)" in stdout.stdout


@pytest.mark.slow  # the second tier: a LoRA run
def test_resume_continues_a_lora_run_bit_exactly_and_records_the_base_folder(lora_run, tmp_path):
    run([*LORA_RUN, "--max_steps", "1", "--output_dir", str(tmp_path)])
    # as written before adapters recorded a folder, naming the reserved name: resumed all the same
    config, manifest = (tmp_path / "checkpoint-1" / f for f in ("adapter_config.json",
                                                                 "manifest.json"))
    config.write_text(json.dumps({**json.loads(config.read_text()),
                                  "base_model_name_or_path": "tiny-random"}))
    sizes = {**json.loads(manifest.read_text()), config.name: config.stat().st_size}
    manifest.write_text(json.dumps(sizes))
    stdout = run([*LORA_RUN, "--max_steps", "2", "--output_dir", str(tmp_path), "--resume"])
    assert f"resuming from {tmp_path / 'checkpoint-1'} at update 1" in stdout
    straight, resumed = lora_run[0] / "checkpoint-2", tmp_path / "checkpoint-2"
    assert len(weights(resumed)) == 28  # 2 layers x 7 linear modules x (A, B)
    assert largest_difference(weights(straight), weights(resumed)) == 0.0
    assert largest_difference(weights(tmp_path / "checkpoint-1"), weights(resumed)) > 1e-3
    bases = [json.loads((c / "adapter_config.json").read_text())["base_model_name_or_path"]
             for c in (straight, resumed)]
    assert bases[0] == bases[1] and Path(bases[1]).is_dir()
    offline(f"import peft\npeft.AutoPeftModelForCausalLM.from_pretrained('{resumed}')")


@pytest.fixture
def one_process_group():
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29559", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_a_sharded_rollout_gathers_each_unit_once(one_process_group, monkeypatch):
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group

    gathers = []
    unshard = _fsdp_param_group.FSDPParamGroup.unshard

    def counting(group, *args, **kwargs):
        gathers.append(not group.is_unsharded)
        return unshard(group, *args, **kwargs)

    monkeypatch.setattr(_fsdp_param_group.FSDPParamGroup, "unshard", counting)
    tok, policy = load_tokenizer("tiny-random"), load_policy("tiny-random")
    whole = [p.detach().clone() for p in policy.parameters()]
    shard(policy, decoder_layers(policy), bf16=False)
    prompts = encode_prompts(tok, ["What is 2 + 3?", "What is 17 - 9?"])
    gen = fast_generate(policy, tok, prompts, 8, 1.0, 1.0, seeds=[1, 2])
    assert gen.response_mask.sum().item() == 16  # 8 decode steps, 9 forwards
    # 3 units (2 decoder layers and the root), each gathered once for the whole rollout
    assert sum(gathers) == 3
    # and freed after it: each rank holds its shard again (here the whole, 1 process)
    assert [type(p).__name__ for p in policy.parameters()] == ["DTensor"] * len(whole)
    assert torch.equal(next(policy.parameters()).full_tensor(), whole[0])
