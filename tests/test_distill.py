"""distill.py: the per-token advantages and the divergences against hand-worked values, a teacher
equal to the student giving a loss and gradient of exactly 0, the full-vocabulary loss and gradient
against TRL 1.16's DistillationTrainer on a fixed batch, the option errors, and a run in which the
sampled reverse KL to a teacher falls."""

import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import distill
import warm  # tests/warm.py: `python X.py` runs forked from a warm process
from trl_steps import a_batch, moved_policy

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--model_name_or_path", "tiny-random", "--max_new_tokens", "8", "--num_eval_problems", "4",
        "--num_prompts", "4", "--num_generations", "2", "--micro_batch_size", "4"]


def run(cmd, **kw):
    return warm.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, **kw)


def metrics(path):
    return [json.loads(x) for x in (Path(path) / "metrics.jsonl").read_text().splitlines()]


# ---- advantages and divergences by hand ---------------------------------------------------------
def test_the_sampled_form_s_advantage_is_minus_the_log_ratio_to_the_teacher_plus_the_verifier_s():
    old = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -0.1, 0.0]])
    teacher = torch.tensor([[-0.5, -4.0, -0.5], [-1.0, -2.0, 0.0]])
    reward_advantages = torch.tensor([0.25, -0.5])
    sampled = distill.distill_advantages(old, teacher, reward_advantages, "sampled")
    # token (0, 0): the teacher likes it more (-0.5 > -1): +0.5, and the row's +0.25
    torch.testing.assert_close(sampled, torch.tensor([[0.75, -1.75, 0.25], [1.5, -2.4, -0.5]]))
    # the full form leaves only the verifier's share: its divergence is the loss itself
    full = distill.distill_advantages(old, teacher, reward_advantages, "full")
    assert full.tolist() == [[0.25] * 3, [-0.5] * 3]


def test_the_sampled_form_s_gradient_is_the_reverse_kl_s_in_expectation():
    # one position, a vocabulary of 6: the loss of every word as a one-token response, weighted by
    # the student's probability of sampling it, is the sampled loss's expectation; its gradient must
    # be that of KL(student || teacher), exactly (the discount-0 per-token policy gradient)
    theta = torch.tensor([0.5, -1.0, 2.0, 0.0, 0.3, -0.7], requires_grad=True)
    teacher_logits = torch.tensor([1.0, 0.0, -1.0, 2.0, 0.0, 0.5])
    logp = F.log_softmax(theta, -1)[:, None]  # [V, 1]: word y as a response of one token
    teacher = F.log_softmax(teacher_logits, -1)[:, None]
    advantages = distill.distill_advantages(logp.detach(), teacher, torch.zeros(6), "sampled")
    weights = logp.detach().exp()  # E over y ~ pi: the mask's weights, a normaliser of 1
    loss, _ = distill.policy_loss(logp, logp.detach(), advantages, weights, 1.0, distill.Args())
    (sampled,) = torch.autograd.grad(loss, theta)
    log_p = F.log_softmax(theta, -1)
    (exact,) = torch.autograd.grad((log_p.exp() * (log_p - teacher[:, 0])).sum(), theta)
    torch.testing.assert_close(sampled, exact)
    assert exact.norm() > 0.1


def test_the_divergences_of_two_three_word_distributions_by_hand():
    p, t = torch.tensor([0.5, 0.25, 0.25]), torch.tensor([0.25, 0.25, 0.5])
    s_logits, t_logits = p.log()[None], t.log()[None]
    # KL(p || t) = 0.5 ln 2 + 0 + 0.25 ln 0.5 = 0.25 ln 2; KL(t || p) the same by symmetry here
    assert distill.divergence(s_logits, t_logits, 1.0).item() == pytest.approx(0.25 * math.log(2))
    assert distill.divergence(s_logits, t_logits, 0.0).item() == pytest.approx(0.25 * math.log(2))
    # beta 0.5: m = (0.375, 0.25, 0.375); JSD = 0.5 KL(t || m) + 0.5 KL(p || m)
    kl_tm = 0.25 * math.log(0.25 / 0.375) + 0 + 0.5 * math.log(0.5 / 0.375)
    kl_pm = 0.5 * math.log(0.5 / 0.375) + 0 + 0.25 * math.log(0.25 / 0.375)
    jsd = 0.5 * kl_tm + 0.5 * kl_pm  # 0.0425
    assert distill.divergence(s_logits, t_logits, 0.5).item() == pytest.approx(jsd)
    # beta 0.2: m = 0.2 t + 0.8 p, weighted 0.2 and 0.8
    p, t = p.double(), t.double()
    m = 0.2 * t + 0.8 * p
    want = 0.2 * (t * (t / m).log()).sum() + 0.8 * (p * (p / m).log()).sum()
    got = distill.divergence(s_logits, t_logits, 0.2).item()
    assert got == pytest.approx(want.item(), rel=1e-5)
    # logits, not probabilities: a shift of the logits changes nothing
    shifted = distill.divergence(s_logits + 3, t_logits - 1, 1.0).item()
    assert shifted == pytest.approx(0.25 * math.log(2))


def test_the_chunked_divergence_equals_one_pass_and_so_does_its_gradient():
    torch.manual_seed(0)
    head_s, head_t = torch.nn.Linear(8, 50, bias=False), torch.nn.Linear(8, 50, bias=False)
    h_s, h_t = torch.randn(5, 3, 8, requires_grad=True), torch.randn(5, 3, 8)
    for beta in (1.0, 0.0, 0.3):
        whole = distill.divergence(head_s(h_s) / 0.7, head_t(h_t) / 0.7, beta)  # [5, 3]
        (g_whole,) = torch.autograd.grad(whole.sum(), h_s)
        chunked = distill.full_divergence(h_s, h_t, head_s, head_t, beta, 0.7, chunk_rows=2)
        (g_chunked,) = torch.autograd.grad(chunked.sum(), h_s)
        torch.testing.assert_close(chunked, whole)
        torch.testing.assert_close(g_chunked, g_whole)


def test_the_loss_is_a_token_mean_of_the_clipped_term_and_the_divergence():
    logprobs = torch.tensor([[-1.0, -2.0], [-0.5, 0.0]], requires_grad=True)
    advantages = torch.tensor([[1.0, -2.0], [0.5, 0.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    args = distill.Args()
    loss, stats = distill.policy_loss(logprobs, logprobs.detach(), advantages, mask, 3.0, args)
    # ratio 1: -(1 - 2 + 0.5) / 3 tokens
    assert loss.item() == pytest.approx(0.5 / 3) and stats["clipfrac"] == 0
    loss.backward()  # d/d log pi = -A / 3 on the counted tokens
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-1 / 3, 2 / 3], [-0.5 / 3, 0.0]]))
    div = torch.tensor([[0.3, 0.6], [0.9, 5.0]])  # 5.0: padding, not counted
    loss, stats = distill.policy_loss(logprobs, logprobs.detach(), torch.zeros(2, 2), mask, 3.0,
                                      args, div)
    assert loss.item() == pytest.approx(1.8 / 3) and stats["divergence"] == pytest.approx(0.6)


# ---- the tiny model ---------------------------------------------------------------------------
def _loss_and_grad(policy, teacher, batch, args):
    """distill.py's update on `batch`, one micro-batch: (loss, {name: grad})."""
    from common.models.hf import backbone_and_head
    from common.models.logprobs import token_logprobs

    gen = batch.gen()
    input_ids, attention_mask = gen.sequences()
    R = gen.response_mask.shape[1]
    full = args.loss_form == "full"
    norm = distill.loss_normaliser(gen.response_mask, args, 1)
    with torch.no_grad():
        t_logprobs, _, *t_hidden = token_logprobs(teacher, input_ids, attention_mask, R,
                                                  args.temperature, return_hidden=full)
    logprobs, _, *hidden = token_logprobs(policy, input_ids, attention_mask, R, args.temperature,
                                          return_hidden=full)
    divergences = None
    if full:
        divergences = distill.full_divergence(hidden[0][:, -R - 1:-1], t_hidden[0][:, -R - 1:-1],
                                              backbone_and_head(policy)[1],
                                              backbone_and_head(teacher)[1], args.jsd_beta,
                                              args.temperature)
    advantages = distill.distill_advantages(logprobs.detach(), t_logprobs,
                                            torch.zeros(len(logprobs)), args.loss_form)
    loss, stats = distill.policy_loss(logprobs, logprobs.detach(), advantages, gen.response_mask,
                                      norm, args, divergences)
    policy.zero_grad()
    loss.backward()
    return loss, {n: p.grad.clone() for n, p in policy.named_parameters()}, stats


@pytest.mark.parametrize("loss_form,beta", [("sampled", 1.0), ("full", 1.0), ("full", 0.5)])
def test_a_teacher_equal_to_the_student_gives_a_loss_and_gradient_of_0(loss_form, beta):
    from common.models.loading import load_policy

    args = replace(distill.Args(), loss_form=loss_form, jsd_beta=beta, temperature=0.7)
    loss, grads, _ = _loss_and_grad(load_policy("tiny-random"), load_policy("tiny-random"),
                                        a_batch(), args)
    norm = torch.stack([g.norm() for g in grads.values()]).norm().item()
    # a teacher that differs (the moved copy of the GRPO tests) gives both
    moved_loss, moved_grads, _ = _loss_and_grad(load_policy("tiny-random"), moved_policy(),
                                                a_batch(), args)
    moved_norm = torch.stack([g.norm() for g in moved_grads.values()]).norm().item()
    assert abs(moved_loss.item()) > 1e-3 and moved_norm > 1e-2
    if loss_form == "sampled":  # every advantage is 0 - 0: exactly
        assert loss.item() == 0 and norm == 0
    else:  # the divergence of two equal distributions is 0 up to float32 rounding (softmax's
        # probabilities sum to 1 - 1e-8, not 1): 4e-7 at beta 0.5 against a moved teacher's 0.05
        assert abs(loss.item()) < 1e-6 and norm < 1e-5 * moved_norm, (loss.item(), norm)


@pytest.mark.slow  # the second tier: TRL's code
@pytest.mark.parametrize("beta", [1.0, 0.5])
def test_the_full_form_equals_trls_distillation_trainer_on_the_same_batch(tmp_path, beta):
    # TRL 1.16's DistillationTrainer.training_step samples, then computes its chunked divergence of
    # the student's and the teacher's whole distributions at each completion position. Its sampler
    # is replaced by the batch's ids below (one response per prompt, as TRL samples), so it trains
    # on exactly what distill.py's update gets. Prompts of one length: TRL takes positions from the
    # sequence, the files from the attention mask, which agree only without left padding.
    pytest.importorskip("trl")
    from datasets import Dataset
    from trl import DistillationConfig, DistillationTrainer

    from common.models.loading import load_policy, load_tokenizer

    batch = a_batch()
    n = len(batch.prompt_ids)
    args = replace(distill.Args(), loss_form="full", jsd_beta=beta, temperature=0.7)
    # the student: the tiny model; the teacher: its moved copy, so that the two differ
    loss, grads, stats = _loss_and_grad(load_policy("tiny-random"), moved_policy(), batch, args)

    config = DistillationConfig(output_dir=str(tmp_path), beta=beta, temperature=0.7,
                                per_device_train_batch_size=n, max_completion_length=5,
                                report_to="none", use_cpu=True, bf16=False,
                                gradient_checkpointing=False)
    trainer = DistillationTrainer(model=load_policy("tiny-random"), teacher_model=moved_policy(),
                                  args=config,
                                  train_dataset=Dataset.from_dict({"prompt": ["a"] * n}),
                                  processing_class=load_tokenizer("tiny-random"))
    rows = [ids[m.bool()].tolist()
            for ids, m in zip(batch.completion_ids, batch.completion_mask)]
    trainer._tokenize_prompts = lambda prompts: (batch.prompt_ids.tolist(), None, {})
    trainer._generate_single_turn = lambda *inputs, **kw: rows
    trainer.current_gradient_accumulation_steps = 1  # what Trainer.train sets: one micro-step
    trl_loss = trainer.training_step(trainer.model, [{"prompt": "a"}] * n, None)

    assert loss.item() == pytest.approx(trl_loss.item(), rel=1e-6, abs=1e-6)
    assert stats["divergence"] == pytest.approx(trl_loss.item(), rel=1e-5)  # a mean of its own
    for (name, theirs) in trainer.model.named_parameters():
        ours = grads[name]
        assert ((ours - theirs.grad).norm() / theirs.grad.norm()).item() < 1e-5, name


def test_a_run_whose_teacher_is_the_student_measures_a_kl_of_0_and_moves_no_weight(tmp_path):
    # the whole wiring at once: the teacher must score the student's own ids, at the student's
    # temperature (0.7 here), against log-probs of the policy that sampled them
    from safetensors.torch import load_file

    from common.models.loading import load_policy

    out = run([sys.executable, "distill.py", *TINY, "--teacher_model_name_or_path", "tiny-random",
               "--temperature", "0.7", "--max_steps", "2", "--learning_rate", "1e-2",
               "--output_dir", str(tmp_path)])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for line in metrics(tmp_path):
        assert line["kl_teacher"] == 0 and line["pg_loss"] == 0 and line["grad_norm"] == 0, line
        assert line["time/teacher_s"] > 0
    weights = load_file(str(tmp_path / "checkpoint-2" / "model.safetensors"))
    start = load_policy("tiny-random").state_dict()
    assert all(torch.equal(weights[name], start[name]) for name in weights)


@pytest.mark.slow  # the second tier: torchrun
def test_torchrun_two_processes_match_one_process_and_resume_continues_exactly(tmp_path):
    # the full form, whose token mean is over every rank's tokens: one process makes 2 updates with
    # a checkpoint after each; two processes make 1, then --resume makes the 2nd (the teacher is
    # named again by args.json's option, not saved in the checkpoint)
    import socket

    from safetensors.torch import load_file

    from common.models.loading import tiny_random_model

    teacher = near_teacher(tmp_path / "teacher")
    common = ["distill.py", *TINY, "--teacher_model_name_or_path", str(teacher), "--loss_form",
              "full", "--temperature", "1.0", "--learning_rate", "1e-3", "--num_eval_problems", "0"]
    out = run([sys.executable, *common, "--max_steps", "2", "--save_interval", "1",
               "--output_dir", str(tmp_path / "one")])
    assert out.returncode == 0, out.stderr[-3000:]
    with socket.socket() as sock:  # a port no other test listens on (pytest -n 2)
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                "--master_port", port]
    for extra in (["--max_steps", "1"], ["--max_steps", "2", "--resume"]):
        out = run([*torchrun, *common, *extra, "--output_dir", str(tmp_path / "two")])
        assert out.returncode == 0, out.stderr[-3000:]
    start = tiny_random_model().state_dict()
    for k in (1, 2):
        one = load_file(str(tmp_path / f"one/checkpoint-{k}/model.safetensors"))
        two = load_file(str(tmp_path / f"two/checkpoint-{k}/model.safetensors"))
        assert max((one[n] - start[n]).abs().max().item() for n in one) > 1e-4  # it learned
        # fp32 rounding differs between 2- and 4-row batches, and Adam divides by the gradient's
        # own size: a weight whose gradient is almost 0 may move by up to lr. A wrong token mean
        # over the ranks would scale every step: fewer than 1 in 1000 weights may differ by 1e-5.
        differ = sum(((one[n] - two[n]).abs() > 1e-5).sum().item() for n in one)
        assert differ < 1e-3 * sum(one[n].numel() for n in one)
    m1, m2 = metrics(tmp_path / "one"), metrics(tmp_path / "two")
    assert [m["step"] for m in m2] == [1, 2]
    assert [m["reward/mean"] for m in m1] == pytest.approx([m["reward/mean"] for m in m2])


# ---- option errors ----------------------------------------------------------------------------
@pytest.mark.parametrize("flags,words", [
    ([], "distill.py needs a teacher: --teacher_model_name_or_path"),
    (["--teacher_model_name_or_path", "/no/such/teacher"], "--teacher_model_name_or_path "
                                                           "'/no/such/teacher': no such folder"),
    (["--teacher_model_name_or_path", "tiny-random", "--jsd_beta", "1.5"],
     "--jsd_beta 1.5: must be in [0, 1]"),
    (["--teacher_model_name_or_path", "tiny-random", "--reward_weight", "1",
      "--num_generations", "1"], "--reward_weight adds the verifier's group advantage"),
])
def test_a_bad_teacher_option_is_one_line_before_any_model_loads(tmp_path, flags, words):
    out = run([sys.executable, "distill.py", *TINY, "--output_dir", str(tmp_path), *flags])
    assert out.returncode != 0 and words in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


# ---- learning ---------------------------------------------------------------------------------
def near_teacher(path):
    """A teacher near the tiny student: its weights moved by noise of s.d. 0.02, about their own
    size. At temperature 0.1 the student's distribution starts 1.3-1.8 nats (sampled reverse KL)
    away from it. A teacher of unrelated random weights is hundreds of words away from a student
    that holds its mass on a few of 49k: 256 sampled tokens an update find nothing to move to (the
    full form still learned from it; the sampled did not, in 30 updates). Its output layer has 64
    rows more than the student's, as a 7B teacher of the 0.5B student's family pads its own further
    (the full form stopped on them with a traceback at update 1)."""
    from common.models.loading import load_tokenizer

    teacher = moved_policy(0.02)
    teacher.resize_token_embeddings(teacher.config.vocab_size + 64)
    teacher.save_pretrained(path)
    load_tokenizer("tiny-random").save_pretrained(path)
    return path


@pytest.mark.slow  # the second tier: a learning run
@pytest.mark.parametrize("loss_form,updates", [("sampled", 30), ("full", 10)])
def test_the_sampled_reverse_kl_to_a_teacher_falls(tmp_path, loss_form, updates):
    # measured, kl_teacher at update 1 and the mean of the last 5 updates: at seed 0 1.42 and 0.19
    # (sampled, 30 updates), 1.42 and 0.24 (full, 10 updates: it is at 0.14 by update 4); at seed 1
    # (sampled) 1.25 and 0.38. The full form learns from every word's probability, the sampled one
    # from the 256 words drawn an update.
    teacher = near_teacher(tmp_path / "teacher")
    out = run([sys.executable, "distill.py", "--model_name_or_path", "tiny-random",
               "--teacher_model_name_or_path", str(teacher), "--loss_form", loss_form,
               "--num_prompts", "8", "--num_generations", "4", "--micro_batch_size", "16",
               "--max_new_tokens", "8", "--temperature", "0.1", "--learning_rate", "3e-3",
               "--max_steps", str(updates), "--num_eval_problems", "0", "--no_eval_on_start",
               "--output_dir", str(tmp_path / "run")])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    kl = [m["kl_teacher"] for m in metrics(tmp_path / "run")]
    assert kl[0] > 1.0 and sum(kl[-5:]) / 5 < 0.4 * kl[0], kl
