"""Every run sample_runs/ holds, as data: its spec (trainer, seed, writers, the bug it carries).

The one registry of the committed runs: generate.py trains them, labels.py labels them, and the
trainers (trainers.py, moe.py) read nothing else about a run. The evaluation corpus (corpus.py)
builds its own specs from the same classes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

STEPS = 400
SPEC_ENV = "SAMPLE_RUNS_SPEC"  # a child process's spec, as JSON


@dataclass
class Spec:
    name: str
    kind: str  # "healthy" or the failure it demonstrates
    story: str
    seed: int = 0
    steps: int = STEPS
    lr: float = 3e-3
    d_model: int = 32
    train_size: int = 4096
    eval_every: int = 25
    clip: float = 1.0
    weight_decay: float = 0.01
    writers: tuple[str, ...] = ("tb",)
    bugs: dict = field(default_factory=dict)
    trainer: str = "loop"  # loop | hf | deepspeed | keras | trl
    ds_config: dict = field(default_factory=dict)  # changes to DS_CONFIG; None drops a key
    console: str = ""  # the HF/TRL trainer runs in its own process, its console output goes here
    hf_args: dict = field(default_factory=dict)  # changes to the HF TrainingArguments
    # what the diverse corpus (diverse.py) varies; the defaults are the committed runs'
    arch: str = "transformer"  # transformer | lstm | mlp (model.build_model)
    layers: int = 2
    heads: int = 2
    optimizer: str = "adamw"  # adamw | adam | sgd | rmsprop | adafactor (training.make_optimizer)
    schedule: str = "cosine10"  # training.scheduled_lr
    warmup: int = 20
    batch: int = 16
    log_every: int = 1  # steps between logged training points (the loss is their mean)
    tags: str = "slash"  # tag naming scheme (training.TAG_SCHEMES)
    precision: str = "fp32"  # fp32 | bf16 (autocast) | fp16 (autocast + GradScaler, or DeepSpeed's)
    dataset: str = "markov"  # data.DATASETS
    family: dict = field(default_factory=dict)  # the diverse corpus's family attributes (labels.toml)


@dataclass
class MoESpec(Spec):
    trainer: str = "moe"
    experts: int = 8  # 0: the dense TinyLM (the memory-budget runs)
    top_k: int = 1
    aux_coef: float = 0.01  # Switch Transformer's default
    bias_rate: float = 0.0  # > 0: DeepSeek-V3 aux-loss-free balancing, bias step per update
    probe_seqs: int = 0  # a per-step probe-loss metric on this many held-out sequences
    memory_budget_gb: float = 0.0  # > 0: run under the supervisor, killed past the budget


SPECS = [
    Spec("healthy_seed0", "healthy", "a healthy run", seed=0, writers=("tb", "jsonl")),
    Spec(
        "healthy_seed1_wide", "healthy", "a healthy run, wider model, lower lr", seed=1, d_model=48, lr=2e-3
    ),
    Spec("healthy_hf_trainer", "healthy", "a healthy run under the HF Trainer", seed=2, trainer="hf"),
    Spec(
        "healthy_deepspeed_fp16",
        "healthy",
        "a healthy DeepSpeed fp16 ZeRO-1 run",
        seed=3,
        trainer="deepspeed",
        writers=("jsonl",),
    ),
    Spec(
        "diverge_nan",
        "divergence_nan",
        "lr schedule bug: lr grows 25 %/step from step 120 until the loss is NaN",
        seed=5,
        clip=0.0,
        writers=("tb", "jsonl"),
        bugs={"lr_growth": (120, 1.25)},
    ),
    Spec(
        "spike_recovers",
        "loss_spike",
        "lr x40 for 5 steps at step 150 (a scheduler glitch); the loss spikes and recovers",
        seed=6,
        writers=("tb", "text"),
        bugs={"lr_burst": (150, 155, 40.0)},
    ),
    Spec(
        "spike_no_recovery",
        "loss_spike_unrecovered",
        "lr x400 from step 150 on; the loss spikes and never comes back",
        seed=7,
        writers=("tb", "text"),
        bugs={"lr_burst": (150, STEPS, 400.0)},
    ),
    Spec(
        "attention_collapse",
        "attention_collapse",
        "at step 150 the attention temperature goes to 60 and the output "
        "path is frozen and decays: attention entropy collapses, gradients vanish (P1)",
        seed=8,
        writers=("tb", "jsonl"),
        bugs={"attn_temperature": (150, 60.0), "freeze_decay": (150, "output", 0.85)},
    ),
    Spec(
        "representation_collapse",
        "dead_ffn",
        "at step 150 the embeddings are frozen and decay: every token reaches "
        "the FFNs as the same vector (P2)",
        seed=9,
        bugs={"freeze_decay": (150, "embeddings", 0.8)},
    ),
    Spec(
        "overfit",
        "overfitting",
        "16 training sequences, no weight decay: eval loss turns up while train loss falls",
        seed=10,
        train_size=16,
        steps=600,
        eval_every=20,
        weight_decay=0.0,
        writers=("tb", "jsonl"),
    ),
    Spec(
        "fp16_overflow_storm",
        "fp16_overflow",
        "DeepSpeed fp16 ZeRO-1; lr x1e4 from step 60 until the loss scale "
        "reaches its minimum and DeepSpeed exits",
        seed=11,
        trainer="deepspeed",
        writers=("jsonl",),
        bugs={"lr_burst": (60, STEPS, 1e4)},
    ),
    Spec(
        "plateau",
        "plateau",
        "lr decays 4 %/step from step 40 (a scheduler misconfiguration): the loss stalls high",
        seed=12,
        bugs={"lr_decay": (40, 0.96)},
    ),
    Spec(
        "memory_jump",
        "memory_blowup",
        "at step 200 a 3.5 GB activation cache leaks while the output path is frozen "
        "and decays: memory jumps as gradients vanish (P4)",
        seed=13,
        bugs={"leak_gb": (200, 3.5), "freeze_decay": (200, "output", 0.85)},
    ),
    Spec(
        "resumed_after_kill",
        "healthy",
        "killed (no clean exit) at step 230, resumed in the same folder from the "
        "step-200 checkpoint by a second writer",
        seed=14,
        writers=("tb", "text"),
        bugs={"kill_at": 230},
    ),
    Spec(
        "deepspeed_resumed_after_kill",
        "healthy",
        "DeepSpeed fp16 ZeRO-1 killed (SIGKILL) at step 230; a second process resumes from the "
        "step-200 DeepSpeed checkpoint (engine.load_checkpoint): two consoles, each starting at step=0",
        seed=15,
        trainer="deepspeed",
        writers=("jsonl",),
        bugs={"kill_at": 230},
    ),
    Spec(
        "deepspeed_default_log_level",
        "healthy",
        "DeepSpeed fp16 ZeRO-1 at its default log level, 2 gradient-accumulation steps and no "
        "train_batch_size in ds_config, wall_clock_breakdown on: no step= lines, the monitor counts samples",
        seed=16,
        trainer="deepspeed",
        writers=("jsonl",),
        ds_config={
            "train_batch_size": None,
            "steps_per_print": None,
            "log_level": None,
            "gradient_accumulation_steps": 2,
            "wall_clock_breakdown": True,
        },
    ),
    Spec(
        "hf_diverge_nan_filtered",
        "divergence_nan_filtered",
        "HF Trainer, lr schedule bug (lr grows 25 %/step from step 120, no clipping): NaN from the "
        "divergence on; the Trainer's NaN filter keeps the logged loss finite, grad_norm and eval_loss "
        "show it; tokens counted, console kept",
        seed=17,
        steps=300,
        clip=0.0,
        trainer="hf",
        bugs={"lr_growth": (120, 1.25)},
        console="train.log",
        hf_args={"include_num_input_tokens_seen": True, "disable_tqdm": False},
    ),
    Spec(
        "keras_csvlogger_appended",
        "healthy",
        "Keras 3 (torch backend) next-token model fitted three times, 4 epochs each, with "
        "ReduceLROnPlateau; every fit appends to one CSVLogger training.log: the epoch column restarts at 0",
        seed=18,
        steps=4,
        trainer="keras",
    ),
    Spec(
        "trl_sft_console",
        "healthy",
        "TRL SFTTrainer, a tiny GPT-2 on the same language for 2 epochs; its console prints the log "
        "dicts with string values and no step",
        seed=19,
        lr=1e-2,
        train_size=800,
        eval_every=20,
        trainer="trl",
        console="train.log",
    ),
    # the MoE and memory-budget runs (moe.py trains them)
    MoESpec(
        "healthy_moe_top1",
        "healthy",
        "a healthy MoE run: 8 experts, top-1 (Switch), balance-loss coefficient 0.01",
        seed=20,
        writers=("tb", "jsonl"),
    ),
    MoESpec(
        "healthy_moe_top2",
        "healthy",
        "a healthy MoE run: 16 experts, top-2 (Mixtral-style gates), wider model, DeepSeek-V3-style "
        "aux-loss-free bias balancing (step 0.001) with a small 0.001 balance loss",
        seed=21,
        d_model=48,
        lr=2e-3,
        experts=16,
        top_k=2,
        aux_coef=0.001,
        bias_rate=0.001,
        writers=("tb",),
    ),
    MoESpec(
        "moe_router_collapse",
        "router_collapse",
        "at step 150 a resumed config sets the balance-loss coefficient to -0.1 (a sign typo): the "
        "term now rewards imbalance, the busiest expert draws ever more tokens until it takes them all",
        seed=22,
        writers=("jsonl",),
        bugs={"aux_coef": (150, -0.1)},
    ),
    MoESpec(
        "moe_balance_loss_dominates",
        "balance_loss_dominates",
        "at step 40 a resumed config sets the balance-loss coefficient to 500 (5e2 typed for 5e-3): the "
        "balance loss is almost all of the total and the LM loss stalls far above the healthy runs'",
        seed=23,
        writers=("tb",),
        bugs={"aux_coef": (40, 500.0)},
    ),
    MoESpec(
        "healthy_memory_budget",
        "healthy",
        "a healthy run logging RSS against a 1.5 GB budget; its probe metric is computed under "
        "torch.no_grad() and kept as a number",
        seed=24,
        experts=0,
        probe_seqs=64,
        memory_budget_gb=1.5,
        writers=("tb", "text"),
    ),
    MoESpec(
        "memory_leak_oom",
        "memory_leak",
        "from step 150 the probe metric runs without torch.no_grad() and its loss tensors are kept: "
        "each step's activations stay alive until RSS passes the 1.5 GB budget and the job is "
        "OOM-killed (SIGKILL, no clean exit)",
        seed=25,
        experts=0,
        probe_seqs=64,
        memory_budget_gb=1.5,
        writers=("tb", "text"),
        bugs={"probe_leak": 150},
    ),
]
RECOVERY = Spec(
    "attention_collapse_recovery",
    "healthy",
    "restart of attention_collapse from its step-100 checkpoint "
    "with lr x0.8, warmup +0.01, weight decay x1.2, clip x0.7 (the guides' P1 action); ends healthy",
    seed=8,
    lr=3e-3 * 0.8,
    weight_decay=0.012,
    clip=0.7,
    writers=("tb", "jsonl"),
)
