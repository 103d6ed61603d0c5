"""MoE runs and memory-budget runs for sample_runs/ (their specs are in specs.py; trainers.py runs them).

The MoE runs train `moe_model.MoETinyLM` (top-k routed experts with the Switch balance loss) on
the same synthetic language as the other runs and log per step what MoE trainers log:

    train/loss                        the LM cross-entropy (the main loss)
    moe/balance_loss                  coefficient x sum over layers of the Switch aux loss
    moe/total_loss                    train/loss + moe/balance_loss (what backward() runs on)
    moe/aux_loss_coef                 the balance-loss coefficient in force
    moe/layer_L/expert_load/E         tokens routed to expert E in layer L this step
    moe/layer_L/max_load, mean_load   max and mean of those counts
    moe/layer_L/router_entropy        mean entropy of the router's softmax (nats; ln E = uniform)
    train/grad_norm, train/lr, train/router_lr, eval/loss, the model's layer statistics

The memory-budget runs train the dense model with a per-step probe metric and log their resident
memory against a stated budget (`memory_budget_gb` in the TensorBoard hparams):

    memory/rss_gb, memory/budget_gb, memory/rss_pct_of_budget

They run as a child process under a supervisor that enforces the budget the way a cgroup
memory limit does: when the child's RSS passes the budget it is killed with SIGKILL (no clean
exit, no traceback, writers stop mid-run) and the supervisor appends the kernel OOM killer's
message line, with the child's real numbers, to the job's console log (stdout.log).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from specs import SPEC_ENV, MoESpec
from training import Loggers, lr_at, make_optimizer, rss_gb, save_checkpoint

HERE = Path(__file__).resolve().parent


# ---------------------------------------------------------------------------------------------
def aux_coef_at(spec: MoESpec, step: int) -> float:
    coef, b = spec.aux_coef, spec.bugs
    if "aux_coef" in b and step >= b["aux_coef"][0]:
        coef = b["aux_coef"][1]
    if "aux_coef_growth" in b and step >= b["aux_coef_growth"][0]:
        coef *= b["aux_coef_growth"][1] ** (step - b["aux_coef_growth"][0])
    return coef


def bias_rate_at(spec: MoESpec, step: int) -> float:
    """The aux-loss-free bias step; the sign-flip bug makes overloaded experts more attractive."""
    b = spec.bugs
    rate = b["bias_rate"][1] if "bias_rate" in b and step >= b["bias_rate"][0] else spec.bias_rate
    return -rate if "bias_sign_flip" in b and step >= b["bias_sign_flip"] else rate


def router_lr_mult(spec: MoESpec, step: int) -> float:
    b = spec.bugs.get("router_lr")
    return b[1] if b and step >= b[0] else 1.0


def train_moe(spec: MoESpec, run: Path) -> None:
    import torch
    from data import sequences, vocab_size
    from model import SEQ, build_model, layer_grad_norms
    from moe_model import MoETinyLM

    torch.manual_seed(spec.seed)
    train, evalset = sequences(spec.dataset, spec.train_size, spec.seed)
    probe = sequences(spec.dataset, spec.probe_seqs, seed=998)[0] if spec.probe_seqs else None
    moe = spec.experts > 0
    vocab = vocab_size(spec.dataset)
    model = (
        MoETinyLM(d=spec.d_model, experts=spec.experts, top_k=spec.top_k, layers=spec.layers, vocab=vocab)
        if moe
        else build_model(spec.arch, spec.d_model, spec.layers, spec.heads, vocab, SEQ)
    )
    routers = model.router_parameters() if moe else []
    ids = {id(p) for p in routers}
    groups = [{"params": [p for p in model.parameters() if id(p) not in ids]}]
    if moe:
        groups.append({"params": routers})
    opt = make_optimizer(spec, groups)
    logs = Loggers(run, spec.writers, scheme=spec.tags)
    if logs.tb is not None:
        hp = {"lr": spec.lr, "d_model": spec.d_model, "seed": spec.seed, "batch_size": spec.batch}
        if moe:
            hp |= {"num_experts": spec.experts, "top_k": spec.top_k, "aux_loss_coef": spec.aux_coef}
        if spec.memory_budget_gb:
            hp["memory_budget_gb"] = spec.memory_budget_gb
        logs.tb.add_hparams(hp, {})
    g = torch.Generator().manual_seed(spec.seed * 1000)
    probe_hist: list = []
    b = spec.bugs
    for step in range(spec.steps):
        coef = aux_coef_at(spec, step)
        lr = lr_at(spec, step)
        opt.param_groups[0]["lr"] = lr
        if moe:
            opt.param_groups[1]["lr"] = lr * router_lr_mult(spec, step)
        t0 = time.perf_counter()
        batch = train[torch.randint(0, len(train), (spec.batch,), generator=g)]
        out = model(batch[:, :-1], batch[:, 1:])
        stats = dict(model.stats)
        balance = coef * model.aux_loss() if moe else torch.zeros(())
        total = out["loss"] + balance
        opt.zero_grad(set_to_none=True)
        total.backward()
        params = [p for p in model.parameters() if p.grad is not None]
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, spec.clip if spec.clip > 0 else math.inf))
        layer_norms = layer_grad_norms(model)
        opt.step()
        if moe and bias_rate_at(spec, step):
            for layer in model.moe_layers():
                layer.update_bias(bias_rate_at(spec, step))
        dt = time.perf_counter() - t0
        metrics = {
            "train/loss": float(out["loss"].detach()),
            "train/lr": lr,
            "train/grad_norm": grad_norm,
            **layer_norms,
            **stats,
            "throughput/tokens_per_sec": batch[:, :-1].numel() / dt,
        }
        if moe:
            metrics |= {
                "train/router_lr": opt.param_groups[1]["lr"],
                "moe/aux_loss_coef": coef,
                "moe/balance_loss": float(balance.detach()),
                "moe/total_loss": float(total.detach()),
            }
            for li, layer in enumerate(model.moe_layers()):
                load = layer.load.tolist()
                metrics |= {f"moe/layer_{li}/expert_load/{e}": c for e, c in enumerate(load)}
                metrics[f"moe/layer_{li}/max_load"] = max(load)
                metrics[f"moe/layer_{li}/mean_load"] = sum(load) / len(load)
                metrics[f"moe/layer_{li}/router_entropy"] = layer.entropy
        if probe is not None:
            # a smoothed held-out loss; the leak bug drops torch.no_grad() and keeps the tensors
            leak = "probe_leak" in b and step >= b["probe_leak"]
            with torch.set_grad_enabled(leak):
                probe_hist.append(model(probe[:, :-1], probe[:, 1:])["loss"])
            metrics["train/probe_loss"] = float(torch.stack(probe_hist[-20:]).mean())
        rss = rss_gb()
        metrics["memory/rss_gb"] = rss
        if spec.memory_budget_gb:
            metrics["memory/budget_gb"] = spec.memory_budget_gb
            metrics["memory/rss_pct_of_budget"] = 100 * rss / spec.memory_budget_gb
        if step % spec.eval_every == 0 or step == spec.steps - 1:
            with torch.no_grad():
                metrics["eval/loss"] = float(model(evalset[:, :-1], evalset[:, 1:])["loss"])
        logs.log(step, spec.steps, metrics)
        if spec.memory_budget_gb:  # the supervisor may kill us at any moment: keep the logs on disk
            for w in (logs.tb, logs.jsonl, logs.text):
                if w is not None:
                    w.flush()
        if step % 50 == 0 and step > 0:
            save_checkpoint(model, opt, run, spec, step)
    logs.close()


# ---------------------------------------------------------------------------------------------
def _status_kb(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if rest.strip().endswith("kB"):
                out[key] = int(rest.split()[0])
    return out


def run_supervised(spec: MoESpec, run: Path) -> None:
    """The child trains; this process enforces memory_budget_gb on its RSS like a cgroup limit."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", SPEC_ENV: json.dumps(asdict(spec))}
    limit = spec.memory_budget_gb * 1e9
    page = os.sysconf("SC_PAGE_SIZE")
    with open(run / "stdout.log", "a") as console:
        child = subprocess.Popen(
            [sys.executable, str(HERE / "moe.py"), "--worker"],
            cwd=run,
            env=env,
            stdout=console,
            stderr=subprocess.STDOUT,
        )
        while child.poll() is None:
            try:
                with open(f"/proc/{child.pid}/statm") as f:
                    rss = int(f.read().split()[1]) * page
                if rss > limit:
                    st = _status_kb(child.pid)
                    child.send_signal(signal.SIGKILL)
                    child.wait()
                    console.write(
                        f"Memory cgroup out of memory: Killed process {child.pid} (python) "
                        f"total-vm:{st.get('VmSize', 0)}kB, anon-rss:{st.get('RssAnon', 0)}kB, "
                        f"file-rss:{st.get('RssFile', 0)}kB, shmem-rss:{st.get('RssShmem', 0)}kB, "
                        f"UID:{os.getuid()} pgtables:{st.get('VmPTE', 0)}kB oom_score_adj:0\n"
                    )
                    break
            except (FileNotFoundError, ProcessLookupError):
                pass
            time.sleep(0.002)
        child.wait()


def run_moe(spec: MoESpec, run: Path) -> None:
    if spec.memory_budget_gb:
        run_supervised(spec, run)
    else:
        train_moe(spec, run)


def _worker() -> None:
    import torch

    torch.set_num_threads(1)
    d = json.loads(os.environ[SPEC_ENV])
    spec = MoESpec(**{**d, "writers": tuple(d["writers"])})
    train_moe(spec, Path.cwd())


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    _worker()
