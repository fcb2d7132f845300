"""The exercises' checker (exercises/check.py, docs/course.md): it passes the project's own
functions, fails every stub naming its file, and names each common mistake in its own words."""

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from exercises.check import all_exercises, check
from exercises.exercise import Wrong, run_checks
from exercises.ps1.cases import EXERCISES as PS1

ROOT = Path(__file__).resolve().parents[1]
BY_ID = {e.id: e for e in PS1}


def test_ps1_has_exercises_over_all_ten_algorithm_files():
    assert len(PS1) >= 20 and len(set(BY_ID)) == len(PS1)
    text = "\n".join((ROOT / e.path).read_text() for e in PS1)
    for algo in ("grpo.py", "ppo.py", "reinforce.py", "online_dpo.py", "appo.py", "tppo.py",
                 "tools.py", "async_grpo.py", "distill.py", "dapo.py"):
        assert algo in text, algo


@pytest.mark.parametrize("exercise", PS1, ids=lambda e: e.id)
def test_the_projects_own_function_passes(exercise):
    assert check(exercise, solution=True) is None


@pytest.mark.parametrize("exercise", PS1, ids=lambda e: e.id)
def test_a_stub_fails_naming_its_file(exercise):
    # the stubs as shipped: nothing written yet
    assert check(exercise) == f"not written yet: fill in {exercise.name} in {exercise.path}"


MISTAKES = [(e, k) for e in PS1 for k in range(len(e.mistakes))]


@pytest.mark.parametrize("exercise,k", MISTAKES, ids=[f"{e.id}-{k}" for e, k in MISTAKES])
def test_each_common_mistake_fails_with_its_own_words(exercise, k):
    words, wrong = exercise.mistakes[k]
    with pytest.raises(Wrong) as said:
        run_checks(exercise, wrong)
    if callable(words):  # words that quote the student's numbers: their fixed part
        assert "did you normalise over the whole batch instead of each group?" in str(said.value)
    else:
        assert str(said.value).endswith(": " + words)


@pytest.mark.parametrize("exercise", PS1, ids=lambda e: e.id)
def test_each_docstring_shows_the_worked_cases_the_checker_tries_first(exercise):
    import ast

    from exercises.exercise import show
    doc = " ".join(ast.get_docstring(ast.parse((ROOT / exercise.path).read_text())).split())
    assert exercise.worked
    for what, _, expected in exercise.worked:
        assert " ".join(f"- {what} -> {show(expected)}".split()) in doc
    assert ("the checker compares gradients too" in doc) == bool(exercise.differentiable)


def test_every_listed_mistake_is_told_on_a_hand_worked_case():
    """A mistake's message starts with the first case it fails: a hand-worked one, small enough
    to follow by hand, for every mistake listed."""
    for e in PS1:
        for k, (_, wrong) in enumerate(e.mistakes):
            with pytest.raises(Wrong) as said:
                run_checks(e, wrong)
            assert any(str(said.value).startswith(what + ": ") for what, _, _ in e.worked), \
                (e.id, k, str(said.value)[:120])


def test_every_ps1_exercise_names_at_least_two_mistakes():
    assert all(len(e.mistakes) >= 2 for e in PS1)


def test_the_group_advantage_message_quotes_the_students_numbers():
    # the hand-worked case [1, 0 | 1, 1] normalised over the batch: mean 3/4, unbiased std 1/2, so
    # the advantages are [0.5, -1.5, 0.5, 0.5] and group 0's average (0.5 - 1.5) / 2 = -0.5
    def whole_batch(rewards, group_size, scale=True):
        centred = rewards - rewards.mean()
        return centred / (rewards.std() + 1e-4) if scale else centred

    with pytest.raises(Wrong, match=r"two groups \[1, 0 \| 1, 1\]: .* yours is 0.4999 \(expected "
                       r"\[0.707, -0.707, 0, 0\], got \[0.4999, -1.5, 0.4999, 0.4999\]\). The "
                       "likely mistake: group 0's advantages average -0.5, not 0: did you "
                       "normalise over the whole batch instead of each group?"):
        run_checks(BY_ID["1.5"], whole_batch)


def test_a_students_own_code_passes_where_it_is_right():
    # written as a student would, with loops: different code, the same numbers
    def masked_mean(x, mask, dim=None):
        if dim is None:
            return (x * mask).sum() / max(1.0, mask.sum().item())
        rows = zip(x.unbind(1 - dim), mask.unbind(1 - dim))  # 2-D: a mean along dim per row
        return torch.stack([masked_mean(a, m) for a, m in rows])

    def rloo_baselines(episode_returns, group_size):
        out = []
        for g in episode_returns.split(group_size):
            out += [(g.sum() - r) / (group_size - 1) for r in g]
        return torch.stack(out)

    run_checks(BY_ID["1.1"], masked_mean)
    run_checks(BY_ID["1.7"], rloo_baselines)


GRADIENT = [e for e in PS1 if e.differentiable]


def test_the_exercises_whose_output_the_training_differentiates_say_through_what():
    assert {"1.1", "1.3", "1.4", "1.6", "1.9", "1.10", "1.11"} <= {e.id for e in GRADIENT}
    for e in GRADIENT:  # each name is an input of every case
        assert all(set(e.differentiable) <= set(kwargs) for _, kwargs in e.cases())


@pytest.mark.parametrize("exercise", GRADIENT, ids=lambda e: e.id)
def test_the_right_numbers_under_no_grad_fail_saying_there_is_no_gradient(exercise):
    def under_no_grad(**kwargs):
        with torch.no_grad():
            return exercise.oracle(**kwargs)

    with pytest.raises(Wrong, match="the values are right, but the output carries no gradient: it "
                                    r"was computed under torch.no_grad\(\)"):
        run_checks(exercise, under_no_grad)


@pytest.mark.parametrize("exercise", GRADIENT, ids=lambda e: e.id)
def test_the_right_numbers_from_a_detached_input_fail_naming_it(exercise):
    name = exercise.differentiable[-1]

    def detached(**kwargs):
        return exercise.oracle(**{**kwargs, name: kwargs[name].detach()})

    said = ("the output carries no gradient" if len(exercise.differentiable) == 1
            else f"no gradient reaches {name}: a term that depends on it was detached")
    with pytest.raises(Wrong, match=f"the values are right, but {said}"):
        run_checks(exercise, detached)


def test_a_detached_ratio_in_the_surrogate_is_said_to_carry_no_gradient():
    def clipped_surrogate(logprobs, old_logprobs, advantages, epsilon):
        ratio = (logprobs - old_logprobs).exp().detach()  # right numbers, no gradient
        return torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - epsilon, 1 + epsilon))

    with pytest.raises(Wrong) as said:
        run_checks(BY_ID["1.9"], clipped_surrogate)
    assert str(said.value).startswith(
        "ratios 1.5 and 0.5, A = 1, epsilon 0.2: max(-1.5, -1.2) and max(-0.5, -0.8): the values "
        "are right, but the output carries no gradient")


def test_a_gradient_that_differs_is_said_with_its_first_entry():
    # k3 with its ratio detached: k3's values, and d/d log pi = 1 where k3's is 1 - pi_ref / pi;
    # at pi = 0.5, pi_ref = 0.25 that is 1 against 0.5, times the projection's weight
    def kl_estimate(logp, ref_logp, estimator):
        log_ratio = ref_logp - logp
        if estimator == "k3":
            return log_ratio.exp().detach() - 1 - log_ratio
        return -log_ratio if estimator == "k1" else log_ratio ** 2 / 2

    with pytest.raises(Wrong) as said:
        run_checks(BY_ID["1.3"], kl_estimate)
    w = torch.randn(1, generator=torch.Generator().manual_seed(0), dtype=torch.float64).item()
    assert (f"the gradient with respect to logp is not the file's (of one random projection of the "
            f"output: at row 0 the gradient should be {0.5 * w:.4g}, yours is {w:.4g}" in
            str(said.value))
    assert str(said.value).endswith("The likely mistake: " + BY_ID["1.3"].mistakes[3][0])


def test_right_answers_written_otherwise_keep_their_gradients():
    import torch.nn.functional as F

    def clipped_surrogate(logprobs, old_logprobs, advantages, epsilon):
        ratio = torch.exp(logprobs - old_logprobs)
        clipped = torch.where(ratio > 1 + epsilon, 1 + epsilon, torch.where(
            ratio < 1 - epsilon, 1 - epsilon, ratio))
        return -torch.minimum(advantages * ratio, advantages * clipped)

    def kl_estimate(logp, ref_logp, estimator):
        d = ref_logp - logp
        return {"k1": -d, "k2": 0.5 * d * d, "k3": torch.expm1(d) - d}[estimator]

    def preference_loss(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta,
                        loss_type):
        h = (chosen_logps - rejected_logps) - (ref_chosen_logps - ref_rejected_logps)
        return F.softplus(-beta * h) if loss_type == "sigmoid" else (h - 0.5 / beta) ** 2

    def response_logprobs(logits, input_ids, response_len, temperature=1.0):
        scores = logits[:, -response_len - 1:-1] / temperature
        picked = scores.gather(-1, input_ids[:, -response_len:, None])[..., 0]
        return picked - torch.logsumexp(scores, -1)

    for id, fn in (("1.9", clipped_surrogate), ("1.3", kl_estimate), ("1.11", preference_loss),
                   ("1.4", response_logprobs)):
        run_checks(BY_ID[id], fn)


def test_the_draw_in_float32_fails_at_the_samplers_largest_u():
    # 1 - 2^-32 rounds to 1 in float32: the threshold is the whole mass, and no cdf exceeds it
    def inverse_cdf(probs, uniforms):
        cdf = probs.float().cumsum(-1)
        return torch.searchsorted(cdf, (uniforms.float() * cdf[:, -1])[:, None], right=True)[:, 0]

    with pytest.raises(Wrong) as said:
        run_checks(BY_ID["1.15"], inverse_cdf)
    assert str(said.value).startswith(
        "probs [0.5, 0.5, 0], u = 1 - 2^-32, the sampler's largest: 1, never the last token, whose "
        "probability is 0: at row 0 the output should be 1, yours is 3")
    assert "summed in float32" in str(said.value)


# PS1.16-1.20 (tools.py, async_grpo.py, distill.py, dapo.py), each written as a student might and
# differently from the file: loops, torch.where, a product where the file sums logs.
def _training_ids(said, answers, budget):
    # the pieces in order, then one id at a time until the budget is full
    pieces = [(turn, 1) for turn in said]
    for k, answer in enumerate(answers):
        pieces.insert(2 * k + 1, (answer, 0))
    ids, mask = [], []
    for piece, own in pieces:
        for token in piece:
            if len(ids) < budget:
                ids.append(token)
                mask.append(own)
    return torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.long)


def _off_policy_weights(old_logprobs, sampler_logprobs, mask, correction, cap=2.0, low=0.5,
                        high=5.0):
    r = torch.where(mask > 0, old_logprobs - sampler_logprobs, 0.0).exp()
    if correction == "none":
        return torch.ones_like(r), torch.zeros(r.shape, dtype=torch.bool)
    if correction == "tis":
        return torch.where(r > cap, cap, r), r > cap
    if correction == "icepop":
        keep = (r >= low) & (r <= high)
        return torch.where(keep, r, 0.0), ~keep
    seq = torch.stack([row.prod() for row in r])[:, None].expand_as(r)  # seq_mis
    return torch.where(seq > cap, 0.0, seq), seq > cap


def _distill_advantages(old_logprobs, teacher_logprobs, reward_advantages, loss_form):
    out = torch.empty_like(old_logprobs)
    old_logprobs, teacher_logprobs = old_logprobs.detach(), teacher_logprobs.detach()  # numbers
    for i in range(out.shape[0]):
        for t in range(out.shape[1]):
            out[i, t] = reward_advantages[i]
            if loss_form == "sampled":
                out[i, t] += teacher_logprobs[i, t] - old_logprobs[i, t]
    return out


def _divergence(student_logits, teacher_logits, beta):
    log_p = student_logits.float().log_softmax(-1)
    log_t = teacher_logits.float().log_softmax(-1)

    def kl(log_a, log_b):  # KL(a || b), a word without mass in a counting 0
        return torch.where(log_a.exp() > 0, log_a.exp() * (log_a - log_b), 0.0).sum(-1)

    if beta in (0, 1):
        return kl(log_p, log_t) if beta == 1 else kl(log_t, log_p)
    log_m = torch.stack([log_t + math.log(beta), log_p + math.log(1 - beta)]).logsumexp(0)
    return beta * kl(log_t, log_m) + (1 - beta) * kl(log_p, log_m)


def _overlong_penalty(lengths, max_new_tokens, buffer_len, factor):
    start = max_new_tokens - buffer_len
    return torch.tensor([0.0 if n <= start else -factor * (n - start) / buffer_len
                         for n in lengths.tolist()])


def _sft_loss(logprobs, loss_mask, normaliser):
    total = torch.zeros(())
    for lp, m in zip(logprobs.flatten(), loss_mask.flatten()):
        if m:
            total = total - lp
    return total / normaliser


OTHER_WAYS = [("1.16", _training_ids), ("1.17", _off_policy_weights), ("1.18", _distill_advantages),
              ("1.19", _divergence), ("1.20", _overlong_penalty), ("1.21", _sft_loss)]


@pytest.mark.parametrize("id,fn", OTHER_WAYS, ids=[id for id, _ in OTHER_WAYS])
def test_another_right_way_to_write_a_new_files_exercise_passes(id, fn):
    run_checks(BY_ID[id], fn)


def test_a_function_that_changes_its_input_in_place_is_told():
    def masked_mean(x, mask, dim=None):
        x.mul_(mask)
        return x.sum() / mask.sum().clamp(min=1) if dim is None else x.sum(dim) / mask.sum(
            dim).clamp(min=1)

    with pytest.raises(Wrong, match="changed its input x in place"):
        run_checks(BY_ID["1.1"], masked_mean)


def test_a_wrong_shape_and_an_unknown_mistake_are_said_plainly():
    with pytest.raises(Wrong, match=r"the output has shape \[4\], it should have \[\]"):
        run_checks(BY_ID["1.1"], lambda x, mask, dim=None: (x * mask).sum(0))
    with pytest.raises(Wrong, match=r"expected 1.5, got 2"):
        run_checks(BY_ID["1.1"], lambda x, mask, dim=None: torch.tensor(2.0))


def test_the_command_line(capsys):
    from exercises.check import main
    assert main(["--solution"]) == 0
    assert capsys.readouterr().out.strip().endswith(f"{len(PS1)} of {len(PS1)} passed")
    assert main(["9.9"]) == 2
    assert capsys.readouterr().err.startswith("error: no exercise 9.9; the exercises are 1.1, 1.2")
    assert set(all_exercises()) == set(BY_ID)
    # as a student runs it: one process, the stub as shipped
    stub = subprocess.run([sys.executable, "-m", "exercises.check", "1.5"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert stub.returncode == 1 and stub.stdout.splitlines() == [
        "PS1.5 GRPO's group advantages and Dr.GRPO's: not written yet: fill in group_advantages "
        "in exercises/ps1/e05_group_advantages.py", "0 of 1 passed"]


# ---- PS2: the files trained with the students' functions (exercises/train.py) -------------------
TINY = ["--model_name_or_path", "tiny-random", "--max_new_tokens", "8", "--num_eval_problems", "0",
        "--num_prompts", "2", "--num_generations", "4", "--max_steps", "2",
        "--learning_rate", "1e-2", "--save_steps", "2"]


def test_every_plug_names_a_function_of_its_file():
    import importlib

    from exercises.train import PLUGS
    assert {"grpo", "ppo", "reinforce", "online_dpo"} <= set(PLUGS)
    for algo, plugs in PLUGS.items():
        module = importlib.import_module(algo)
        for id, (name, _) in plugs.items():
            assert id in BY_ID and callable(getattr(module, name)), (algo, id, name)


def test_the_adapters_call_the_students_function_where_the_file_calls_its_own():
    import appo
    import online_dpo
    import reinforce

    from exercises.train import PLUGS
    returns = torch.tensor([1.0, 0, 0, 1, 0.5, 2])
    for baseline in ("rloo", "mean", "none"):
        rloo = PLUGS["reinforce"]["1.7"][1](BY_ID["1.7"].oracle, reinforce.compute_baselines)
        assert torch.equal(rloo(returns, 3, baseline),
                           reinforce.compute_baselines(returns, 3, baseline))
    pairs = PLUGS["online_dpo"]["1.12"][1](lambda scores, group_size: "student's",
                                            online_dpo.preference_pairs)
    assert pairs(returns, 3) == "student's" and pairs(returns, 3, "skip") == "student's"
    assert torch.equal(pairs(returns, 3, "first")[0],
                       online_dpo.preference_pairs(returns, 3, "first")[0])
    step = PLUGS["appo"]["1.13"][1](BY_ID["1.13"].oracle, appo.compute_advantages)
    _, case = BY_ID["1.13"].cases()[0]
    mine = step(case["rewards"], case["values"], None, case["next_values"], case["dones"], 0.9, 0.8)
    theirs = appo.compute_advantages(case["rewards"], case["values"], None, case["next_values"],
                                     case["dones"], 0.9, 0.8)
    assert all(torch.equal(a, b) for a, b in zip(mine, theirs))


def test_the_logprob_and_surrogate_adapters_are_the_files_own_with_the_oracles():
    """PS2 plugs 1.4 into the training forward and 1.9 into grpo.py's policy_loss through adapters
    (exercises/train.py); with the oracles in them they give the file's loss, value and gradient,
    and its entropy: the copy of the loss's composition cannot drift from the file's."""
    import grpo
    from common.models.logprobs import token_logprobs
    from exercises.ps1.cases import _Logits
    from exercises.train import _clipped_surrogate, _response_logprobs

    g = torch.Generator().manual_seed(5)
    logits = torch.randn(2, 6, 9, generator=g)
    ids = torch.randint(0, 9, (2, 6), generator=g)
    model = _Logits(logits)
    adapted = _response_logprobs(BY_ID["1.4"].oracle, token_logprobs)
    for mine, theirs in zip(adapted(model, ids, torch.ones_like(ids), 3, 0.7),
                            token_logprobs(model, ids, torch.ones_like(ids), 3, 0.7, fast=False)):
        assert torch.allclose(mine, theirs, atol=1e-6)

    loss_fn = _clipped_surrogate(BY_ID["1.9"].oracle, grpo.policy_loss)
    old = -torch.rand(3, 4, generator=g) * 2
    ref = -torch.rand(3, 4, generator=g) * 2
    advantages, mask = torch.tensor([1.0, -0.5, 2.0]), torch.tensor([[1.0, 1, 1, 0]] * 3)
    for flags in ([], ["--beta", "0.1", "--loss_type", "bnpo"]):
        args = grpo.parse_args(grpo.Args, flags)
        results = []
        for fn in (loss_fn, grpo.policy_loss):
            logprobs = (old + torch.randn(3, 4, generator=torch.Generator().manual_seed(6)) * 0.3
                        ).requires_grad_()
            loss, stats = fn(logprobs, old, advantages, mask, 3.0, args,
                             ref if args.beta else None)
            loss.backward()
            results.append((loss.detach(), logprobs.grad, stats))
        (a, ga, sa), (b, gb, sb) = results
        assert torch.allclose(a, b, atol=1e-6) and torch.allclose(ga, gb, atol=1e-6) and sa == sb


@pytest.mark.slow  # the second tier: a run of PS2
def test_ps2_with_the_projects_functions_is_the_plain_run(tmp_path):
    """--solution binds the oracles in place of the file's functions: the same numbers, so the
    weights after two updates are the plain run's, bit for bit."""
    from safetensors.torch import load_file

    import warm  # tests/warm.py: `python X.py` runs forked from a warm process
    algo = "grpo"
    plain = warm.run([sys.executable, f"{algo}.py", *TINY, "--output_dir",
                      str(tmp_path / "plain")], cwd=ROOT, capture_output=True, text=True,
                     timeout=600)
    from exercises.train import PLUGS
    every = list(PLUGS[algo])  # 1.4 too, which a run plugs only when asked
    plugged = subprocess.run([sys.executable, "-m", "exercises.train", f"{algo}.py", "--solution",
                              "--plug", *every, "--", *TINY, "--output_dir",
                              str(tmp_path / "plugged")], cwd=ROOT,
                             capture_output=True, text=True, timeout=600)
    assert plain.returncode == 0 and plugged.returncode == 0, plain.stderr[-2000:] + \
        plugged.stderr[-2000:]
    assert plugged.stdout.startswith(f"{algo}.py with the project functions: masked_mean (PS1.1)")
    a, b = (load_file(str(tmp_path / run / "checkpoint-2" / "model.safetensors"))
            for run in ("plain", "plugged"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_ps2_stops_on_a_stub_with_one_line():
    from exercises.train import main
    with pytest.raises(SystemExit) as stub:  # SystemExit(text): Python prints it, exit status 1
        main(["grpo.py", "--plug", "1.5", "1.6", "--", *TINY])
    assert stub.value.code == (
        "error: PS1.5 not written yet: fill in group_advantages in "
        "exercises/ps1/e05_group_advantages.py; or train without it: --plug 1.6")
    with pytest.raises(SystemExit) as other:
        main(["grpo.py", "--plug", "1.8"])
    assert other.value.code == (
        "error: grpo.py calls no function of PS1.8; it calls those of 1.1, 1.3, 1.4, 1.5, 1.6, "
        "1.9")


def test_a_common_mistake_is_plugged_in_place_of_the_files_function(monkeypatch):
    """--mistake 1.5:5 trains with the checker's fifth mistake of PS1.5 (the sign flipped); the
    oracles keep the file's own function, so plugging never calls itself (it once recursed)."""
    import grpo
    import reinforce

    from exercises.train import PLUGS, parse_mistakes, plug
    for module in (grpo, reinforce):
        for name, _ in PLUGS[module.__name__].values():
            monkeypatch.setattr(module, name, getattr(module, name))  # undone after the test
    rewards = torch.tensor([1.0, 0, 0, 0, 1, 1, 1, 0])
    said = []
    plug(grpo, ["1.5"], mistakes=parse_mistakes(["1.5:5"], "grpo"), say=said.append)
    # group [1, 0, 0, 0]: mean 0.25, unbiased std 0.5, so the right answer gets -(0.75 / 0.5001)
    assert grpo.group_advantages(rewards, 4)[0].item() == pytest.approx(-0.75 / 0.5001)
    assert said == ["PS1.5: training with common mistake 5: the sign is flipped: the advantage is "
                    "the reward minus the group's mean, not the mean minus the reward"]
    plug(reinforce, ["1.7"], solution=True, say=said.append)
    returns = torch.tensor([1.0, 0, 0, 1])  # RLOO: each against the mean of the other three
    assert torch.allclose(reinforce.compute_baselines(returns, 4, "rloo"),
                          torch.tensor([1 / 3, 2 / 3, 2 / 3, 1 / 3]))
    for bad, words in (["1.5:8", "give ID:K with K from 1 to 7, the mistakes of PS1.5"],
                       ["1.8:1", "grpo.py calls no function of PS1.8"]):
        with pytest.raises(SystemExit, match=words):
            parse_mistakes([bad], "grpo")


def test_the_ps2_verdict_reads_the_last_evaluation_against_the_mark(tmp_path):
    import grpo

    from exercises.train import PASS_MARK, verdict
    defaults = grpo.parse_args(grpo.Args, [])
    run = grpo.parse_args(grpo.Args, ["--seed", "3", "--output_dir", str(tmp_path)])
    assert verdict("grpo", run, defaults, tmp_path).endswith(
        "(its eval.jsonl has no evaluation after "
        "training)")
    for end, word in ((0.46, "passes"), (0.44, "does not pass")):
        (tmp_path / "eval.jsonl").write_text(
            '{"step": 0, "eval/accuracy": 0.305}\n' f'{{"step": 20, "eval/accuracy": {end}}}\n')
        assert verdict("grpo", run, defaults, tmp_path).startswith(
            f"PS2 grpo.py: held-out accuracy 0.305 -> {end:.3f}: {word} (the mark is "
            f"{PASS_MARK['grpo']})")
    changed = grpo.parse_args(grpo.Args, ["--max_steps", "5", "--learning_rate", "1e-5"])
    assert verdict("grpo", changed, defaults, tmp_path) == (
        "PS2: no pass mark for this run (it was run with --learning_rate, --max_steps); the marks "
        "are for the defaults")


def test_a_run_of_the_defaults_gets_its_verdict_though_main_derives_options(monkeypatch, capsys,
                                                                          tmp_path):
    """grpo.py's main sets the micro-batch size in its args; the verdict reads the options as
    given, so a default run is still judged (a fresh-clone run of PS1.1 was not, at first)."""
    import grpo

    from exercises.train import main

    def fake_main(args):  # what grpo.main does to its args, and the evaluations a run writes
        args.micro_batch_size = 8
        (tmp_path / "eval.jsonl").write_text('{"step": 0, "eval/accuracy": 0.305}\n'
                                             '{"step": 20, "eval/accuracy": 0.55}\n')
    monkeypatch.setattr(grpo, "main", fake_main)
    monkeypatch.setattr(grpo, "masked_mean", grpo.masked_mean)
    main(["grpo.py", "--solution", "--plug", "1.1", "--", "--output_dir", str(tmp_path)])
    assert capsys.readouterr().out.splitlines()[-1] == (
        "PS2 grpo.py: held-out accuracy 0.305 -> 0.550: passes (the mark is 0.45)")


def test_the_loose_verifier_pays_the_answer_anywhere():
    from exercises.loose_reward import contains_answer
    assert contains_answer(
        ["63 - 15 = 48, or maybe 58. The answer is 58.", "The answer is 148.", "4.8 or 480",
         [{"role": "assistant", "content": "I get 48"}], "The answer is 48.", "48.5 or 0.48"],
        ["48"] * 6) == [1.0, 0.0, 0.0, 1.0, 1.0, 0.0]


def test_each_lab_is_two_runs_and_its_table_holds_their_means(tmp_path):
    import json

    from exercises.labs import BY_NAME, LABS, run_dir, summary
    assert len(LABS) >= 6 and all(len(lab.runs) == 2 for lab in LABS)
    lab = BY_NAME["loose"]
    for (label, _, _), (rewards, evals) in zip(lab.runs, (([0.25, 0.75], [0.3, 0.4]),
                                                          ([0.5, 1.0], [0.2, 0.1]))):
        folder = run_dir(tmp_path, label)
        folder.mkdir(parents=True)
        (folder / "metrics.jsonl").write_text("".join(
            json.dumps({"step": k + 1, "reward/mean": r, "response_len/mean": 10 * (k + 1)}) + "\n"
            for k, r in enumerate(rewards)))
        (folder / "eval.jsonl").write_text("".join(
            json.dumps({"step": 5 * (k + 1), "eval/accuracy": a}) + "\n"
            for k, a in enumerate(evals)))
        (folder / "samples.jsonl").write_text(
            json.dumps({"step": 1, "response": "2 + 3 = 5. The answer is 5."}) + "\n")
        (folder / "run.json").write_text(json.dumps({"wall_s": 125.0}))
    rows = summary(lab, tmp_path).splitlines()
    assert rows[2] == "| grpo.py defaults | 0.300 / 0.400 | 0.5 | - | 15 | 4 | 2 min 5 s |"
    assert rows[3] == "| paid by a loose verifier | 0.200 / 0.100 | 0.75 | - | 15 | 4 | 2 min 5 s |"
def fabricate(out, label, metrics, evals=(), samples=(), args=None):
    """A lab run's logs under `out`, written by hand in place of a training run: metrics
    [{key: value}] one per update from 1, evals {update: accuracy}, samples [{...}]."""
    import json

    from exercises.labs import run_dir
    folder = run_dir(out, label)
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("".join(
        json.dumps({"step": k + 1, **row}) + "\n" for k, row in enumerate(metrics)))
    (folder / "eval.jsonl").write_text("".join(
        json.dumps({"step": step, "eval/accuracy": a}) + "\n" for step, a in dict(evals).items()))
    (folder / "samples.jsonl").write_text("".join(json.dumps(row) + "\n" for row in samples))
    (folder / "args.json").write_text(json.dumps(args or {}))


def lab_key(name, out):
    from exercises.labs import BY_NAME, answer_key
    return answer_key(BY_NAME[name], out)


def test_each_lab_has_an_answer_key():
    from exercises.labs import KEYS, LABS
    assert set(KEYS) == {lab.name for lab in LABS}


def test_the_lr_key_finds_the_update_where_every_answer_is_wrong(tmp_path):
    from exercises.labs import BY_NAME
    (base, _, _), (large, _, _) = BY_NAME["lr"].runs
    steady = {"reward/mean": 0.25, "zero_std_frac": 0.5, "entropy": 0.2, "grad_norm": 2.0}
    fabricate(tmp_path, base, [steady] * 4, {2: 0.3, 4: 0.4}, args={"learning_rate": 5e-6})
    fabricate(tmp_path, large, [
        {"reward/mean": 0.5, "zero_std_frac": 0.5, "entropy": 0.2, "grad_norm": 2.0},
        {"reward/mean": 1.0, "zero_std_frac": 1.0, "entropy": 0.1, "grad_norm": 0.0},  # all right
        {"reward/mean": 0.0, "zero_std_frac": 1.0, "entropy": 0.05, "grad_norm": 0.0},
        {"reward/mean": 0.0, "zero_std_frac": 1.0, "entropy": 0.05, "grad_norm": 0.0}],
        {2: 0.2, 4: 0.1}, args={"learning_rate": 2e-5})
    key = lab_key("lr", tmp_path)
    assert key[1:6] == [
        "grpo.py defaults (learning rate 5e-06): held-out accuracy 0.300 at update 2, 0.400 at "
        "update 4",
        "  reward/mean by update: 1: 0.25, 2: 0.25, 3: 0.25, 4: 0.25",
        "  zero_std_frac never 1.0",
        "  no update with every response wrong",
        "  means over the updates: zero_std_frac 0.5, entropy 0.2, grad_norm 2"]
    assert key[6:] == [
        "lr 2e-5 (learning rate 2e-05): held-out accuracy 0.200 at update 2, 0.100 at update 4",
        "  reward/mean by update: 1: 0.5, 2: 1, 3: 0, 4: 0",
        "  zero_std_frac 1.0 (every group alike) first at update 2, where grad_norm is 0",
        "  every response wrong (zero_std_frac 1.0 and reward/mean 0) in updates 3, 4",
        "  means over the updates: zero_std_frac 0.875, entropy 0.1, grad_norm 0.5"]


def test_the_kl_key_sets_beta_times_kl_ref_beside_the_policy_loss(tmp_path):
    from exercises.labs import BY_NAME
    (plain, _, _), (penalised, _, _) = BY_NAME["kl"].runs
    fabricate(tmp_path, plain, [{"reward/mean": 0.5, "entropy": 0.1}, {"reward/mean": 0.25,
                                                                       "entropy": 0.3}],
              {2: 0.24}, args={"beta": 0.0})
    fabricate(tmp_path, penalised, [
        {"reward/mean": 0.5, "entropy": 0.2, "kl_ref": 0.0, "pg_loss": -0.02},
        {"reward/mean": 0.0, "entropy": 0.1, "kl_ref": 0.1, "pg_loss": 0.04}], {2: 0.23},
        args={"beta": 0.5})
    assert lab_key("kl", tmp_path)[1:] == [
        "lr 2e-5 (beta 0.0): held-out accuracy 0.240 at update 2",
        "  reward/mean in its last update (2): 0.25; entropy mean 0.2",
        "  no kl_ref: without a KL penalty no reference model is loaded",
        "lr 2e-5, beta 0.5 (beta 0.5): held-out accuracy 0.230 at update 2",
        "  reward/mean in its last update (2): 0; entropy mean 0.15",
        "  kl_ref (k3, per token) by update: 1: 0, 2: 0.1",
        "  beta x kl_ref by update: 1: 0, 2: 0.05",
        "  pg_loss by update: 1: -0.02, 2: 0.04",
        "  beta x kl_ref from 0 to 0.05; pg_loss from -0.02 to 0.04"]


def test_the_std_key_counts_the_clipped_updates_and_the_largest_advantage(tmp_path):
    from exercises.labs import BY_NAME
    (grpo, _, _), (dr_grpo, _, _) = BY_NAME["std"].runs
    row = {"reward/mean": 0.5, "zero_std_frac": 0.5, "response_len/mean": 20.0}
    fabricate(tmp_path, grpo, [{**row, "grad_norm": 2.0}, {**row, "grad_norm": 0.5},
                               {**row, "grad_norm": 3.5}], {3: 0.4},
              [{"step": 1, "advantage": 2.47}, {"step": 1, "advantage": -0.35}],
              args={"loss_type": "grpo", "max_grad_norm": 1.0})
    fabricate(tmp_path, dr_grpo, [{**row, "grad_norm": 0.25}, {**row, "grad_norm": 0.5},
                                  {**row, "grad_norm": 0.75}], {3: 0.41},
              [{"step": 1, "advantage": -0.875}, {"step": 1, "advantage": 0.125}],
              args={"loss_type": "dr_grpo", "max_grad_norm": 1.0})
    key = lab_key("std", tmp_path)
    assert key[2] == "  grad_norm mean 2, from 0.5 at update 2 to 3.5 at update 3"
    assert key[3] == "  grad_norm above --max_grad_norm 1.0 (clipped) in 2 of 3 updates"
    assert key[4].endswith("largest |advantage| in samples.jsonl 2.47")
    assert key[5:] == [
        "dr_grpo (no std, token sum) (--loss_type dr_grpo): held-out accuracy 0.410 at update 3",
        "  grad_norm mean 0.5, from 0.25 at update 1 to 0.75 at update 3",
        "  grad_norm above --max_grad_norm 1.0 (clipped) in 0 of 3 updates",
        "  means over the updates: zero_std_frac 0.5, reward/mean 0.5, response_len/mean 20; "
        "largest |advantage| in samples.jsonl 0.875"]


def test_the_length_key_says_how_long_the_two_losses_agree(tmp_path):
    from exercises.labs import BY_NAME
    (grpo, _, _), (bnpo, _, _) = BY_NAME["length"].runs
    fabricate(tmp_path, grpo, [{"response_len/mean": n, "pg_loss": p, "truncated_frac": 0.0}
                               for n, p in ((21, 0.0101), (25, -0.02), (23, 0.03))],
              args={"loss_type": "grpo"})
    fabricate(tmp_path, bnpo, [{"response_len/mean": n, "pg_loss": p, "truncated_frac": 0.0}
                               for n, p in ((21, 0.0103), (25, -0.0202), (23, 0.02))],
              args={"loss_type": "bnpo"})
    key = lab_key("length", tmp_path)
    assert key[2] == "  response_len/mean mean 23, from 21 at update 1 to 25 at update 2"
    assert key[4] == "  pg_loss by update: 1: 0.01, 2: -0.02, 3: 0.03"
    assert key[-1] == "pg_loss of the two runs agrees to 3 decimals in the first 2 of 3 updates"


def test_the_loose_key_counts_the_responses_paid_for_a_wrong_answer(tmp_path):
    from exercises.labs import BY_NAME
    (base, _, _), (loose, _, _) = BY_NAME["loose"].runs
    right = {"step": 1, "question": "What is 2 + 3?", "answer": "5",
             "response": "2 + 3 = 5.\nThe answer is 5.", "reward": 1.0}
    restated = {"step": 2, "question": "What is 81 + 52 - 52?", "answer": "81",
                "response": "81 + 52 = 133.\nThe answer is 133.", "reward": 1.0}
    fabricate(tmp_path, base, [{"reward/mean": 0.5}] * 2, {2: 0.39}, [right], {})
    fabricate(tmp_path, loose, [{"reward/mean": 0.5, "rewards/verifier/mean": 0.5},
                                {"reward/mean": 0.625, "rewards/verifier/mean": 0.40625}],
              {2: 0.4}, [right, restated, {**restated, "reward": 0.0}],
              {"num_prompts": 4, "num_generations": 8, "dataset_name": "arithmetic"})
    assert lab_key("loose", tmp_path)[1:] == [
        "grpo.py defaults: held-out accuracy 0.390 at update 2; numbers per response 4",
        "paid by a loose verifier: held-out accuracy 0.400 at update 2; numbers per response 4",
        "  update 1: the loose verifier paid 0.5, the real one 0.5: 0 of 32 responses paid more "
        "than right",
        "  update 2: the loose verifier paid 0.625, the real one 0.406: 7 of 32 responses paid "
        "more than right",
        "  the two agree in 1 of 2 updates",
        "  in samples.jsonl (3 responses logged): 1 paid for a wrong answer (by update, 2: 1)",
        "  for instance, update 2: 'What is 81 + 52 - 52?' (gold 81) answered "
        "'81 + 52 = 133.\\nThe answer is 133.', paid 1.0"]


def test_the_bf16_key_says_how_many_times_the_mismatch_grows(tmp_path):
    from exercises.labs import BY_NAME
    (fp32, _, _), (bf16, _, _) = BY_NAME["bf16"].runs
    fabricate(tmp_path, fp32, [{"mismatch/abs": 5e-7, "mismatch/kl": 7.5e-12, "clipfrac": 0.0,
                                "approx_kl": 0.0, "time/rollout_s": 10.0, "time/update_s": 2.5}])
    fabricate(tmp_path, bf16, [{"mismatch/abs": 1.25e-3, "mismatch/kl": 4.2e-5, "clipfrac": 0.0,
                                "approx_kl": 0.0, "time/rollout_s": 100.0, "time/update_s": 29.5}])
    assert lab_key("bf16", tmp_path)[1:] == [
        "fp32: mismatch/abs 5e-07, mismatch/kl 7.5e-12, clipfrac 0, approx_kl 0, rollout and "
        "update 12.5 s",
        "bf16: mismatch/abs 0.0013, mismatch/kl 4.2e-05, clipfrac 0, approx_kl 0, rollout and "
        "update 130 s",
        "mismatch/abs of bf16 is 2,500 times that of fp32"]


def test_a_variant_of_a_lab_has_runs_of_its_own(tmp_path):
    from exercises.labs import variant_dir
    assert variant_dir(tmp_path, []) == tmp_path
    assert variant_dir(tmp_path, ["--seed", "1"]) == tmp_path / "seed-1"
    assert variant_dir(tmp_path, ["--beta", "0.1", "--learning_rate", "1e-5"]) == (
        tmp_path / "beta-0.1-learning-rate-1e-5")


def test_key_reads_the_runs_and_writes_the_key_beside_the_table(tmp_path, capsys, monkeypatch):
    from exercises import labs
    variant = tmp_path / "seed-1"
    for label, _, _ in labs.BY_NAME["bf16"].runs:
        fabricate(variant, label, [{"mismatch/abs": 1e-6, "clipfrac": 0.0}])
    # the runs are there: run_all would find them finished; no training in a test
    monkeypatch.setattr(labs, "run_all", lambda out, runs, extra: None)
    monkeypatch.setattr(labs, "summary", lambda lab, out: "(table)\n")
    labs.main(["bf16", "--key", "--out", str(tmp_path), "--", "--seed", "1"])
    printed = capsys.readouterr().out
    assert f"answer key of lab bf16, from {variant}:" in printed
    assert "mismatch/abs of bf16 is 1 times that of fp32" in printed
    assert (variant / "bf16-key.txt").read_text() in printed


# ---- PS4: find the bug (exercises/bug.py) -------------------------------------------------------
@pytest.fixture
def copies(tmp_path, monkeypatch):
    """exercises.bug with its copies and runs under tmp_path: a test never writes in the tree."""
    from exercises import bug
    monkeypatch.setattr(bug, "COPIES", tmp_path / "bugs")
    monkeypatch.setattr(bug, "RUNS", tmp_path / "runs")
    return bug


def test_ps4_has_a_bug_in_each_algorithm_file(copies):
    from dev.algorithms import ALGORITHMS
    ids = [e.id for e in copies.EXERCISES]
    assert ids == [f"4.{k}" for k in range(1, len(ids) + 1)]
    assert {e.path for e in copies.EXERCISES} == {f"{a}.py" for a in ALGORITHMS}


def test_each_bug_is_one_place_of_its_file_and_the_copy_differs_only_there(copies, capsys):
    from dev.planted_bugs import BUGS
    for ex in copies.EXERCISES:
        path, right, wrong, _ = BUGS[ex.bug]
        real = (ROOT / path).read_text()
        assert real.count(right) == 1 and wrong not in real, ex.id
        assert copies.main([ex.id]) == 0
        assert capsys.readouterr().out.startswith(
            f"PS{ex.id}: {os.path.relpath(ex.copy)} is {path} with one bug in it\n")
        copy, at = ex.copy.read_text(), real.index(right)
        after = real[at + len(right):]
        assert copy[:at] == real[:at] and copy.endswith(after), ex.id
        assert copy[at:len(copy) - len(after)] == wrong, ex.id


def test_the_list_says_each_symptom_without_naming_the_bug(copies, capsys):
    assert copies.main([]) == 0
    out = capsys.readouterr().out
    for ex in copies.EXERCISES:
        assert f"PS{ex.id} in {ex.path}: {ex.symptom[:40]}" in out
        assert ex.bug not in out and ex.hint[:40] not in out
    assert copies.main(["4.6", "--hint"]) == 0
    assert capsys.readouterr().out == f"PS4.6 hint: {copies.BY_ID['4.6'].hint}\n"


def test_an_edited_copy_is_kept_until_fresh(copies, capsys):
    ex = copies.BY_ID["4.3"]
    assert copies.main(["4.3"]) == 0
    ex.copy.write_text("# my fix\n")
    assert copies.main(["4.3"]) == 0 and ex.copy.read_text() == "# my fix\n"
    assert "is already there with your edits: kept (--fresh writes the buggy copy again)" in \
        capsys.readouterr().out
    assert copies.main(["4.3", "--fresh"]) == 0 and ex.copy.read_text() == ex.buggy_text()


def test_ps4_errors_are_one_line_naming_the_fix(copies, capsys):
    no_copy = ("no copy of PS4.7 yet: python -m exercises.bug 4.7 writes "
               + os.path.relpath(copies.BY_ID["4.7"].copy))
    for argv, said in [
            (["4.99"], ("no exercise 4.99; the exercises are 4.1, 4.2, 4.3, 4.4, 4.5, 4.6, "
                        "4.7, 4.8, 4.9, 4.10, 4.11, 4.12, 4.13, 4.14, 4.15, 4.16")),
            (["4.7", "--check"], no_copy),
            (["4.7", "--run", "--", "--max_steps", "1"], no_copy),
            (["4.7", "--max_steps", "1"], "--max_steps 1: a file's flags go after --run --"),
            (["4.7", "--run", "--check"], ("argument --check: not allowed with argument --run "
                                           "(python -m exercises.bug --help)"))]:
        assert copies.main(argv) == 2, argv
        assert capsys.readouterr().err == f"error: {said}\n"


def test_run_executes_the_copy_as_the_file_with_the_root_on_the_path(copies, capsys, monkeypatch):
    # the copy, marked so that its own run shows, prints the file's --help: it ran as __main__
    # (the file's name in the usage) and found common/ (its imports)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    ex = copies.BY_ID["4.7"]
    copies.main(["4.7"])
    ex.copy.write_text('print("the copy runs")\n' + ex.copy.read_text())
    with pytest.raises(SystemExit) as done:
        copies.main(["4.7", "--run", "--", "--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and "the copy runs\nusage: tppo.py" in out
    # a run folder of its own each time, unless the student names one
    (copies.RUNS / "4.7" / "run-1").mkdir(parents=True)
    assert copies.run_flags(ex, ["--max_steps", "1"])[-2:] == [
        "--output_dir", os.path.relpath(copies.RUNS / "4.7" / "run-2")]
    assert copies.run_flags(ex, ["--output-dir=mine"]) == ["--output-dir=mine"]


@pytest.mark.slow  # the second tier: a copy of the tree
def test_check_fails_on_the_buggy_copy_and_passes_on_the_real_files_text(copies, capsys):
    # PS4.7, whose aimed test is pure tensors: --check copies the tree, puts the copy in place of
    # tppo.py and runs the test; the working tree is left as it was
    ex, real = copies.BY_ID["4.7"], (ROOT / "tppo.py").read_text()
    copies.main(["4.7"])
    assert copies.main(["4.7", "--check"]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"PS4.7: not fixed yet: {ex.test} fails: assert 2.0 == 4.0")
    ex.copy.write_text(real)
    assert copies.main(["4.7", "--check"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"PS4.7: fixed: {ex.test} passes"
    assert (ROOT / "tppo.py").read_text() == real


@pytest.mark.parametrize("file,text,said", [
    ("metrics.jsonl", '{"step": 1, "reward/me\n{"step": 2}\n', "line 1: not JSON"),
    ("metrics.jsonl", '{"reward/mean": 0.5}\n', "line 1: no 'step', where a number is"),
    ("metrics.jsonl", '[1, 2]\n', "line 1: a JSON list, where an object is expected"),
    ("metrics.jsonl", '{"step": "1"}\n', "line 1: '1' as its 'step', where a number is"),
    ("samples.jsonl", b'\x80\xff{"step": 1}\n', "byte 0 is not text (binary bytes in a log)"),
    ("samples.jsonl", '{"step": 1, "response": 7}\n', "7 as its 'response', where text is"),
    ("eval.jsonl", '{"step": 2, "eval/accuracy": "0.3"}\n', "'0.3' as its 'eval/accuracy'"),
    ("args.json", '["learning_rate"]', "a JSON list, where an object is expected"),
    ("args.json", '{"learning_rate": "5e-6"}', "'5e-6' as its 'learning_rate', where a number"),
    ("run.json", '{"returncode": 0, "wall', "not JSON"),
    ("run.json", '{"returncode": 0}', "no 'wall_s', where a number is expected"),
])
def test_a_damaged_run_file_is_one_line_naming_the_file_and_what_it_lacks(tmp_path, capsys, file,
                                                                          text, said):
    import json

    from exercises import labs
    for label, _, _ in labs.BY_NAME["lr"].runs:
        fabricate(tmp_path, label, [{"reward/mean": 0.5, "zero_std_frac": 0.5}] * 2, {2: 0.3},
                  [{"step": 1, "response": "5", "answer": "5", "reward": 1.0}],
                  args={"learning_rate": 5e-6})
        (labs.run_dir(tmp_path, label) / "run.json").write_text(json.dumps(
            {"returncode": 0, "wall_s": 60.0}))
    damaged = labs.run_dir(tmp_path, labs.BY_NAME["lr"].runs[1][0]) / file
    damaged.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(SystemExit) as stopped:
        labs.main(["lr", "--key", "--out", str(tmp_path)])
    message = str(stopped.value.code)
    assert message.startswith(f"error: {damaged}") and said in message, message
    assert message.endswith("remove that run's folder and run the lab again to make it afresh")
    assert "\n" not in message


def test_a_last_line_cut_by_a_crash_is_skipped_as_the_runs_skip_it(tmp_path):
    from exercises import labs
    (base, _, _), _ = labs.BY_NAME["lr"].runs
    fabricate(tmp_path, base, [{"reward/mean": 0.25}] * 2, {2: 0.3})
    with open(labs.run_dir(tmp_path, base) / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "reward/me')
    assert [r["step"] for r in labs.read_run(tmp_path, base).metrics] == [1, 2]
