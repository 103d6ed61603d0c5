"""A labelled corpus of real CPU runs, diverse by construction (generated on demand, never committed):

    python sample_runs/generate.py --diverse DIR [--jobs 1] [--only FAMILY ...] [--limit N]

Every failure kind the built-in detectors target gets at least 8 failed runs, plus healthy runs
with the hard negatives, from five trainers: the plain PyTorch loop, the HF Trainer, DeepSpeed
(ZeRO-1 on the CPU, fp16 / bf16 / fp32), Lightning and the MoE loop (moe.py). What the
evaluation corpus (corpus.py) holds fixed varies here by construction, each axis cycled through
all its values within each kind (in a per-kind shuffled order, so that the axes do not move
together):

    model        transformer (tiny d=24 x1 / small d=32 x2 / medium d=64 x3), LSTM, MLP
    optimizer    AdamW, Adam, SGD + momentum 0.9, RMSprop, Adafactor (lr per optimizer)
    clipping     none, 0.25, 1.0, 5.0
    schedule     constant, warm-up + cosine, cosine with warm restarts, step decay, cosine to 10 %
    batch size   4, 8, 16, 32;  logging interval 1, 5, 10, 25 steps (1-2 for the spike kinds)
    tag names    train/loss, loss, Loss/train, train_loss (grad norms: train/grad_norm,
                 grad_norm, Grad/total_norm, gnorm; Lightning's grad_2.0_norm_total), HF's own
    writers      TensorBoard SummaryWriter, JSONL, console, HF's own files, DeepSpeed's monitor
                 (CSV + TensorBoard: lr and loss scale, no loss) and console beside a JSONL file,
                 Lightning's CSVLogger / TensorBoardLogger (lightning_logs/version_0/)
    precision    fp32, bf16 autocast, fp16 autocast + GradScaler (initial scale 2^24: early skips),
                 DeepSpeed fp16 (dynamic loss scale) and bf16
    dataset      data.DATASETS: the synthetic Markov language, Python's stdlib sources, Debian's
                 common licenses and copyright files, the Zen of Python (overfitting)

Healthy runs carry the hard negatives in turn: heavy clipping (max_norm 0.25, most steps clip),
warm restarts, noisy small batches (2-4), early fp16 overflow skips, resumed runs (killed, then
restarted from the last checkpoint in the same folder), a recovered one-step spike (one corrupt
batch of uniform random tokens; the weights barely move).

Labels (DIR/labels.toml) come from the injected cause (the spec's kind) confirmed by the
physical criterion of labels.py on the run's own logs (first non-finite loss, eval minimum,
loss-scale floor, EMA plateau, ...), never from the workbench's rules; a failed run whose
criterion finds no onset is "unknown". A healthy run is "unknown" when its logs show a failure:
a non-finite loss, a log that ends before 95 % of its steps, a watchdog / minimum-loss-scale /
out-of-memory line, max/mean expert load >= E/2 for 20 steps, RSS >= 90 % of its budget, or a
final loss EMA above 0.8 x its first logged loss (it did not learn). A 6-sigma loss spike in a
healthy run is kept as evidence (`spike_step`), not a reason. Each run's entry also holds its
family attributes (trainer, optimizer, size, arch, clip, schedule, precision, dataset, tags,
writers, batch, log_every, hard_negative, family = trainer/optimizer/size), the sha256 of its
dataset's text and the seconds it took. DIR/MANIFEST.tsv lists every file with its size and
sha256 and its run's CPU seconds; DIR/STATUS.md the runs done and the family x kind breakdown.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, replace
from pathlib import Path

from specs import MoESpec, Spec

OPTIMIZERS = {"adamw": 3e-3, "adam": 2e-3, "sgd": 0.3, "rmsprop": 1e-3, "adafactor": 1e-2}
SIZES = {"tiny": (24, 1, 2), "small": (32, 2, 2), "medium": (64, 3, 4)}  # d_model, layers, heads
STEPS = {"tiny": 260, "small": 220, "medium": 180}
ARCHS = ["transformer", "transformer", "lstm", "transformer", "mlp"]
CLIPS = [0.0, 0.25, 1.0, 5.0]
SCHEDULES = ["constant", "warmup_cosine", "cosine_restarts", "step", "cosine10"]
BATCHES = [4, 8, 16, 32]
LOG_EVERY = [1, 5, 10, 25]
TEXTS = ["markov", "python_stdlib", "debian_licenses", "debian_copyright"]
TAGS = ["slash", "plain", "pascal", "short"]
PRECISIONS = {
    "loop": ["fp32", "bf16", "fp32", "fp16"],  # fp16 autocast is slow on the CPU
    "hf": ["fp32", "bf16"],
    "deepspeed": ["fp16", "fp32", "bf16"],
    "lightning": ["fp32", "bf16"],
    "moe": ["fp32"],
}
WRITERS = {
    "loop": [("tb",), ("jsonl",), ("text",), ("tb", "text"), ("tb", "jsonl")],
    "deepspeed": [("jsonl",)],  # beside its own console and monitor, which log no loss on the CPU
    "lightning": [("csv",), ("tb",)],
    "moe": [("tb",), ("jsonl",), ("tb", "text")],
    "hf": [()],
}
HARD = ["clip_0.25", "warm_restarts", "small_batch", "fp16_skips", "resumed", "recovered_spike", ""]
HARD_TRAINERS = {
    "fp16_skips": ["loop", "deepspeed"],
    "resumed": ["loop", "deepspeed"],
    "recovered_spike": ["loop"],
}

# kind -> (trainers in turn, runs); the mechanisms are in `_mechanism`
KINDS: dict[str, tuple[list[str], int]] = {
    "healthy": (["loop", "hf", "deepspeed", "lightning", "loop", "moe"], 63),
    "divergence_nan": (["loop", "hf", "deepspeed", "lightning"], 9),
    "divergence_nan_filtered": (["hf"], 10),
    "loss_spike": (["loop", "hf", "deepspeed", "lightning"], 12),
    "loss_spike_unrecovered": (["loop", "hf", "deepspeed", "lightning"], 10),
    "attention_collapse": (["loop", "hf", "lightning"], 9),
    "dead_ffn": (["loop", "hf", "lightning"], 11),
    "overfitting": (["loop", "hf", "lightning"], 9),
    "fp16_overflow": (["deepspeed", "loop", "deepspeed"], 11),
    "plateau": (["loop", "hf", "deepspeed", "lightning"], 12),
    "memory_blowup": (["loop"], 10),
    "memory_leak": (["moe"], 8),
    "router_collapse": (["moe"], 9),
    "balance_loss_dominates": (["moe"], 11),
}


# more runs of the kinds whose cause shows least often in the logs, seeds from 2001, trained before
# the last healthy runs
EXTRA = {"balance_loss_dominates": 5, "plateau": 4, "fp16_overflow": 3, "loss_spike": 2}


def _cycle(kind: str, axis: str, values: list, i: int):
    """Run i of a kind takes the axis's values in turn, in an order shuffled per (kind, axis)."""
    order = random.Random(f"{kind}/{axis}").sample(values, len(values))
    return order[i % len(order)]


def diverse_specs() -> list[Spec]:
    """Every run, round-robin over the kinds (the first runs built cover every kind)."""
    specs = []
    seed = 1000
    todo = [
        (kind, i) for i in range(max(n for _, n in KINDS.values())) for kind in KINDS if i < KINDS[kind][1]
    ]
    for kind, i in todo:
        seed += 1
        specs.append(_spec(kind, i, seed))
    more = [(k, KINDS[k][1] + j) for j in range(max(EXTRA.values())) for k in EXTRA if j < EXTRA[k]]
    extra = [_spec(kind, i, 2000 + n) for n, (kind, i) in enumerate(more, 1)]
    return specs[:150] + extra + specs[150:]


def _spec(kind: str, i: int, seed: int) -> Spec:
    trainers = KINDS[kind][0]
    trainer = trainers[i % len(trainers)]
    hard = HARD[i % len(HARD)] if kind == "healthy" else ""
    if hard:  # each hard negative in turn, on the trainers that can show it
        trainers = HARD_TRAINERS.get(hard, trainers)
        trainer = trainers[i // len(HARD) % len(trainers)]
    c = lambda axis, values: _cycle(kind, axis, values, i)  # noqa: E731
    size = c("size", list(SIZES))
    d, layers, heads = SIZES[size]
    optimizer = c("optimizer", list(OPTIMIZERS))
    kw: dict = {
        "seed": seed,
        "steps": STEPS[size],
        "trainer": trainer,
        "arch": c("arch", ARCHS),
        "d_model": d,
        "layers": layers,
        "heads": heads,
        "optimizer": optimizer,
        "lr": OPTIMIZERS[optimizer] * (0.7 if size == "medium" else 1.0),
        "clip": c("clip", CLIPS),
        "schedule": c("schedule", SCHEDULES),
        "warmup": c("warmup", [0, 10, 20, 40]),
        "batch": c("batch", BATCHES),
        "log_every": c("log_every", LOG_EVERY),
        "eval_every": c("eval_every", [20, 25, 50]),
        "precision": c("precision", PRECISIONS[trainer]),
        "dataset": c("dataset", TEXTS),
        "tags": c("tags", TAGS),
        "writers": c("writers", WRITERS[trainer]),
        "weight_decay": 0.01,
    }
    if trainer == "lightning":
        kw["tags"] = c("tags_lightning", ["lightning", "slash", "pascal", "plain"])

    if trainer == "deepspeed":  # DeepSpeed on the CPU is slow: shorter runs
        kw["steps"] = min(kw["steps"], 200)
    # collapses need a trained model, spikes a window past the early descent
    early = kind not in (
        "attention_collapse",
        "dead_ffn",
        "memory_blowup",
        "loss_spike",
        "loss_spike_unrecovered",
    )
    onset = int(kw["steps"] * c("onset", [0.3, 0.38, 0.45, 0.52] if early else [0.45, 0.5, 0.55, 0.6]))
    story = _mechanism(kind, kw, onset, i, hard)
    if kw["precision"] == "fp16" and kw["arch"] == "lstm":  # oneDNN has no fp16 LSTM on the CPU
        kw["arch"] = "transformer"
    if kw["precision"] == "fp16" and size == "medium":  # fp16 autocast is slow on the CPU
        size, kw["d_model"], kw["layers"], kw["heads"] = "small", *SIZES["small"]
    if trainer == "hf":
        kw["hf_args"] = {
            "logging_steps": kw["log_every"],
            "bf16": kw["precision"] == "bf16",
            **kw.get("hf_args", {}),
        }
        if i % 2:  # the example scripts' way: a console log beside HF's own files
            kw["console"] = "train.log"
    if trainer == "moe":
        kw.pop("trainer")
        kw["arch"] = "transformer"
        if "experts" not in kw:
            kw["experts"] = c("experts", [4, 8, 16])
            kw["top_k"] = c("top_k", [1, 2])
        spec: Spec = MoESpec("", kind, story, **kw)
    else:
        spec = Spec("", kind, story, **kw)
    name = f"{trainer}/{seed}_{optimizer}_{size}"
    family = {
        "trainer": trainer,
        "optimizer": optimizer,
        "size": size,
        "arch": spec.arch if trainer != "moe" else ("moe" if getattr(spec, "experts", 0) else "transformer"),
        "clip": spec.clip,
        "schedule": spec.schedule,
        "precision": spec.precision,
        "dataset": spec.dataset,
        "tags": "hf" if trainer == "hf" else spec.tags,
        "writers": "+".join(spec.writers) or "own",
        "batch": spec.batch,
        "log_every": spec.log_every,
        "hard_negative": hard,
        "family": f"{trainer}/{optimizer}/{size}",
    }
    return replace(spec, name=name, family=family)


def _mechanism(kind: str, kw: dict, onset: int, i: int, hard: str) -> str:
    """Set the failure mechanism (kw's bugs and what it needs) and return its story."""
    t = kw["trainer"]
    if kind == "healthy":
        return _hard_negative(hard, kw, onset)
    if kind in ("loss_spike", "loss_spike_unrecovered"):  # a spike averaged over 5+ steps is hidden
        kw["log_every"] = min(kw["log_every"], 2)
    if kind in ("divergence_nan", "divergence_nan_filtered"):
        kw["log_every"] = min(kw["log_every"], 5)
    if kind == "divergence_nan":
        rate = [1.25, 1.15, 1.3][i % 3]
        kw["bugs"] = {"lr_growth": (onset, rate)}
        if t == "hf":
            kw["hf_args"] = {"logging_nan_inf_filter": False}
        if t == "deepspeed":
            kw["precision"] = "fp32"
        return (
            f"lr schedule bug: lr grows {100 * (rate - 1):.0f} %/step from step {onset} until the loss is NaN"
        )
    if kind == "divergence_nan_filtered":
        kw["bugs"] = {"lr_growth": (onset, 1.25)}
        return (
            f"HF Trainer, lr grows 25 %/step from step {onset}: NaN from the divergence on; the Trainer's "
            "NaN filter keeps the logged loss finite, grad_norm and eval_loss show it"
        )
    if kind == "loss_spike":
        mult, length = [(60.0, 5), (100.0, 3), (40.0, 6)][i % 3]
        kw["bugs"] = {"lr_burst": (onset, onset + length, mult)}
        return f"lr x{mult:g} for {length} steps at step {onset} (a scheduler glitch); the loss spikes and recovers"
    if kind == "loss_spike_unrecovered":
        mult = [400.0, 250.0, 600.0][i % 3]
        kw["bugs"] = {"lr_burst": (onset, 10**6, mult)}
        return f"lr x{mult:g} from step {onset} on; the loss spikes and never comes back"
    if kind == "attention_collapse":
        kw["arch"] = "transformer"
        temp, decay = [(60.0, 0.85), (40.0, 0.8), (80.0, 0.85)][i % 3]
        kw["bugs"] = {"attn_temperature": (onset, temp), "freeze_decay": (onset, "output", decay)}
        return (
            f"at step {onset} the attention temperature goes to {temp:g} and the output path is frozen "
            f"and decays (x{decay:g}/step): attention entropy collapses, gradients vanish"
        )
    if kind == "dead_ffn":
        decay = [0.8, 0.75, 0.85][i % 3]
        kw["bugs"] = {"freeze_decay": (onset, "embeddings", decay)}
        return f"at step {onset} the embeddings are frozen and decay (x{decay:g}/step): every token looks the same"
    if kind == "overfitting":
        kw.update(
            train_size=[16, 24, 8][i % 3],
            weight_decay=0.0,
            eval_every=20,
            precision="bf16" if kw["precision"] == "fp16" else kw["precision"],
            dataset=["zen_of_python", "debian_copyright", "debian_licenses"][i % 3],
            arch="mlp" if kw["arch"] == "lstm" else kw["arch"],  # an LSTM this small does not memorise
            clip=max(kw["clip"], 1.0) if kw["clip"] else 0.0,
            steps=max(kw["steps"], 300),
        )
        if kw["optimizer"] == "sgd":
            kw["optimizer"], kw["lr"] = "adam", OPTIMIZERS["adam"]
        return (
            f"{kw['train_size']} training sequences of {kw['dataset']}, no weight decay: eval loss turns up"
        )
    if kind == "fp16_overflow":
        kw["precision"] = "fp16"
        mult = [1e4, 3e3, 1e4][i % 3]
        kw["log_every"] = min(kw["log_every"], 5)  # the storm lasts ~20 steps
        kw["bugs"] = {"lr_burst": (onset, 10**6, mult)}
        return f"fp16, lr x{mult:g} from step {onset} until the loss scale reaches its minimum"
    if kind == "plateau":
        start, rate = [(8, 0.88), (12, 0.9), (5, 0.85)][i % 3]
        kw["bugs"] = {"lr_decay": (start, rate)}
        kw["schedule"] = "constant" if kw["schedule"] == "cosine_restarts" else kw["schedule"]
        return f"lr decays {100 * (1 - rate):.0f} %/step from step {start} (a scheduler misconfiguration): the loss stalls high"
    if kind == "memory_blowup":
        gb = [3.3, 3.0, 3.5][i % 3]
        kw["bugs"] = {"leak_gb": (onset, gb), "freeze_decay": (onset, "output", 0.85)}
        if kw["writers"] == ("text",):  # the console line has no RSS
            kw["writers"] = ("tb", "text")
        return (
            f"at step {onset} a {gb:g} GB activation cache leaks while the output path is frozen and decays"
        )
    if kind == "memory_leak":
        budget, probe = [(1.4, 64), (1.6, 96), (1.5, 128)][i % 3]
        kw.update(experts=0, probe_seqs=probe, memory_budget_gb=budget, bugs={"probe_leak": onset}, steps=600)
        kw["writers"] = tuple(sorted({*kw["writers"], "text"}))
        return (
            f"from step {onset} the probe metric ({probe} sequences) runs without torch.no_grad() and keeps its "
            f"tensors until RSS passes the {budget:g} GB budget and the job is OOM-killed"
        )
    if kind == "router_collapse":
        coef = [-0.1, -0.06, -0.2][i % 3]
        kw["bugs"] = {"aux_coef": (onset, coef)} | ({"router_lr": (onset, 10.0)} if i % 2 else {})
        kw["experts"], kw["top_k"] = [8, 16, 4][i % 3], 1
        return f"at step {onset} the balance-loss coefficient becomes {coef:g} (a sign typo): one expert takes all"
    if kind == "balance_loss_dominates":
        coef, at = [1000.0, 3000.0, 500.0][i % 3], 22 + 4 * (i % 4)  # after its rule's 20-step baseline
        kw["bugs"] = {"aux_coef": (at, coef)}
        return f"at step {at} the balance-loss coefficient becomes {coef:g}: the LM loss stalls"
    raise ValueError(kind)


def _hard_negative(hard: str, kw: dict, onset: int) -> str:
    t = kw["trainer"]
    if hard == "clip_0.25":
        kw["clip"] = 0.25
        return "healthy, heavy clipping (max_norm 0.25: most steps clip)"
    if hard == "warm_restarts":
        kw["schedule"] = "cosine_restarts"
        return "healthy, cosine with warm restarts every third of the run (the lr jumps back to its peak)"
    if hard == "small_batch":
        kw["batch"] = 2 if kw["optimizer"] != "sgd" else 4
        return f"healthy, noisy small batches ({kw['batch']} sequences)"
    if hard == "fp16_skips" and t in ("loop", "deepspeed"):
        kw["precision"] = "fp16"
        return "healthy fp16: overflow skips while the loss scale settles, and at each growth probe"
    if hard == "resumed" and t in ("loop", "deepspeed"):
        kw["bugs"] = {"kill_at": onset // 50 * 50 + 30}
        return f"healthy, killed (no clean exit) at step {kw['bugs']['kill_at']}, resumed from the last checkpoint"
    if hard == "recovered_spike" and t == "loop":
        kw["bugs"] = {"bad_batch": onset}
        kw["log_every"] = 1
        return f"healthy, one corrupt batch (uniform random tokens) at step {onset}: a one-step loss spike"
    return "healthy"


# ---------------------------------------------------------------------------------------------
def select(specs: list[Spec], only: list[str] | None) -> list[Spec]:
    """Runs whose kind, trainer, optimizer, size, dataset... equals one of `only` (all if None)."""
    if not only:
        return specs
    return [s for s in specs if {s.kind, *map(str, s.family.values())} & set(only)]


def build(out: Path, jobs: int = 1, only: list[str] | None = None, limit: int | None = None) -> None:
    """Train the runs not done yet (DIR/SECONDS.tsv lists those done with their wall and CPU
    seconds and the spec they were trained with), then label them all."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    specs = diverse_specs()
    done = {s.seed for s in read_specs(out)}  # a run done keeps its spec, whatever the plan says now
    todo = _alternate([s for s in select(specs, only) if s.seed not in done])[:limit]
    t0 = time.time()
    by_name = {s.name: s for s in todo}
    for n, (name, secs, cpu) in enumerate(_train_all(out, todo, jobs), 1):
        with open(out / "SECONDS.tsv", "a") as f:
            f.write(f"{name}\t{secs:.1f}\t{cpu:.1f}\t{json.dumps(asdict(by_name[name]))}\n")
        print(
            f"[{n}/{len(todo)}] {name}: {secs:.0f}s, {cpu:.0f} CPU-s ({time.time() - t0:.0f}s elapsed)",
            flush=True,
        )
        if n % 25 == 0:  # labelling reads every run again
            write_outputs(out, len(specs))
    write_outputs(out, len(specs))


def _timed(args: tuple[Path, Spec]) -> tuple[str, float, float]:
    """corpus._one (one run, quiet, weights dropped) with its wall and CPU seconds (its own and
    its child processes')."""
    import resource

    from corpus import _one

    def cpu() -> float:
        return sum(
            u.ru_utime + u.ru_stime
            for u in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
        )

    c0 = cpu()
    name, secs = _one(args)
    out, spec = args
    for log in (out / spec.name).glob("*.log"):
        text = log.read_text(errors="replace")
        # DeepSpeed's own end of an overflow storm is an exception; any other is a crash
        if "Traceback (most recent call last)" in text and "loss scale already at minimum" not in text:
            raise RuntimeError(f"the trainer crashed: see {log}")
    return name, secs, cpu() - c0


def _alternate(specs: list[Spec]) -> list[Spec]:
    """Healthy and failing runs in turn (in plan order each), so that a build cut short has both."""
    healthy = [s for s in specs if s.kind == "healthy"]
    failing = [s for s in specs if s.kind != "healthy"]
    out = []
    for i in range(max(len(healthy), len(failing))):
        out += healthy[i : i + 1] + failing[i : i + 1]
    return out


def _train_all(out: Path, todo: list[Spec], jobs: int):
    if jobs <= 1:
        for spec in todo:
            try:
                yield _isolated(out, spec)
            except Exception as e:  # noqa: BLE001 - report it, go on; the run is tried again next time
                print(f"{spec.name}: FAILED to generate: {type(e).__name__}: {e}", flush=True)
        return
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(jobs, maxtasksperchild=1) as pool:
        yield from pool.imap_unordered(_timed, [(out, s) for s in todo])


def _isolated(out: Path, spec: Spec) -> tuple[str, float, float]:
    """One run in a forked child (its memory, threads and library state die with it)."""
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(1) as pool:
        return pool.apply(_timed, ((out, spec),))


def _done(out: Path) -> list[list[str]]:
    f = out / "SECONDS.tsv"
    return [line.split("\t") for line in f.read_text().splitlines() if line] if f.exists() else []


def read_seconds(out: Path) -> dict[str, float]:
    """The CPU seconds of each run done."""
    return {row[0]: float(row[2]) for row in _done(out)}


def read_specs(out: Path) -> list[Spec]:
    """The specs the runs done were trained with (the generator may have moved on since)."""
    specs = []
    for row in _done(out):
        d = json.loads(row[3])
        d["writers"] = tuple(d["writers"])
        specs.append(MoESpec(**d) if "experts" in d else Spec(**d))
    return specs


def write_outputs(out: Path, planned: int) -> None:
    from diverse_labels import write_labels, write_manifest, write_status

    seconds = read_seconds(out)
    done = [s for s in read_specs(out) if (out / s.name).exists()]
    rows = write_labels(out, done, seconds)
    write_manifest(out, done, seconds)
    write_status(out, rows, planned)
