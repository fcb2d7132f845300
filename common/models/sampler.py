"""The sampler, to read top to bottom: prompts in, one response per prompt out, each token drawn
with temperature and top-p from its row's own seeded stream, until EOS, a stop string or
max_new_tokens; with the sampler's log-probs of the tokens it drew.

    prompts = encode_prompts(tokenizer, [env.prompt(i) for i in problems])   # token-id lists
    gen = generate(model, tokenizer, prompts, max_new_tokens=64, temperature=0.7, seeds=seeds)
    texts = gen.texts(tokenizer)

The algorithm files pass common.models.fast.decoding's FastDecoder: these samples, drawn faster.
"""

from dataclasses import dataclass

import torch

from common.env.reasoning import Reasoning, declared_tags
from common.models.hf import KV_CACHE, position_ids_from_mask
from common.models.sharding import unsharded
from common.models.templates import template_source


# ------------------------------------------------------------------------------------------------
# Prompts in, responses out
# ------------------------------------------------------------------------------------------------
def render_prompt(tokenizer, obs):
    """Env observation -> prompt text. A trailing assistant message is a partial answer to continue
    (stepwise mode): it is appended verbatim after the generation prompt, because chat templates
    strip or close a final message, and the step boundary (a newline) must survive exactly."""
    if isinstance(obs, str):
        return obs
    # --chat_template_kwargs (e.g. enable_thinking) and tools.py's tools, kept by load_tokenizer
    options = {**getattr(tokenizer, "chat_template_kwargs", {}), "add_generation_prompt": True}
    if obs and obs[-1]["role"] == "assistant":
        head = tokenizer.apply_chat_template(obs[:-1], tokenize=False, **options)
        return head + obs[-1]["content"]
    return tokenizer.apply_chat_template(obs, tokenize=False, **options)


def encode_prompts(tokenizer, observations):
    """List of env observations -> list of token-id lists (unpadded)."""
    ids = []
    for obs in observations:
        text = render_prompt(tokenizer, obs)
        # Chat templates already hold their special tokens; plain prompts get the tokenizer's BOS if
        # it has one.
        ids.append(tokenizer(text, add_special_tokens=isinstance(obs, str))["input_ids"])
    return ids


def read_reasoning(tokenizer, env, budget=None):
    """Tell `env` where its responses' reasoning block opens and closes, as this tokenizer's
    template puts its prompts (common/env/reasoning.py): the tokenizer's own tags, else <think> and
    </think>, whether the prompt opens the block, and the thinking budget (--max_thinking_tokens),
    which `generate` reads from `env.reasoning`. Where thinking is expected (the template or a
    prompt names the open tag, or a budget is set) the env also counts what the thinking took, in
    tokens. -> the Reasoning"""
    tags = declared_tags(tokenizer)
    prompt = render_prompt(tokenizer, env.prompt(0))
    reasoning = Reasoning(*tags, opened=Reasoning.opens_in(prompt, tags), budget=budget)
    template = template_source(tokenizer) or ""
    expected = budget is not None or tags[0] in prompt or tags[0] in template
    env.read_reasoning(reasoning, tokenizer if expected else None)
    return reasoning


def left_pad(sequences, pad_id):
    """List of id lists -> ids [B, P] and mask [B, P], padded on the left."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, s in enumerate(sequences):
        if len(s):
            ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s):] = 1
    return ids, mask


def right_pad(rows, value, dtype=torch.long):
    """Lists of unequal length -> [n, max(1, longest)] padded on the right with `value`, and the
    mask [n, max(1, longest)] of what is not padding."""
    width = max(1, max(len(r) for r in rows))
    out = torch.full((len(rows), width), value, dtype=dtype)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for k, r in enumerate(rows):
        out[k, :len(r)] = torch.tensor(r, dtype=dtype)
        mask[k, :len(r)] = 1
    return out, mask


@dataclass
class Generation:
    prompt_ids: torch.Tensor  # [B, P] left-padded
    prompt_mask: torch.Tensor  # [B, P]
    response_ids: torch.Tensor  # [B, R] right-padded with pad_id
    response_mask: torch.Tensor  # [B, R] 1 on every sampled token, the EOS/stop token included
    logprobs: torch.Tensor  # [B, R] the sampler's log-prob of each token (temperature, pre-top-p)
    finished: torch.Tensor  # [B] bool: ended with EOS or a stop string
    truncated: torch.Tensor  # [B] bool: hit max_new_tokens first
    forced: torch.Tensor = None  # [B, R] 1 where the sampler wrote the token: out of the loss

    def __post_init__(self):
        if self.forced is None:
            self.forced = torch.zeros_like(self.response_mask)

    def sequences(self):
        """[prompt ; response] ids and attention mask, [B, P + R]: the input of training
        forwards."""
        ids = torch.cat([self.prompt_ids, self.response_ids], dim=1)
        mask = torch.cat([self.prompt_mask, self.response_mask], dim=1)
        return ids, mask

    def texts(self, tokenizer):
        """Each row's response as text, special tokens (EOS) dropped."""
        return [tokenizer.decode(ids, skip_special_tokens=True) for ids in self.completion_ids()]

    def completion_ids(self):
        """Each row's sampled token ids, as lists (what TRL passes a reward function)."""
        # one copy to the host, not one per row (each would wait for the GPU)
        ids, mask = self.response_ids.tolist(), self.response_mask.tolist()
        return [[t for t, m in zip(row, keep) if m] for row, keep in zip(ids, mask)]

    def rows(self, index):
        """The rows `index` (a list or tensor of row numbers) as a Generation."""
        return Generation(*(x[index] for x in vars(self).values()))

    @staticmethod
    def cat(gens, pad_id):
        """Several Generations' rows in one: prompts padded again on the left, responses right."""
        P = max(g.prompt_ids.shape[1] for g in gens)
        R = max(g.response_ids.shape[1] for g in gens)

        def pad(x, width, left, value=0):
            extra = width - x.shape[1]
            return torch.nn.functional.pad(x, (extra, 0) if left else (0, extra), value=value)
        return Generation(
            torch.cat([pad(g.prompt_ids, P, True, pad_id) for g in gens]),
            torch.cat([pad(g.prompt_mask, P, True) for g in gens]),
            torch.cat([pad(g.response_ids, R, False, pad_id) for g in gens]),
            torch.cat([pad(g.response_mask, R, False) for g in gens]),
            torch.cat([pad(g.logprobs, R, False) for g in gens]),
            torch.cat([g.finished for g in gens]), torch.cat([g.truncated for g in gens]),
            torch.cat([pad(g.forced, R, False) for g in gens]))


@dataclass
class Rollout:
    """What a rollout gives the update: G responses to each of this rank's problems, graded;
    consecutive rows share a problem. (Stepwise episodes extend it:
    common.models.stepwise.Episodes.)"""
    gen: Generation  # [N, ...] token ids, masks and the sampler's log-probs
    texts: list  # [N] the decoded responses
    scores: torch.Tensor  # [N] the verifier's rewards
    correct: torch.Tensor  # [N] 1.0 where the answer is right
    problems: list  # [N / G] the problem of each group


# ------------------------------------------------------------------------------------------------
# The loop
# ------------------------------------------------------------------------------------------------
@torch.no_grad()
def generate(model, tokenizer, prompts, max_new_tokens, temperature=1.0, top_p=1.0, stop_strings=(),
             seeds=None, decoder=None, reasoning=None):
    """Sample one response per prompt, a token at a time, each step reading the keys and values of
    the tokens before it from a KV cache.

    prompts: token-id lists. temperature 0 is greedy. seeds: one int per prompt, the row's own
    sampling stream (None: torch's global RNG). stop_strings: e.g. ("\\n",) ends a row at a step
    boundary; the token that completes a stop string, or the EOS, is kept in the response.
    decoder: what runs the model, `Decoder(model)` by default; the algorithm files pass
    common.models.fast.decoding's FastDecoder, which draws the same tokens faster.
    reasoning: the env's (`read_reasoning`); where it has a budget, a row that has thought that
    many tokens inside its reasoning block gets the block's close from the sampler
    (`ThinkingBudget`). Returns a `Generation` on the model's device. """
    decoder = Decoder(model) if decoder is None else decoder
    device = next(model.parameters()).device
    pad_id = tokenizer.pad_token_id
    eos = torch.tensor(eos_token_ids(model, tokenizer), device=device)
    prompt_ids, prompt_mask = (x.to(device) for x in left_pad(prompts, pad_id))  # [B, P]
    B = len(prompts)
    seeds = None if seeds is None else torch.tensor([int(s) % 2**63 for s in seeds], device=device)
    # [B, max_new_tokens]: each row's draw for each token, hashed once for the rollout
    uniforms = None if seeds is None else uniform_table(seeds, max_new_tokens)
    was_training = model.training
    model.eval()
    tokens, logprobs, alive = [], [], []  # one [B] tensor per step
    done = torch.zeros(B, dtype=torch.bool, device=device)  # the row has stopped
    finished = torch.zeros(B, dtype=torch.bool, device=device)  # ... by EOS or a stop string
    rows = torch.arange(B, device=device)  # the rows in the forward batch: finished ones leave it
    budget = getattr(reasoning, "budget", None) and ThinkingBudget(tokenizer, reasoning, B, device)
    # FSDP2: the whole weights for the rollout, as ranks stop at different tokens
    with unsharded(model):
        logits = decoder.prefill(prompt_ids, prompt_mask, max_new_tokens)  # [B, V]
        for t in range(max_new_tokens):
            draws = None if uniforms is None else uniforms[:, t][rows]  # [b] each row's own
            sampled, logprob = sample_token(logits, temperature, top_p, draws)  # [b], [b]
            # Every row gets a column per step: padding and log-prob 0 once it has stopped.
            stopped = done[rows]
            tokens.append(torch.full((B,), pad_id, device=device).index_put(
                (rows,), sampled.masked_fill(stopped, pad_id)))
            logprobs.append(torch.zeros(B, device=device).index_put(
                (rows,), logprob.masked_fill(stopped, 0.0)))
            alive.append(~done)
            if budget:  # a spent budget: the close tag's next token, not the draw
                budget.step(tokens, logprobs, alive[-1], logits, rows, temperature)
            hit = torch.isin(tokens[-1], eos)
            if stop_strings:
                hit |= stop_string_hit(tokenizer, tokens, stop_strings, alive[-1])
            finished |= hit & alive[-1]
            done |= hit
            # Reading `done` on the host waits for the device: the decoder says how often to do it.
            check = (t + 1) % decoder.check_every == 0
            if t == max_new_tokens - 1 or (check and bool(done.all())):
                break
            if check and decoder.drops_rows:  # finished rows leave the batch, and their cache
                keep = (~done[rows]).nonzero()[:, 0]
                if len(keep) < len(rows):
                    rows = rows[keep]
                    decoder.keep(keep)
            logits = decoder.decode(tokens[-1][rows])  # [b, V]
    model.train(was_training)
    response_mask = torch.stack(alive, dim=1).long()  # [B, R]
    # between two checks every row may have stopped: those last columns hold no token
    R = max(1, int(response_mask.any(0).nonzero().max()) + 1)
    return Generation(prompt_ids=prompt_ids, prompt_mask=prompt_mask,
                      response_ids=torch.stack(tokens[:R], dim=1),
                      response_mask=response_mask[:, :R],
                      logprobs=torch.stack(logprobs[:R], dim=1), finished=finished,
                      truncated=~finished, forced=budget and budget.forced_mask(R))


class Decoder:
    """How `generate` runs the model: a prefill reads every prompt into a KV cache, then each decode
    step reads one new token per row, attending to the cache of all before it (nanochat's engine and
    gpt-fast's `prefill` / `decode_one_token`). common.models.fast.decoding.FastDecoder does the
    same, faster."""
    check_every = 1  # read which rows are done every this many tokens
    drops_rows = True  # finished rows leave the forward batch (`keep`)

    def __init__(self, model):
        self.model = model

    def prefill(self, prompt_ids, prompt_mask, max_new_tokens):
        """Left-padded prompts [B, P] -> the logits [B, V] of each one's next token. At most
        max_new_tokens decode steps follow (this cache grows as they come)."""
        positions = position_ids_from_mask(prompt_mask)  # [B, P]
        out = self.model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions,
                         use_cache=True, logits_to_keep=1)
        self.begin(getattr(out, KV_CACHE), prompt_mask, positions, max_new_tokens)
        return out.logits[:, -1]

    def begin(self, cache, prompt_mask, positions, max_new_tokens):
        """What the decode steps read: the prompts' cache, where each row's next token sits, and
        the attention mask of every step at once (each step attends to one more column)."""
        self.cache, self.position = cache, positions[:, -1:] + 1  # [B, 1]
        self.mask = torch.cat([prompt_mask, prompt_mask.new_ones(len(prompt_mask),
                                                                 max_new_tokens)], dim=1)
        self.width = prompt_mask.shape[1]  # the columns read so far

    def decode(self, token):
        """Each batch row's newest token [b] -> the logits [b, V] of the token after it."""
        self.width += 1
        out = self.model(input_ids=token[:, None], attention_mask=self.mask[:, :self.width],
                         position_ids=self.position, use_cache=True, **{KV_CACHE: self.cache})
        self.cache, self.position = getattr(out, KV_CACHE), self.position + 1
        return out.logits[:, -1]

    def keep(self, index):
        """Only the batch rows `index` go on (the others have finished)."""
        self.cache.batch_select_indices(index)
        self.mask, self.position = self.mask[index], self.position[index]

    def remember(self, gen):
        """Nothing: the plain decoder reads every prompt whole, while FastDecoder keeps what a
        stepwise episode's next prompt shares with this one."""


class ThinkingBudget:
    """Budget forcing (s1, Muennighoff et al. 2025): once a row has thought `reasoning.budget`
    tokens inside its reasoning block without closing it, the sampler writes the close tag's
    tokens in place of the next draws, and the model goes on to answer after them. Those tokens
    are the sampler's, marked in `Generation.forced`, out of the loss (as a tool's are in
    tools.py); their log-probs are still the model's, so the sampler/trainer mismatch stays
    measured on every token.

    A tag is matched as the token ids the tokenizer gives it alone: exact where it is one token
    (Qwen3's, DeepSeek-R1's, SmolLM3's <think>), and where a model spells it in other pieces, the
    budget does not see it. Each step is a few tensor ops over every row, so the plain and the fast
    decoder write the same tokens."""

    def __init__(self, tokenizer, reasoning, rows, device):
        def ids(tag):
            return torch.tensor(tokenizer(tag, add_special_tokens=False)["input_ids"],
                                device=device)
        self.open, self.close = ids(reasoning.open), ids(reasoning.close)
        self.max_tokens = reasoning.budget
        # a prompt that opens the block starts every row inside it
        self.inside = torch.full((rows,), reasoning.opened, dtype=torch.bool, device=device)
        self.thought = torch.zeros(rows, dtype=torch.long, device=device)  # tokens in the block
        self.next = torch.full((rows,), -1, dtype=torch.long, device=device)  # close's next, or -1
        self.forced = []  # [B] per step: the sampler wrote it

    def step(self, tokens, logprobs, alive, logits, rows, temperature):
        """This step's tokens and log-probs (the last [B] of the lists `tokens` and `logprobs`),
        rewritten in place with the close's next token where a row writes it, and its log-prob
        under the model (logits [b, V] of the batch rows `rows`); each row's thought tokens
        counted on."""
        logprob = logprobs[-1]
        writing = (self.next >= 0) & alive
        token = torch.where(writing, self.close[self.next.clamp(min=0)], tokens[-1])
        scaled = logits.float() / (temperature if temperature > 0 else 1.0)
        model_logprob = torch.zeros_like(logprob).index_put(
            (rows,), torch.log_softmax(scaled, -1).gather(-1, token[rows, None])[:, 0])
        logprob = torch.where(writing, model_logprob, logprob)
        self.forced.append(writing)
        done_writing = writing & (self.next == len(self.close) - 1)
        self.next = torch.where(writing, self.next + 1, self.next).masked_fill(done_writing, -1)
        history = tokens[-max(len(self.open), len(self.close)):-1] + [token]  # the tail
        opened = ~writing & self._ends_with(history, self.open) & alive
        closed = (~writing & self._ends_with(history, self.close) & alive) | done_writing
        self.thought = torch.where(opened, 0, self.thought + (self.inside & ~closed & alive))
        self.inside = (self.inside | opened) & ~closed
        spent = self.inside & (self.next < 0) & (self.thought >= self.max_tokens) & alive
        # a row that has begun the close itself goes on from its first piece not yet written
        start = torch.zeros_like(self.next)
        for k in range(len(self.close) - 1, 0, -1):
            start = torch.where((start == 0) & self._ends_with(history, self.close[:k]), k, start)
        self.next = torch.where(spent, start, self.next)
        tokens[-1], logprobs[-1] = token, logprob

    @staticmethod
    def _ends_with(tokens, tag):
        """[B] whether each row's tokens so far end with the ids `tag`."""
        if len(tokens) < len(tag) or not len(tag):
            return torch.zeros_like(tokens[-1], dtype=torch.bool)
        return (torch.stack(tokens[-len(tag):], dim=1) == tag).all(1)

    def forced_mask(self, steps):
        """[B, steps] 1 where the sampler wrote the token."""
        return torch.stack(self.forced[:steps], dim=1).long()


# ------------------------------------------------------------------------------------------------
# One token: temperature, top-p, and a draw from the row's own stream
# ------------------------------------------------------------------------------------------------
def sample_token(logits, temperature, top_p, uniforms=None):
    """logits [B, V] -> (token [B], its log-prob [B] under softmax(logits / temperature)).

    temperature == 0 is greedy. `uniforms` [B] (from `row_uniforms`) gives each row its own draw in
    [0, 1), so a row's sample depends only on its own seed and logits, not on which other rows share
    the batch or the process: 1 process and N ranks draw the same samples for the same global batch.
    Without them torch's global RNG samples. The returned log-prob ignores top-p truncation, so it
    matches what `token_logprobs` computes in training forwards."""
    logits = logits.float()
    if temperature == 0:
        token = logits.argmax(-1)
        return token, torch.log_softmax(logits, -1).gather(-1, token[:, None])[:, 0]
    logp = torch.log_softmax(logits / temperature, dim=-1)  # [B, V]
    probs = logp.exp()
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p
        drop = sorted_p.cumsum(-1) - sorted_p > top_p
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p.masked_fill(drop, 0.0))
    if uniforms is None:
        token = torch.multinomial(probs, 1)[:, 0]
    else:
        token = inverse_cdf(probs, uniforms)
    return token, logp.gather(-1, token[:, None])[:, 0]


def inverse_cdf(probs, uniforms):
    """Row i's token: the first whose cumulative probability exceeds uniforms[i] x the row's mass
    (probs need not sum to 1: top-p zeroes some). In float64, and with uniforms at most 1 - 2^-32,
    the threshold stays below the mass, so a token of probability 0 is never drawn."""
    cdf = probs.double().cumsum(-1)  # [B, V]
    threshold = uniforms.double() * cdf[:, -1]
    token = torch.searchsorted(cdf, threshold[:, None], right=True)[:, 0]
    return token.clamp(max=probs.shape[1] - 1)


def _hash32(x):
    """A 32-bit integer hash (Wellons' lowbias32) of int64 tensors holding values below 2^32. Each
    32-bit product is formed from 16-bit halves, so no int64 overflows on any device."""
    for shift, m in ((16, 0x7FEB352D), (15, 0x846CA68B)):
        x = x ^ (x >> shift)
        x = (x * (m & 0xFFFF) + (((x * (m >> 16)) & 0xFFFF) << 16)) & 0xFFFFFFFF
    return x ^ (x >> 16)


def row_keys(seeds):
    """Each row's 32-bit key, a hash of its 64-bit seed: the part of `row_uniforms` that does not
    change from token to token, computed once per rollout."""
    return _hash32((seeds & 0xFFFFFFFF) ^ _hash32((seeds >> 32) ^ 0x9E3779B9))


def key_uniforms(keys, t):
    """`row_uniforms` from `row_keys`. The token index's hash is one number for every row, so it is
    hashed in Python: on a GPU each tensor op of a decode step is a kernel launch."""
    return _hash32(keys ^ _hash32(t ^ 0x632BE5AB)).double() / 2**32


def uniform_table(seeds, steps):
    """`row_uniforms` of tokens 0 .. steps - 1 at once, [B, steps]: hashed once per rollout, not
    once per token (on a GPU each tensor op of a decode step is a kernel launch)."""
    token_keys = torch.tensor([_hash32(t ^ 0x632BE5AB) for t in range(steps)], device=seeds.device)
    return _hash32(row_keys(seeds)[:, None] ^ token_keys).double() / 2**32


def row_uniforms(seeds, t):
    """One uniform in [0, 1) per row for its t-th token: a hash of (the row's seed, t),
    counter-based like Philox. All rows draw in a few tensor ops, with no per-row generator, and
    a row's draw depends on its own seed and position only. seeds: int64 [B], >= 0."""
    return key_uniforms(row_keys(seeds), t)


# ------------------------------------------------------------------------------------------------
# Stopping: EOS and stop strings
# ------------------------------------------------------------------------------------------------
def eos_token_ids(model, tokenizer):
    ids = {tokenizer.eos_token_id}
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos])
    return sorted(i for i in ids if i is not None)


def stop_string_hit(tokenizer, tokens, stops, alive):
    """Whether each live row's newest token completes one of the stop strings `stops`. A stop
    string may span tokens, so a short tail of each live row is decoded. tokens: the [B] tokens of
    each step so far; alive [B]. -> [B] bool"""
    # a token holds >= 1 character, so this many tokens suffice
    window = max(len(s) for s in stops) + 2
    tail = torch.stack(tokens[-window:], dim=1).tolist()
    hits = [bool(a) and any(s in tokenizer.decode(t) for s in stops) for t,
            a in zip(tail, alive.tolist())]
    return torch.tensor(hits, dtype=torch.bool, device=alive.device)
