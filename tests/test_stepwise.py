"""common/models/stepwise.py's PRM read-out, and stepwise episodes side by side: common/env/stepwise.py's
StepwiseEnvs played by play_segment (carry-over, resets, EOS, rewards, resume)."""

from types import SimpleNamespace

import pytest
import torch

from common.env.math_env import make_env, problem_index
from common.env.stepwise import StepwiseEnvs
from common.models.hf import KV_CACHE
from common.models.loading import load_policy, load_tokenizer
from common.models.stepwise import (ProcessRewardModel, load_prm_tokenizer, play_segment, prm_scores,
                                    single_token_id, trim_left_padding)

TAG, GOOD, BAD, PAD = 7, 3, 4, 0


class PositionPRM(torch.nn.Module):
    """logit(good) - logit(bad) = position / 2 at every position: P(good) at position p is sigmoid(p
    / 2)."""

    def __init__(self):
        super().__init__()
        self.dummy = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, attention_mask, position_ids):
        logits = torch.zeros(*input_ids.shape, 10)
        logits[..., GOOD] = position_ids.float() / 2
        return SimpleNamespace(logits=logits)


def test_prm_score_is_read_at_the_newest_tag_only():
    rows = [[5, TAG, 6, 6, TAG, 9, 9],  # tags at positions 1 and 4, two tokens after the last one
            # left-padded by 5: its tag sits at position 1, not at column 6
            [8, TAG]]
    scores = prm_scores(PositionPRM(), rows, TAG, GOOD, BAD, PAD)
    torch.testing.assert_close(scores, torch.sigmoid(torch.tensor([4 / 2, 1 / 2])))
    with pytest.raises(ValueError, match="no step tag"):
        prm_scores(PositionPRM(), [[5, 6]], TAG, GOOD, BAD, PAD)


def test_prm_tokens_must_be_single_tokens():
    tok = load_tokenizer("tiny-random")
    assert single_token_id(tok, "+", "good token") == 27
    with pytest.raises(ValueError, match="'ки' is 2 tokens.*--prm_step_tag"):
        single_token_id(tok, "ки", "step tag")  # the embedded tokenizer splits it...
    # ...so the tiny PRM adds it, as Math-Shepherd has it
    prm_tok = load_prm_tokenizer("tiny-random", "ки")
    assert len(prm_tok.encode("ки", add_special_tokens=False)) == 1


def test_tiny_prm_input_has_one_tag_per_step_and_ends_with_it():
    prm = ProcessRewardModel("tiny-random")
    # a tag written by the policy is dropped
    text = prm.text("What is 2 + 3?", ["2 + 3 = 5 ки", "The answer is 5."])
    assert text == "What is 2 + 3?\n2 + 3 = 5 ки\nThe answer is 5. ки"  # OpenR's format
    ids = prm.tokenizer(text)["input_ids"]
    assert ids.count(prm.tag_id) == 2 and ids[-1] == prm.tag_id
    scores = prm(["What is 2 + 3?"] * 2, [["2 + 3 = 5"], ["2 + 3 = 5", "The answer is 5."]])
    assert scores.shape == (2,) and ((scores > 0) & (scores < 1)).all()


def test_trim_left_padding():
    ids = torch.tensor([[0, 0, 5, 6], [0, 7, 8, 9]])
    mask = (ids != 0).long()
    t_ids, t_mask = trim_left_padding(ids, mask)
    assert t_ids.tolist() == [[0, 5, 6], [7, 8, 9]] and t_mask.tolist() == [[0, 1, 1], [1, 1, 1]]


# ---- episodes ------------------------------------------------------------------------------------------------
class ScriptedPolicy(torch.nn.Module):
    """Emits the same token script in every row, restarting at each prefill (a new generate
    call)."""

    def __init__(self, script):
        super().__init__()
        self.script, self.dummy, self.t = script, torch.nn.Parameter(torch.zeros(1)), 0

    def forward(self, input_ids, attention_mask, position_ids, use_cache=True, logits_to_keep=0,
                **kw):
        if kw.get(KV_CACHE) is None:
            self.t = 0
        logits = torch.full((input_ids.shape[0], 1, 49152), -100.0)
        logits[:, :, self.script[min(self.t, len(self.script) - 1)]] = 100.0
        self.t += 1
        return SimpleNamespace(logits=logits, **{KV_CACHE: "cache"})


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-random")


def arithmetic(max_steps=2):
    return make_env("arithmetic", "train", seed=0, difficulty="1", num_examples=50, stepwise=True,
                    max_steps=max_steps)


def test_episodes_carry_over_segments_and_reset_after_max_steps(tok):
    env, policy = arithmetic(max_steps=2), load_policy("tiny-random")
    # global envs 2 and 3 of 4
    envs = StepwiseEnvs(env, num_envs=2, first_env=2, total_envs=4, seed=0)
    first = [e.index for e in envs.envs]
    assert first == [problem_index(2, 50, 0), problem_index(3, 50, 0)]
    seg = play_segment(envs, policy, tok, update=0, num_steps=3, max_new_tokens=3, temperature=1.0)
    # the random model never writes an answer: every episode ends at its 2nd step, then a new one
    # starts
    assert seg.dones.tolist() == [[0, 1, 0], [0, 1, 0]]
    assert seg.rewards.tolist() == [[0, 0, 0], [0, 0, 0]]  # the verifier, on wrong final answers
    # 2nd episode: + 4
    assert [e.index for e in envs.envs] == [problem_index(6, 50, 0), problem_index(7, 50, 0)]
    assert len(seg.episodes) == 2 and all(e["steps"] == 2 and not e["correct"] for e in seg.episodes)
    # rows are env-major; row k*3 + t's observation is env k's state before step t
    ids, mask = seg.gen.sequences()
    assert ids.shape[0] == 6 and seg.gen.response_mask.sum(1).tolist() == [3] * 6 and seg.gen.truncated.all()
    assert tok.decode(seg.next_obs[0]).endswith("<|im_start|>assistant\n" + envs.envs[0].steps[0] + "\n")
    # the segment's last step continues in the next update: the state holds step 1 of the 2nd
    # episode
    assert len(envs.envs[0].steps) == 1
    # resume: a fresh set of envs loaded from the state continues identically
    state = envs.state_dict()
    twin = StepwiseEnvs(env, num_envs=2, first_env=2, total_envs=4, seed=0)
    twin.load_state_dict(state)
    a = play_segment(envs, policy, tok, update=1, num_steps=2, max_new_tokens=3, temperature=1.0)
    b = play_segment(twin, policy, tok, update=1, num_steps=2, max_new_tokens=3, temperature=1.0)
    assert torch.equal(a.gen.response_ids,
                       b.gen.response_ids) and torch.equal(a.gen.prompt_ids, b.gen.prompt_ids)
    assert a.dones.tolist() == b.dones.tolist() == [[1, 0], [1, 0]]


def test_answer_ends_the_episode_and_prm_plus_outcome_reward(tok):
    env = arithmetic(max_steps=5)
    answer = env.examples[problem_index(0, 50, 0)]["answer"]
    policy = ScriptedPolicy(tok.encode(f"The answer is {answer}.\n"))
    prm = ProcessRewardModel("tiny-random")
    envs = StepwiseEnvs(env, num_envs=1, first_env=0, total_envs=1, seed=0)
    seg = play_segment(envs, policy, tok, update=0, num_steps=2, max_new_tokens=16,
                       temperature=1.0, prm=prm, outcome_reward_coef=2.0)
    assert seg.texts[0] == f"The answer is {answer}.\n" and seg.dones.tolist() == [[1, 1]]
    assert seg.episodes[0]["correct"] and seg.episodes[0]["steps"] == 1
    # step 0 answers problem 0 correctly; step 1 writes the same text for problem 1 (another answer)
    second = env.examples[problem_index(1, 50, 0)]["answer"]
    expected_prm = prm([env.examples[problem_index(0, 50, 0)]["question"]],
                       [[f"The answer is {answer}."]])
    torch.testing.assert_close(seg.prm_rewards[0, :1], expected_prm)
    correct = [1.0, float(second == answer)]
    torch.testing.assert_close(seg.rewards[0], seg.prm_rewards[0] + 2.0 * torch.tensor(correct))


def test_eos_ends_the_episode_and_grades_what_was_written(tok):
    env = arithmetic(max_steps=5)
    answer = env.examples[problem_index(0, 50, 0)]["answer"]
    policy = ScriptedPolicy(tok.encode(f"It is {answer}") + [tok.eos_token_id])
    envs = StepwiseEnvs(env, num_envs=1, first_env=0, total_envs=1, seed=0)
    seg = play_segment(envs, policy, tok, update=0, num_steps=1, max_new_tokens=16, temperature=1.0)
    # graded, but without an answer marker a right number earns nothing (data/README.md, grading
    # policy)
    assert seg.dones.tolist() == [[1]] and seg.rewards.tolist() == [[0.0]]
    assert seg.episodes[0]["response"] == f"It is {answer}" and not seg.gen.truncated.any()


def test_prm_tag_merged_by_the_tokenizer_is_a_clear_error():
    # one token alone, but ' .' is another token in context
    prm = ProcessRewardModel("tiny-random", step_tag=".")
    with pytest.raises(ValueError, match="does not end .* with the step tag's token"):
        prm(["What is 2 + 3?"], [["2 + 3 = 5"]])


def test_a_prm_that_does_not_load_offline_is_not_told_to_use_the_policy(monkeypatch):
    # The embedded SmolLM2 is no process reward model: a PRM hub id that cannot load offline gets
    # a PRM's folder or the test PRM as its fix; the policy keeps its own advice.
    import transformers

    from common.errors import PathError

    def offline(*args, **kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co'")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", offline)
    with pytest.raises(PathError) as prm:
        load_prm_tokenizer("peiyi9979/math-shepherd-mistral-7b-prm", "ки")
    assert str(prm.value).startswith("Could not load --prm_model_name_or_path "
                                     "'peiyi9979/math-shepherd-mistral-7b-prm'")
    assert "'tiny-random' (a test PRM)" in str(prm.value) and "SmolLM2" not in str(prm.value)
    with pytest.raises(PathError) as policy:
        load_tokenizer("Qwen/Qwen2.5-0.5B-Instruct")
    assert "--model_name_or_path 'Qwen/Qwen2.5-0.5B-Instruct'" in str(policy.value)
    assert "the offline default 'SmolLM2-135M-Instruct'" in str(policy.value)
