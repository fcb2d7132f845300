"""The seeds' own command lines, from their documentation, run unchanged on this project's files:
only the model and the data are swapped for local ones (a random character-level model,
tests/char_model.py, and small files in each seed's data format), plus --max_steps 1. Each prints
its translations.

    OpenR   train/mat/scripts/train_llm.sh                        -> appo.py, tppo.py (--algorithm_name)
    oat     docs/reasoning_examples.md, run_ppo on GSM8K          -> ppo.py
    oat     examples/r1_zero_math.py on CountDown                 -> grpo.py
    LLM_RL  README.md, reinforce_stable_on_gsm8k_training.py      -> reinforce_stepwise.py
    TRL     examples/scripts/ppo/ppo.py, the docs' `trl grpo` CLI -> ppo.py, grpo.py
"""

import json
import sys
from pathlib import Path

import pytest

import char_model
import warm  # tests/warm.py: `python X.py` runs forked from a warm process

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return char_model.build(tmp_path_factory.mktemp("char") / "model")


def run(algo, argv, cwd):
    out = warm.run([sys.executable, str(ROOT / f"{algo}.py"), *argv, "--max_steps", "1"],
                   cwd=cwd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def one_update(folder):
    lines = (Path(folder) / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 1 and (Path(folder) / "checkpoint-1" / "config.json").exists()
    return json.loads((Path(folder) / "args.json").read_text())


@pytest.mark.parametrize("algo", ["appo", "tppo"])
def test_openr_train_llm_sh(algo, model, tmp_path):
    # OpenR's math_500.jsonl rows, {"problem", "final_answer"}, with MATH-500's subject kept
    data = write_jsonl(tmp_path / "math_500.jsonl",
                       [{"problem": f"What is ${i} + {i}$?", "final_answer": str(2 * i),
                         "subject": ["Prealgebra", "Algebra"][i % 2]} for i in range(8)])
    (tmp_path / "prm_lora").mkdir()
    out = run(algo, ["--seed", "10", "--dataset_name", "prealgebra", "--dataset_path", data,
                     "--eval_dataset_path", data, "--model_name_or_path", model, "--prm_type",
                     "MS", "--prm_model_name_or_path", model, "--prm_checkpoint_path",
                     str(tmp_path / "prm_lora"), "--algorithm_name", algo.upper(),
                     "--experiment_name", "ms_single", "--num_mini_batch", "4", "--ppo_epoch", "1"],
              tmp_path)
    assert "--ppo_epoch is OpenR's name for --num_ppo_epochs" in out
    assert "--num_mini_batch is OpenR's name for --num_mini_batches" in out
    assert f"--algorithm_name {algo.upper()}: OpenR's algorithm switch; this file is it" in out
    assert "--prm_checkpoint_path: OpenR's MS PRM does not read it either" in out
    # --dataset_name prealgebra keeps its 4 problems, and OpenR's 10 steps of 96 tokens on MATH
    assert "| 4 problems |" in out and "episodes of 10 steps of 96 tokens at most" in out
    # OpenR's --experiment_name names the run
    args = one_update(tmp_path / f"runs/{algo}/ms_single")
    assert (args["seed"], args["num_mini_batches"], args["num_ppo_epochs"],
            args["prm_step_tag"]) == (10, 4, 1, "ки")


@pytest.mark.slow  # 64 x 8 samples: ~45 s
def test_oat_ppo_on_gsm8k(model, tmp_path):
    data = write_jsonl(tmp_path / "gsm8k.jsonl",
                       [{"question": f"Sam has {i} apples and buys {i} more. How many?",
                         "final_answer": str(2 * i)} for i in range(1, 9)])
    out = run("ppo",
              ["--collocate", "--learning_rate", "1e-6", "--critic_learning_rate", "1e-6",
               "--lr_scheduler", "polynomial", "--kl_penalty_coef", "0", "--num_ppo_epochs", "2",
               "--beta", "0.0001", "--non_stop_penalty", "0", "--oracle_type", "reward",
               "--oracle", "gsm8k", "--pretrain", model, "--apply-chat-template", "--prompt_data",
               data, "--num_prompt_epoch", "6", "--num_samples", "8", "--temperature", "1.2",
               "--top_p", "0.9", "--generate_max_length", "1024", "--input_key", "question",
               "--output_key", "final_answer", "--train_batch_size", "64",
               "--train_batch_size_per_device", "8", "--rollout_batch_size", "64",
               "--rollout_batch_size_per_device", "8", "--pi_buffer_maxlen_per_device", "64",
               "--eval_temperature", "0.35", "--eval_n", "16", "--max_eval", "1500"], tmp_path)
    assert "--pretrain is oat's name for --model_name_or_path" in out
    assert "--collocate: one process" in out
    assert "with --kl_penalty_coef 0, oat's --beta 0.0001 is a KL loss" in out
    args = one_update(tmp_path / "runs/ppo/latest")
    # 64 prompts x 8 samples per rollout, 64 samples per optimizer step
    assert (args["num_prompts"], args["num_generations"], args["num_mini_batches"],
            args["micro_batch_size"]) == (64, 8, 8, 8)
    assert (args["kl_penalty"], args["kl_estimator"], args["max_new_tokens"],
            args["dataset_name"]) == ("loss", "k3", 1024, "gsm8k")
    assert (args["question_key"], args["answer_key"], args["lr_scheduler"]) \
        == ("question", "final_answer", "polynomial")
    # oat's evaluation: 16 samples a held-out problem at temperature 0.35 (avg@16, pass@16, maj@16)
    assert (args["eval_samples"], args["eval_temperature"]) == (16, 0.35)
    assert "--eval_n is oat's name for --eval_samples" in out


@pytest.mark.slow  # 128 x 8 samples: ~60 s
def test_oat_r1_zero_on_countdown(model, tmp_path):
    # lkevinzc/CountDownZero rows: a ready-made prompt in "input", TinyZero's ground truth in
    # "gt_answer"
    data = write_jsonl(tmp_path / "countdown.jsonl",
                       [{"input": "Using the numbers [3, 5, 7], make 22.",
                         "gt_answer": json.dumps({"target": 22, "numbers": [3, 5, 7]})}
                                                      for _ in range(4)])
    out = run("grpo",
              ["--critic_type", "grpo", "--gpus", "8", "--vllm_gpu_ratio", "0.7",
               "--learning_rate", "1e-6", "--lr_warmup_ratio", "1e-7", "--kl_penalty_coef", "0",
               "--num_ppo_epochs", "1", "--beta", "0.001", "--non_stop_penalty", "0", "--oracle",
               "countdown", "--pretrain", model, "--ref_offload", "--prompt_data", data,
               "--input_key", "input", "--output_key", "gt_answer", "--prompt_max_length", "256",
               "--num_samples", "8", "--temperature", "1.0", "--top_p", "0.9",
               "--generate_max_length", "1024", "--train_batch_size", "128",
               "--train_batch_size_per_device", "2", "--rollout_batch_size", "128",
               "--rollout_batch_size_per_device", "32", "--pi_buffer_maxlen_per_device", "256",
               "--eval_temperature", "0"], tmp_path)
    assert "--critic_type grpo: oat's name for this file's algorithm" in out
    assert "--gpus: launch with torchrun" in out
    args = one_update(tmp_path / "runs/grpo/latest")
    # 128 x 8 samples, 128 per optimizer step
    assert (args["num_prompts"], args["num_generations"], args["num_mini_batches"],
            args["micro_batch_size"]) == (128, 8, 8, 2)
    assert (args["dataset_name"], args["beta"], args["kl_penalty"],
            args["warmup_steps"]) == ("countdown", 0.001, "loss", 1)


@pytest.mark.slow  # 100 episodes of up to 10 steps: ~30 s
def test_llm_rl_reinforce_stable_on_gsm8k(model, tmp_path):
    # LLM_RL's data/*.json: a list of {"id", "problem", "solution"} whose solutions end "The answer
    # is: N"
    rows = [{"id": i, "problem": f"Sam has {i} apples and buys {i} more. How many apples?",
             "solution": f"He has {i} + {i} = {2 * i} apples.\nThe answer is: {2 * i}"}
            for i in range(1, 9)]
    (tmp_path / "data").mkdir()
    for name in ("test_all.json", "train_all.json"):
        (tmp_path / "data" / name).write_text(json.dumps(rows))
    (tmp_path / "policy").mkdir()
    (tmp_path / "policy/stepwise_solver_sys.txt").write_text(
        "Your task is to solve a mathematical problem step by step. For any calculation, use the "
        "symbol '<<>>'. "
        "Finally, end your solution with `The answer is: [answer]`.\nWrite every step of the "
        "solution in a new line.")
    out = run("reinforce_stepwise",
              ["--gsm8k_path", "data/test_all.json", "--train_data_file", "data/train_all.json",
               "--test_gsm8k_path", "data/test_all.json", "--sys_prompt_path",
               "policy/stepwise_solver_sys.txt", "--model_name_or_path", model, "--ref_model_name",
               model, "--cache_dir", "../../hfcache", "--n_few_shot_examples", "5",
               "--num_iterations", "20", "--num_collection_episodes", "100",
               "--max_trajectory_steps", "10", "--num_update_steps", "4096", "--cache_buffer",
               "--evaluation_iterations", "1", "--n_eval_steps", "101", "--buffer_cache_path",
               "data/buffer_cache_l1b_k25.pkl", "--gradient_accumulation_steps", "32",
               "--save_path", "data/policy_l1b_k25", "--n_save_iterations", "1", "--kl_coeff",
               "0.25", "--sym_calc", "--evaluation_at_start", "--update_ref_iterations", "2"],
              tmp_path)
    assert "--num_update_steps: no replay buffer" in out
    assert "--max_steps given: it wins over --num_iterations" in out
    args = one_update(tmp_path / "data/policy_l1b_k25")
    assert (args["num_prompts"], args["num_generations"], args["baseline"],
            args["sym_calc"]) == (100, 1, "none", True)
    assert (args["max_episode_steps"], args["beta"], args["ref_model_sync_steps"],
            args["num_few_shot"]) == (10, 0.25, 2, 5)
    assert args["dataset_name"] == "gsm8k"
    assert args["system_prompt"].startswith("Your task is to solve")


def test_trl_ppo_example(model, tmp_path):
    data = write_jsonl(tmp_path / "prompts.jsonl",
                       [{"question": f"What is {i} + {i}?", "answer": str(2 * i)}
                        for i in range(1, 9)])
    # TRL's --missing_eos_penalty is ppo.py's own option, with TRL's sign
    run("ppo",
        ["--dataset_name", data, "--dataset_train_split", "descriptiveness",
         "--learning_rate", "3e-6", "--output_dir",
         "pythia-1b-deduped-descriptiveness-sentiment-trl-style-ppo",
         "--per_device_train_batch_size", "64", "--gradient_accumulation_steps", "1",
         "--total_episodes", "10000", "--model_name_or_path", model, "--missing_eos_penalty",
         "1.0"], tmp_path)
    args = one_update(tmp_path / "pythia-1b-deduped-descriptiveness-sentiment-trl-style-ppo")
    assert (args["num_prompts"], args["num_mini_batches"], args["micro_batch_size"],
            args["missing_eos_penalty"]) == (64, 1, 64, 1.0)


def test_trl_grpo_cli(model, tmp_path):
    data = write_jsonl(tmp_path / "gsm8k.jsonl",
                       [{"question": f"What is {i} + {i}?", "answer": f"#### {2 * i}"}
                        for i in range(1, 9)])
    out = run("grpo", ["--model_name_or_path", model, "--dataset_name", data, "--reward_funcs",
                       "accuracy_reward", "--output_dir", "Qwen2-0.5B-GRPO", "--push_to_hub"],
              tmp_path)
    assert "--reward_funcs accuracy_reward: the task's verifier is the reward" in out
    assert "--push_to_hub:" in out
    args = one_update(tmp_path / "Qwen2-0.5B-GRPO")
    # TRL's data name: a file, for training and, a held-out fifth of its 8 rows, evaluation
    assert args["dataset_path"] == data and args["eval_dataset_path"] is None
    assert args["dataset_name"] == "gsm8k"
    assert f"{data}: no --eval_dataset_path, so 1 of its 8 rows are held out for evaluation and 7 " \
           "train" in out
