"""Does the suite catch the bugs that slip past unit tests of the helpers? Each bug below is a
realistic one-line mistake in the way an update loop wires its helpers together (issue 40). For
each, this copies the tree to a temporary folder, plants the bug there, and runs the test aimed at
it: the test must fail with the bug and pass without it.

    python dev/planted_bugs.py                 # all 19, a few minutes on 2 cores
    python dev/planted_bugs.py --bugs kl_swapped grads_summed

The working tree is never changed. PS4's exercises (exercises/bug.py) are made of these bugs.
Each test runs as the suite's first tier does (pytest.ini's `-m "not slow"`): an aimed test in
the second tier is deselected, and the bug says FAILS CLEAN.
"""

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# name: (file, the correct line(s), the bug, the test aimed at it)
BUGS = {
    "calculator_tokens_in_the_loss": (
        "reinforce_stepwise.py",
        "        loss_mask = batch.loss_mask  #",
        "        loss_mask = gen.response_mask  #",
        "tests/test_reinforce_stepwise.py::test_an_update_gives_the_calculators_tokens_no_gradient"),
    "group_of_the_wrong_size": (
        "grpo.py",
        "advantages = group_advantages(rewards, G,",
        "advantages = group_advantages(rewards, args.num_prompts,",
        "tests/test_grpo.py::test_each_group_of_the_update_is_scored_against_its_own_mean"),
    "gradients_not_zeroed_between_minibatches": (
        "ppo.py",
        "            optimizer.zero_grad(set_to_none=True)\n"
        "            critic_optimizer.zero_grad(set_to_none=True)\n            total_loss",
        "            critic_optimizer.zero_grad(set_to_none=True)\n            total_loss",
        "tests/test_ppo.py::test_each_optimizer_step_takes_its_own_minibatchs_gradient_alone"),
    "value_targets_after_whitening": (
        "ppo.py",
        "        advantages = masked_whiten(advantages, mask)\n    return advantages, returns",
        "        advantages = masked_whiten(advantages, mask)\n"
        "        returns = (advantages + values) * mask\n    return advantages, returns",
        "tests/test_ppo.py::test_value_targets_are_the_returns_before_the_advantages_are_whitened"),
    "kl_swapped": (
        "grpo.py",
        "kl = kl_estimate(gen.logprobs, ref_logprobs, args.kl_estimator)",
        "kl = kl_estimate(ref_logprobs, gen.logprobs, args.kl_estimator)",
        "tests/test_grpo.py::"
        "test_the_kl_in_the_reward_is_the_samplers_to_the_references_once_the_policy_moved"),
    "kl_weight_dropped": (
        "reinforce.py",
        "returns = kl_regularised_returns(scores, kl_seq, args.beta)",
        "returns = kl_regularised_returns(scores, kl_seq, 1.0)",
        "tests/test_reinforce.py::test_the_kl_enters_the_return_times_beta"),
    "critic_off_by_one": (
        "ppo.py",
        "values = critic(input_ids, attention_mask, input_ids.shape[1] - R)[:, -R - 1:-1]",
        "values = critic(input_ids, attention_mask, input_ids.shape[1] - R)[:, -R:]",
        "tests/test_ppo.py::test_values_are_read_at_the_position_before_each_token"),
    "shared_head_off_by_one": (
        "ppo.py",
        "critic(hidden[:, -R - 1:-1])  # [b, R]",
        "critic(hidden[:, -R:])  # [b, R]",
        "tests/test_ppo.py::test_values_are_read_at_the_position_before_each_token"),
    "reference_is_the_policy": (
        "online_dpo.py",
        "                    ref_policy, pairs, 1.0, 2 * micro_batch, fast=not args.plain)",
        "                    policy, pairs, 1.0, 2 * micro_batch, fast=not args.plain)",
        ("tests/test_online_dpo.py::"
         "test_the_reference_is_the_starting_policy_once_the_policy_moved")),
    "old_logprobs_of_other_rows": (
        "appo.py",
        "loss, loss_stats = policy_loss(logprobs, old_logprobs[rows],",
        "loss, loss_stats = policy_loss(logprobs, old_logprobs[in_batch],",
        ("tests/test_appo.py::"
         "test_each_micro_batch_is_compared_with_the_sampling_log_probs_of_its_own_rows")),
    "step_mean_copied_into_the_token_loss": (
        "tppo.py",
        "    return (all_reduce_sum(loss_mask.sum().float()) / world_size).clamp(min=1).item()",
        "    return float(loss_mask.shape[0])",
        "tests/test_tppo.py::test_both_losses_are_token_means_over_the_minibatch"),
    "teacher_at_another_temperature": (
        "distill.py",
        "                        teacher, input_ids[rows], attention_mask[rows], R,\n"
        "                        args.temperature,",
        "                        teacher, input_ids[rows], attention_mask[rows], R,\n"
        "                        1.0,",
        "tests/test_distill.py::"
        "test_a_run_whose_teacher_is_the_student_measures_a_kl_of_0_and_moves_no_weight"),
    "tool_answers_in_the_loss": (
        "tools.py",
        "        loss_mask = own_mask  # [N, R] the tokens that count in the loss",
        "        loss_mask = response_mask  # [N, R] the tokens that count in the loss",
        "tests/test_tools.py::test_an_update_trains_on_the_model_s_tokens_only"),
    "off_policy_weight_upside_down": (
        "async_grpo.py",
        "    log_r = (old_logprobs - sampler_logprobs) * mask",
        "    log_r = (sampler_logprobs - old_logprobs) * mask",
        "tests/test_async_grpo.py::test_each_correction_weighs_tokens_as_worked_by_hand"),
    "cut_responses_kept_in_the_loss": (
        "dapo.py",
        "            loss_mask = loss_mask * (~gen.truncated)[:, None]",
        "            loss_mask = loss_mask * gen.truncated[:, None]",
        "tests/test_dapo.py::"
        "test_every_cut_response_is_out_of_the_loss_and_pays_the_whole_penalty"),
    "cispo_weight_not_detached": (
        "cispo.py",
        "    pg_loss = -ratio.clamp(max=high).detach() * advantages * logprobs",
        "    pg_loss = -ratio.clamp(max=high) * advantages * logprobs",
        "tests/test_cispo.py::test_the_weight_is_detached"),
    "sapo_temperatures_swapped": (
        "sapo.py",
        "    tau = torch.where(advantages > 0, args.sapo_temperature_pos,",
        "    tau = torch.where(advantages < 0, args.sapo_temperature_pos,",
        "tests/test_sapo.py::test_each_sign_of_the_advantage_takes_its_own_temperature"),
    "prompt_in_the_loss": (
        "sft.py",
        "    rows = [targets[p] for p in problems]",
        "    rows = [prompt + targets[p] for prompt, p in zip(prompts, problems)]",
        "tests/test_sft.py::"
        "test_an_update_s_loss_is_transformers_own_with_the_prompt_labelled_minus_100"),
    "grads_summed": (
        "common/distributed.py",
        "    flat.div_(world_size())\n",
        "    pass\n",
        "tests/test_grpo.py::test_torchrun_two_processes_match_one_process"),
}


def copy_tree(dest):
    # bugs/: the copies of PS4's exercises (exercises/bug.py), a student's work, not the tree's
    shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(
        ".git", ".dev", "runs", "outputs", "__pycache__", ".pytest_cache", ".venv*", "out", "bugs"))


def run_test(tree, test):
    """pytest on one test of the tree: the finished process, its output captured."""
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
                          cwd=tree, capture_output=True, text=True)


def passes(tree, test):
    return run_test(tree, test).returncode == 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bugs", nargs="+", default=list(BUGS), choices=list(BUGS))
    args = parser.parse_args()
    missed = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.bugs:
            path, right, wrong, test = BUGS[name]
            tree = Path(tmp) / name
            copy_tree(tree)
            source = (tree / path).read_text()
            if source.count(right) != 1:
                sys.exit(f"{name}: {path} no longer holds the line to plant the bug in: "
                         "update BUGS")
            clean = passes(tree, test)
            (tree / path).write_text(source.replace(right, wrong))
            caught = not passes(tree, test)
            verdict = ("caught" if clean and caught else "NOT caught" if clean
                       else "FAILS CLEAN")
            missed += [] if clean and caught else [name]
            print(f"{name:42s} {verdict:12s} {test}", flush=True)
            shutil.rmtree(tree)
    print("every bug caught" if not missed else
          f"{len(missed)} not caught: {', '.join(missed)}")
    sys.exit(1 if missed else 0)


if __name__ == "__main__":
    main()
