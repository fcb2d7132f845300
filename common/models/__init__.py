"""The models: the policy, how it is loaded and spread over processes, and how it samples. Loading
(a hub id, a local folder, the embedded SmolLM2, the tiny random model), the policy to train and its
frozen reference, critics; LoRA and FSDP2; the sampler (`generate`, one decode loop, and its plain
`Decoder`), the training forward's token log-probs (`token_logprobs`), and stepwise episodes played
line by line. The speedups sit
in models/fast/, each giving the plain sampler's tokens: `fast_decoding` switches them on around
`generate` (--plain switches them off).

Above env, below rl and run. This face names what an algorithm file may import; the modules read
in this order:

    hf, sharding                  transformers' models; LoRA, FSDP2
    offload                       --offload_optimizer: the optimizer's step on the CPU
    templates                     --chat_template_kwargs, read and checked; the tools a
                                  chat template shows, and its answer to a call
    sampler                       prompts to ids, `generate`, `Decoder`, the seeded draw, Rollout
    fast/                         the same samples and log-probs, faster (fast/decoding.py first)
    logprobs                      token_logprobs: one forward, the one-token shift, log-softmax,
                                  gather, entropy
    loading, stepwise             models from names and options, critics; lines sampled, the PRM
"""

from common.models.fast.decoding import fast_decoding
from common.models.fast.graphs import capture_decoding
from common.models.hf import backbone_and_head
from common.models.logprobs import batched_token_logprobs, logprobs_from_logits, token_logprobs
from common.models.loading import (check_model_name, check_teacher, critic_state, load_policy,
                                   load_reference, load_tokenizer, make_critic, max_positions,
                                   reference_policy, trained_policy)
from common.models.sampler import (Decoder, Generation, Rollout, ThinkingBudget, encode_prompts,
                                   eos_token_ids, generate, left_pad, read_reasoning, right_pad)
from common.models.sharding import full_state_dict, unsharded
from common.models.templates import offer_tools, read_template_kwargs, tool_message
from common.models.stepwise import (Episodes, ProcessRewardModel, load_prm_tokenizer, play_episodes,
                                    play_segment, policy_sampler, single_token_id,
                                    trim_left_padding)

__all__ = ["Decoder", "Episodes", "Generation", "ProcessRewardModel", "Rollout", "ThinkingBudget",
           "backbone_and_head", "batched_token_logprobs", "capture_decoding", "check_model_name",
           "check_teacher", "critic_state", "encode_prompts", "eos_token_ids", "fast_decoding",
           "full_state_dict", "generate", "left_pad", "load_policy", "load_prm_tokenizer",
           "load_reference", "load_tokenizer", "logprobs_from_logits", "make_critic",
           "max_positions", "offer_tools", "play_episodes", "play_segment", "policy_sampler",
           "read_reasoning", "read_template_kwargs", "reference_policy", "right_pad",
           "single_token_id", "token_logprobs", "tool_message", "trained_policy",
           "trim_left_padding", "unsharded"]
