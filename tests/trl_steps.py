"""One training step of a TRL 1.16 trainer (GRPOTrainer, RLOOTrainer) on a fixed batch, for the
tests that compare a file's loss and gradient with TRL's own code: the trainer's tokenizer and
sampler are replaced by the batch's ids and its reward function returns the batch's scores, so it
computes its advantages, its reference log-probs and its loss on exactly what the file's update
gets. Both sides start from the same weights (`moved_policy`) and the same reference (tiny-random).
"""

from dataclasses import dataclass

import torch

from common.models.loading import load_policy, load_tokenizer
from common.models.sampler import Generation


def moved_policy(scale=0.05):
    """tiny-random after some training: its weights moved from the reference's by noise of s.d.
    `scale`, the same way for both sides, so that the KL to the reference is not 0."""
    model = load_policy("tiny-random")
    with torch.no_grad():
        for k, p in enumerate(model.parameters()):
            p.add_(scale * torch.randn(p.shape, generator=torch.Generator().manual_seed(k)))
    return model


@dataclass
class Batch:
    prompt_ids: torch.Tensor  # [N, P], consecutive rows share a prompt
    completion_ids: torch.Tensor  # [N, R], right-padded
    completion_mask: torch.Tensor  # [N, R]
    scores: torch.Tensor  # [N]
    group_size: int

    def gen(self, logprobs=None):
        """As a Generation (no left padding; `logprobs`: the sampler's, default 0)."""
        n, R = self.completion_ids.shape
        return Generation(prompt_ids=self.prompt_ids, prompt_mask=torch.ones_like(self.prompt_ids),
                          response_ids=self.completion_ids, response_mask=self.completion_mask,
                          logprobs=torch.zeros(n, R) if logprobs is None else logprobs,
                          finished=torch.zeros(n, dtype=torch.bool),
                          truncated=torch.ones(n, dtype=torch.bool))


def a_batch():
    """Two prompts of one length (TRL takes positions from the sequence, the files from the mask:
    the same without left padding) x 4 responses of uneven lengths, no EOS; rewards with a spread
    in group 0 and one odd response out in group 1."""
    g = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(10, 400, (2, 6), generator=g).repeat_interleave(4, 0)  # [8, 6]
    completion_ids = torch.randint(10, 400, (8, 5), generator=g)
    completion_mask = torch.ones(8, 5, dtype=torch.long)
    for j, n in enumerate((5, 3, 4, 2, 5, 1, 4, 3)):
        completion_mask[j, n:] = 0
        completion_ids[j, n:] = 0  # tiny-random's pad
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0])
    return Batch(prompt_ids, completion_ids, completion_mask, scores, group_size=4)


def trl_training_step(trainer_class, config_class, tmp_path, batch, beta, **config):
    """`trainer_class`.training_step on `batch` from `moved_policy`'s weights.
    -> (TRL's loss, its model, whose .grad hold the gradient, and its advantages [N] in the
    batch's row order)"""
    from datasets import Dataset
    from trl.trainer import add_fused_lm_head

    n, R = batch.completion_ids.shape
    args = config_class(output_dir=str(tmp_path), beta=0.0, report_to="none", use_cpu=True,
                        bf16=False, gradient_checkpointing=False, per_device_train_batch_size=n,
                        num_generations=batch.group_size, max_completion_length=R, **config)
    trainer = trainer_class(model=moved_policy(), args=args,
                            reward_funcs=[lambda completions, **kw: batch.scores.tolist()],
                            train_dataset=Dataset.from_dict({"prompt": ["a"] * n}),
                            processing_class=load_tokenizer("tiny-random"))
    # a model passed as an object has no hub id for TRL to build its reference from: the
    # reference is the unmoved tiny model, given after, prepared as TRL's __init__ prepares one
    trainer.beta, trainer.ref_model = beta, load_policy("tiny-random")
    add_fused_lm_head(trainer.ref_model, temperature=args.temperature)
    rows = [ids[m.bool()].tolist() for ids, m in zip(batch.completion_ids, batch.completion_mask)]
    trainer._tokenize_prompts = lambda prompts: (batch.prompt_ids.tolist(), None, {})
    # GRPOTrainer's sampler also returns its log-probs (None: it recomputes them), RLOOTrainer's not
    sampled = (rows, None) if trainer_class.__name__ == "GRPOTrainer" else rows
    trainer._generate_single_turn = lambda *inputs: sampled
    trainer.current_gradient_accumulation_steps = 1  # what Trainer.train sets: one micro-step
    prompts = [{"prompt": str(i // batch.group_size)} for i in range(n)]  # a group per prompt
    loss = trainer.training_step(trainer.model, prompts, None)
    # the rows TRL trained on, shuffled: each found again by its completion
    inputs = trainer._buffered_inputs[0]
    order = [rows.index(ids[m.bool()].tolist())
             for ids, m in zip(inputs["completion_ids"], inputs["completion_mask"])]
    advantages = torch.zeros(n)
    advantages[order] = inputs["advantages"].reshape(n, -1)[:, 0].float()
    return loss, trainer.model, advantages


def file_step(module, batch, args):
    """A GRPO-family file's (`module`: grpo, cispo, sapo) advantages, normaliser and loss on
    `batch`, one micro-batch, as its update runs them (pi_old is the policy itself, detached: one
    epoch of one minibatch), from `moved_policy`'s weights with tiny-random as the reference.
    -> (the loss, the policy, whose .grad hold the gradient)"""
    from common.models.logprobs import batched_token_logprobs, token_logprobs

    gen, policy = batch.gen(), moved_policy()
    ref_logprobs = batched_token_logprobs(load_policy("tiny-random"), gen, args.temperature, 8)
    advantages = module.group_advantages(batch.scores, args.num_generations,
                                         scale=args.loss_type != "dr_grpo")
    mask = gen.response_mask
    norm = module.loss_normaliser(mask, args, world_size=1)
    input_ids, attention_mask = gen.sequences()
    logprobs, _ = token_logprobs(policy, input_ids, attention_mask, mask.shape[1], args.temperature)
    loss, _ = module.policy_loss(logprobs, logprobs.detach(), advantages, mask, norm, args,
                                 ref_logprobs)
    loss.backward()
    return loss, policy
