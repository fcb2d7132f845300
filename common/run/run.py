"""TRY NOT TO MODIFY: the plumbing that every algorithm file shares and a student may skip. None of
it changes what an update computes:

- processes: torchrun's ranks (or one process), each option checked before any model loads, the
  seed;
- the schedule: how many updates, the learning rate of each, the order of each update's minibatches;
- an optimizer step's gradients: their mean over ranks (what DDP does) and the clip;
- the resume point, and a resumed run's optimizer states;
- rows per micro-batch: --micro_batch_size, or on a GPU what its memory holds (the same update up to
  float rounding);
- the logs (metrics averaged over ranks, samples, held-out accuracy: of each --eval_datasets set,
  and of --eval_samples sampled responses), the NaN guard on each optimizer step, checkpoints, and
  the run's last line.

    run = Run(args, check_args)                     # ranks, checks, run folder, seed
    args.max_steps, args.warmup_steps = run.schedule(len(env), args.num_prompts)
    start_step, resume_from = run.resume_point()
    tokenizer = load_tokenizer(args.model_name_or_path, template_kwargs=...)
    run.check_prompts(tokenizer, env, eval_env)     # within the model's positions; thinking
    ...                                             # the models, the optimizers
    run.start(policy, tokenizer, eval_env, {"policy": (policy, optimizer)})
    for step in range(start_step, args.max_steps):
        ...                                         # rollout, advantages
        mb = run.micro_batch_size(rows, width)      # rows per forward (fitted on a GPU)
        lr = run.set_lr(optimizer, step)            # warmup, then --lr_scheduler
        for batch_rows in run.minibatches(N, step): # epochs x shuffled minibatches
            ...                                     # micro-batches: forward, loss, backward
            grad_norm = run.sync_gradients(policy)  # DDP's mean over ranks, then the clip
            if run.guard.ok(loss, grad_norm):       # a NaN or inf skips the step
                optimizer.step()
        run.log(step + 1, metrics, stats, samples)
        run.end_update(step + 1)                    # evaluation and checkpoints at their intervals
    return run.finish()
"""

import contextlib

import torch

from common.distributed import (all_gather_objects, all_reduce_mean, all_reduce_stats,
                                average_gradients, init_distributed, print0, sample_seed,
                                set_seed)
from common.env import eval_set_name, make_eval_sets
from common.errors import on_every_rank
from common.env.grader import grader_counts
from common.models.loading import max_positions
from common.models.offload import offload_optimizer
from common.models.sampler import encode_prompts, read_reasoning
from common.models.sharding import clip_grad_norm, load_optimizer_state
from common.run.args import algorithm_of, lr_at, runs_of, schedule
from common.run.checkpoints import point_latest, resume_point, run_folder, save_checkpoint
from common.run.checks import StepGuard, check_options, check_rewards, trainers
from common.run.evaluation import evaluate, evaluate_sets
from common.run.logger import Logger, every, report_end


DEFAULT_MICRO_BATCH = 8  # rows per forward in the update when --micro_batch_size is not given


class CudaMemory:
    """What MicroBatchFit reads of a GPU's memory, in bytes (a test passes a fake)."""

    def start(self):
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()

    def peak(self):
        return torch.cuda.max_memory_allocated()

    def room(self):
        """Free memory: the device's, and what torch's allocator holds unused."""
        return (torch.cuda.mem_get_info()[0] + torch.cuda.memory_reserved()
                - torch.cuda.memory_allocated())


class MicroBatchFit:
    """--micro_batch_size left unset on a GPU: the first update runs micro-batches of 8 rows and
    measures what they cost; later updates take as many rows as `fraction` of the memory then free
    holds at that cost per token. On a GPU an update at 8 rows waits on the host (a micro-batch's
    ~38,000 small kernel calls take as long at 8 rows as at 64), and the loss normaliser makes
    1 x 64 and 8 x 8 the same update, up to float rounding (tests: 1 x 8 and 8 x 1).

    The cost per token is (peak - start - gradients) / (rows x width), over the first update from
    its log-prob forwards to its optimizer step: the peak above what was allocated when it started,
    less the gradients its backward allocated. AdamW's moments, allocated by its first step, may
    count as activations, which errs on the side of fewer rows."""

    def __init__(self, fraction=0.5, memory=None):
        self.fraction, self.memory = fraction, memory or CudaMemory()
        self.first = None  # (allocated at its start, its micro-batch rows, its width)
        self.tokens = None  # tokens per micro-batch, once measured

    def rows(self, rows, width):
        """Rows per micro-batch for an update of `rows` rows of `width` tokens each."""
        if self.tokens is None:
            if self.first is None and rows > 0:  # no rows (no pairs) measure nothing
                self.first = (self.memory.start(), min(DEFAULT_MICRO_BATCH, rows), width)
            return DEFAULT_MICRO_BATCH
        return max(1, min(rows, self.tokens // width))

    def measure(self, grad_bytes):
        """After the first update: tokens per micro-batch from now on. -> whether it measured."""
        if self.first is None or self.tokens is not None:
            return False
        start, rows, width = self.first
        per_token = max(1, self.memory.peak() - start - grad_bytes) / (rows * width)
        tokens = int(self.fraction * max(0, self.memory.room() - grad_bytes) / per_token)
        # every rank takes the fewest tokens any rank can hold, so that ranks log alike
        self.tokens = min(all_gather_objects(tokens))
        return True


def fits_gpu_memory(device, args):
    """Whether the update's micro-batches are fitted to the device's memory: --micro_batch_size
    unset, on a GPU, and not under --fsdp (whose gathered weights a measurement of one update would
    not see whole)."""
    return args.micro_batch_size is None and device.type == "cuda" and not args.fsdp


def minibatch_order(n, num_mini_batches, seeds, device="cpu"):
    """Row indices of the minibatches of one pass over n rows per seed (one seed per epoch): a
    shuffle seeded by it, cut into equal parts; with one minibatch the rows keep their order."""
    for seed in seeds:
        if num_mini_batches == 1:
            yield torch.arange(n, device=device)
            continue
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed % 2**63)).to(device)
        yield from order.chunk(num_mini_batches)


class Run:
    def __init__(self, args, check_args, samplers=0):
        """Join torchrun's processes (or be the only one), check every option before any model
        loads (the shared checks of common/run/checks.py, then check_args(args, world_size), the
        file's own), and seed. samplers: the last ranks under torchrun, which only sample
        (async_grpo.py's one); self.trainers, the others, train data-parallel."""
        info = init_distributed()
        self.args, self.rank, self.world = args, info.rank, info.world_size
        self.device, self.is_main = info.device, info.is_main
        self.trainers = trainers(self.world, samplers)
        with on_every_rank():  # each rank checks the same options: rank 0 says what is wrong
            check_options(args, check_args, self.world, samplers)
            # --eval_datasets: read now, so that a bad name or file fails before any model loads
            self.eval_sets = make_eval_sets(args, print0) if args.eval_datasets else {}
            # the run's folder, which main puts in args.output_dir: --output_dir, or a new one
            self.output_dir = run_folder(args, self.is_main)
        set_seed(args.seed)
        # --bf16: forwards run under autocast; weights and optimizer states stay fp32
        self.autocast = (torch.autocast(self.device.type, dtype=torch.bfloat16) if args.bf16
                         else contextlib.nullcontext())
        self.print = print0
        self.start_step, self.state = 0, None
        # --micro_batch_size unset: 8 (main sets it to default_micro_batch), or on a GPU what its
        # memory holds, decided here while it is still unset
        self.fit = MicroBatchFit() if fits_gpu_memory(self.device, args) else None
        self.default_micro_batch = DEFAULT_MICRO_BATCH

    def resume_point(self):
        """(first update, checkpoint folder or None): where this run starts; the checkpoint's
        trainer state (optimizers and any extra state) is kept in self.state."""
        self.start_step, resume_from, self.state = resume_point(
            self.args.output_dir, self.args.resume, self.args.max_steps, self.args)
        return self.start_step, resume_from

    def start(self, policy, tokenizer, eval_env, optimizers, extra_state=None,
              eval_max_new_tokens=None, respond=None):
        """Once the models are built: a resumed run's optimizer states, the logs, the NaN guard,
        and the held-out accuracy before the first update.

        optimizers: {name: (module, optimizer)}, saved and restored under that name.
        extra_state(): what else each checkpoint keeps (a critic's weights...), called on every
        rank at each save. eval_max_new_tokens: the evaluation's token limit (default
        args.max_new_tokens). respond(prompts) -> (texts, truncated): how the evaluation answers,
        when not by one greedy `generate` (common/run/evaluation.py)."""
        args = self.args
        self.policy, self.tokenizer, self.eval_env = policy, tokenizer, eval_env
        if eval_env is not None and (args.eval_samples or self.eval_sets):
            self.eval_sets = self._each_set(eval_env)
        self.respond = respond
        self.optimizers, self.extra_state = optimizers, extra_state or (lambda: None)
        self.eval_max_new_tokens = eval_max_new_tokens or args.max_new_tokens
        if self.state is not None:
            for name, (module, optimizer) in optimizers.items():
                load_optimizer_state(module, optimizer, self.state["optimizers"][name])
        self.guard = StepGuard()  # a NaN or inf loss or gradient skips the optimizer step
        self.logger = Logger(args, self.start_step, enabled=self.is_main)
        if self.is_main and args.output_dir.startswith(f"{runs_of(args)}/"):
            point_latest(args.output_dir)  # runs/<file>/latest: this run, now that it has begun
        self.first_acc = self.evaluate(0) if args.eval_on_start and self.start_step == 0 else None
        self._timeouts = grader_counts()["timeouts"]

    def _each_set(self, eval_env):
        """start's held-out sets, under --eval_datasets or --eval_samples."""
        # each set on its own, the training task's name standing for eval_env
        return ({name: eval_env if env is None else env for name, env in self.eval_sets.items()}
                or {eval_set_name(self.args.dataset_name): eval_env})

    def schedule(self, num_problems, per_update):
        """(max_steps, warmup_steps) once the data is read: --num_train_epochs and --warmup_ratio,
        when given, set them (`per_update`: problems an update takes)."""
        return schedule(self.args, num_problems, per_update)

    def set_lr(self, optimizer, step, base=None):
        """Update `step`'s learning rate set in `optimizer` (common/run/args.py's lr_at; base:
        another peak rate on the same schedule, a critic's). -> the rate"""
        lr = lr_at(step, self.args, base)
        for group in optimizer.param_groups:
            group["lr"] = lr
        return lr

    def offload_optimizer(self, model, optimizer):
        """--offload_optimizer: `optimizer`, built on `model`'s trained weights, stepping on fp32
        copies of them in the CPU's memory while the model keeps bf16 ones on the device
        (common/models/offload.py, ZeRO-Offload's split)."""
        return offload_optimizer(model, optimizer)

    def minibatches(self, n, step):
        """Row indices of update `step`'s minibatches: --num_ppo_epochs passes over n rows, each
        shuffled (seeded by the update, epoch and rank) and cut into --num_mini_batches."""
        seeds = [sample_seed(self.args.seed, step, epoch * self.trainers + self.rank)
                 for epoch in range(self.args.num_ppo_epochs)]
        return minibatch_order(n, self.args.num_mini_batches, seeds, self.device)

    def sync_gradients(self, model):
        """What DDP does once the micro-batches' gradients are summed, their mean over ranks, then
        the clip to --max_grad_norm (0: none). -> the norm before the clip"""
        if self.trainers > 1:
            average_gradients(model)
        return clip_grad_norm(model, self.args.max_grad_norm)

    def micro_batch_size(self, rows, width):
        """Rows per micro-batch in this update (`rows` rows of `width` tokens): --micro_batch_size,
        or, left unset on a GPU, fitted to its memory (MicroBatchFit)."""
        if self.fit is not None:
            return self.fit.rows(rows, width)
        return self.args.micro_batch_size or self.default_micro_batch

    def check_prompts(self, tokenizer, *envs):
        """Stop, naming the row and the fix, before the weights load, if a prompt with
        --max_new_tokens passes the model's positions (its config's): past them the model reads
        positions it never learned, and the run would train on what it makes of them. Then tell
        each env where the prompts leave a reasoning block (`read_reasoning`: graded past it)."""
        for env in filter(None, envs):
            if hasattr(env, "read_reasoning"):  # stepwise episodes grade by their own MathEnv
                read_reasoning(tokenizer, env, getattr(self.args, "max_thinking_tokens", None))
        positions = max_positions(self.args.model_name_or_path)
        if positions is None:  # no config to read here: the loading says why
            return
        for env in filter(None, envs):
            env.check_prompt_lengths(lambda prompts: [len(p) for p in encode_prompts(
                tokenizer, prompts)], positions, self.args.max_new_tokens,
                self.args.model_name_or_path)

    def check_rewards(self, rewards, step, problems):
        """Stop before an update whose rewards hold NaN or inf, naming the sample and its problem
        (common/run/checks.py's check_rewards says how `problems` are read)."""
        check_rewards(rewards, step, self.args.dataset_name, problems)

    def grader_timeouts(self):
        """Symbolic grades cut short by the time budget since the last call (or evaluation)."""
        now = grader_counts()["timeouts"]
        count, self._timeouts = now - self._timeouts, now
        return count

    def log(self, step, metrics, stats=(), samples=(), stat_keys=()):
        """One update's line of metrics.jsonl: `metrics` (this rank's numbers) averaged over ranks,
        the mean of every rank's micro-batch `stats` (`stat_keys` logged as NaN where no micro-batch
        measured them), and the steps the guard skipped. Every --log_interval updates (and after the
        first) `samples` go to samples.jsonl."""
        if self.fit is not None and self.fit.tokens is None:
            self._fit_micro_batches(step)
        metrics = {**all_reduce_mean(metrics, self.device),
                   **all_reduce_stats(stats, stat_keys, self.device)}
        metrics["skipped_steps"] = self.guard.pop()
        self.logger.log(step, metrics)
        if step % self.args.log_interval == 0 or step == 1:
            self.logger.log_samples(step, list(samples))

    def _fit_micro_batches(self, step):
        """log's measure, on a GPU without --micro_batch_size, until one update is measured."""
        # the first update's cost sets the micro-batches of the rest (measured once)
        grads = sum(p.numel() * p.element_size() for module, _ in self.optimizers.values()
                    for p in module.parameters() if p.requires_grad)
        if self.fit.measure(grads):
            self.print(f"micro-batches of up to {self.fit.tokens} tokens from update "
                       f"{step + 1} on: {self.fit.fraction:.0%} of free GPU memory "
                       "(--micro_batch_size sets a number of rows)")

    def evaluate(self, step):
        """Greedy held-out accuracy of the policy (None without a held-out env), logged; with
        --eval_datasets or --eval_samples, each set's (`evaluate_sets`)."""
        if self.eval_env is None:
            return None
        if self.eval_sets:  # --eval_datasets, --eval_samples: each set as papers report it
            return self.evaluate_sets(step)
        args = self.args
        acc = evaluate(self.policy, self.tokenizer, self.eval_env, args.num_eval_problems,
                       self.eval_max_new_tokens, args.eval_batch_size, self.autocast,
                       respond=self.respond, fast=not args.plain)
        self.logger.log_eval(step, {"eval/accuracy": acc})
        print0(f"[update {step}] held-out greedy accuracy: {acc:.3f}")
        self._timeouts = grader_counts()["timeouts"]  # the evaluation's are not the next update's
        return acc

    def evaluate_sets(self, step):
        """Each held-out set's greedy pass@1, and with --eval_samples its avg@k, pass@k and maj@k,
        logged and printed a line per set. -> the first set's greedy pass@1 (eval/accuracy)"""
        args = self.args
        metrics = evaluate_sets(self.policy, self.tokenizer, self.eval_sets, args.num_eval_problems,
                                self.eval_max_new_tokens, args.eval_batch_size, self.autocast,
                                args.eval_samples, args.eval_temperature, args.seed, self.respond,
                                fast=not args.plain)
        acc = metrics[f"eval/{next(iter(self.eval_sets))}/greedy_pass@1"]
        self.logger.log_eval(step, {"eval/accuracy": acc, **metrics})
        for name in self.eval_sets:
            shown = ", ".join(f"{key.rsplit('/', 1)[1]} {value:.3f}"
                              for key, value in metrics.items()
                              if key.startswith(f"eval/{name}/") and "num_" not in key)
            print0(f"[update {step}] held-out {name} "
                   f"({metrics[f'eval/{name}/num_problems']} problems): {shown}")
        self._timeouts = grader_counts()["timeouts"]  # the evaluation's are not the next update's
        return acc

    def save(self, step):
        """checkpoint-{step}: on every rank (under --fsdp the weights and optimizer states are
        gathered), written by rank 0."""
        args = self.args
        save_checkpoint(f"{args.output_dir}/checkpoint-{step}", self.policy, self.tokenizer, step,
                        self.optimizers, extra=self.extra_state(),
                        merge_base=args.merge_lora and args.model_name_or_path,
                        algorithm=algorithm_of(args))

    def end_update(self, step):
        """After update `step`: the held-out accuracy and a checkpoint, at their intervals (the
        last update's come from `finish`)."""
        args = self.args
        if step < args.max_steps and every(step, args.eval_interval):
            self.evaluate(step)
        if step < args.max_steps and every(step, args.save_interval):
            self.save(step)

    def finish(self):
        """The held-out accuracy after the last update, the last checkpoint, and the run's last
        line. -> (accuracy before, accuracy after), None where not measured."""
        args = self.args
        final_acc = self.evaluate(args.max_steps)
        self.save(args.max_steps)
        report_end(self.first_acc, final_acc, f"{args.output_dir}/checkpoint-{args.max_steps}",
                   adapter=bool(args.lora_r))
        self.logger.close()
        return self.first_acc, final_acc
