"""Canonical metric names: which logged tags mean `loss`, `eval_loss`, `grad_norm`, `lr`, ...

`tag` always keeps the key as it was logged; the canonical name goes in the `metric` column,
resolved at query time so that editing `workbench.toml` applies to data already stored:

    [aliases]
    loss = ["my_model/train_xent", "train/*_loss"]   # globs over tags; they win over built-ins
"""

from __future__ import annotations

import re
from pathlib import Path

import duckdb

import workbench.store.config as config
from workbench.store.sql import literal

# What a tag means is read from its words: `normalized_sql` splits camelCase, lower-cases and
# joins the words with `_` (`Loss/train` -> loss_train, `train/CrossEntropyLoss` ->
# train_cross_entropy_loss, `LR/group0` -> lr_group0), and each pattern below is matched
# against the whole of that. First match wins; user aliases (globs over the tag as logged) come
# before all of them.
TRAIN = r"(?:train|training)"
EVAL = r"(?:eval|evaluation|val|valid|validation|test)"
LOSS = r"(?:(?:lm|total|cross_entropy|ce)_)?loss"
KERAS = r"(?:(?:epoch|batch)_)?"  # Keras names its series epoch_loss, batch_loss
OPTIM = r"(?:(?:train|training|optim|optimizer)_)?"
# Lightning's grad_norm() logs the total 2-norm as grad_2.0_norm_total (words: grad_2_0_norm_total)
GRAD_NORM = (
    r"(?:(?:total|global)_)?(?:grad|grads|gradient)_?(?:l2_|2_0_|2_)?norm(?:_total)?|grad_total_norm|gnorm"
)
BUILTIN: list[tuple[str, str]] = [
    # a train/val/eval part before or after the loss word; Lightning's `_step` series is the
    # training loss (its `_epoch` mean beside it is not: it would double every epoch's last
    # step), and the validation loss is the `_epoch` one; Keras 3 logs the validation loss
    # by iteration as evaluation_loss_vs_iterations
    ("loss_scale", rf"(?:(?:{TRAIN}|derived)_)?loss_scale|train_samples_loss_scale"),
    ("eval_loss", rf"{EVAL}_(?:{EVAL}_)?{KERAS}{LOSS}(?:_epoch)?|{KERAS}{LOSS}_{EVAL}(?:_epoch)?"),
    ("eval_loss", r"(?:validation_)?evaluation_loss_vs_iterations|lm_loss_validation"),
    ("eval_loss", "tel"),  # llm.c main.log: `s:N tel:X` (test loss)
    # an eval metric that rises as the model learns: HF's eval_accuracy / eval_f1, Keras'
    # val_accuracy, Lightning's val_acc (the guides' P3 reads it where no eval loss moves)
    (
        "eval_accuracy",
        rf"{EVAL}_{KERAS}(?:acc|accuracy|f1|f1_score|exact_match)(?:_epoch)?|(?:acc|accuracy|f1)_{EVAL}(?:_epoch)?",
    ),
    ("loss", rf"(?:{TRAIN}_)?{KERAS}{LOSS}(?:_{TRAIN})?(?:_step)?|train_samples_train_loss"),
    ("loss", "trl"),  # llm.c main.log: `s:N trl:X lr:Y norm:Z` (train loss)
    ("grad_norm", rf"{OPTIM}(?:{GRAD_NORM})(?:_step)?"),
    ("grad_norm", "norm"),  # llm.c main.log
    ("lr", rf"{OPTIM}(?:epoch_)?(?:lr|learning_rate)(?:_?0|_group_?0|_pg_?0)?|train_samples_lr"),
    # by unit: samples or tokens per second; a bare `throughput` is LLaMA-Factory's tokens per
    # second (tokens seen / elapsed seconds), as trainer_log.jsonl writes it
    ("samples_per_sec", rf"(?:{TRAIN}_)?(?:running_avg_)?samples_?per_?sec(?:ond)?|samples_sec(?:ond)?"),
    (
        "tokens_per_sec",
        rf"(?:(?:{TRAIN}|throughput)_)?(?:device_)?(?:tokens?|tok)_(?:per_)?(?:sec(?:ond)?|s)|tps|throughput",
    ),
    ("memory_gb", r"memory_rss_gb|mem_gb|memory_gb"),  # the process's memory
    # the accelerator's (DeepSpeed, torch.cuda)
    ("memory_allocated_gb", r"mem_allocated|memory_allocated(?:_gb)?"),
    ("memory_reserved_gb", r"(?:gpu_)?memory_(?:max_)?reserved(?:_gb)?|max_memory_reserved(?:_gb)?"),
    ("memory_total_gb", r"(?:gpu_)?memory_total(?:_gb)?|memory_budget_gb"),
    (
        "memory_reserved_pct",
        r"memory_rss_pct_of_budget|(?:gpu_)?memory_reserved_?(?:pct|percent)|gpu_memory_gpu_reserved_mem",
    ),
    # mixture-of-experts routing (DeepSpeed-MoE, Megatron, HF Mixtral, OLMo-core names)
    ("moe_max_load", r"moe_max_load|moe_(?:layer_?\d+_)?max_load"),
    ("moe_mean_load", r"moe_mean_load|moe_(?:layer_?\d+_)?mean_load"),
    ("balance_loss", r"(?:moe_)?balance_loss|(?:train_)?(?:router_)?aux_loss|(?:train_)?load_balancing_loss"),
    ("attn_entropy", r"attn(?:_output)?_entropy|attention_entropy"),
    ("ln_input_std", r"ln_input_std(?:_layer_0)?"),
]
# what a tag that maps to nothing looks like, for `workbench tags` and the view unmapped_tags
LOOKS_LIKE: list[tuple[str, str]] = [
    ("loss", r"(?:^|_|[a-z])loss(?:_(?:step|epoch|train|training|val|valid|eval|test|avg|mean))?$"),
    ("grad_norm", r"grad.*norm|gnorm|norm.*grad"),
]
PART_OF_A_WHOLE = r"layer|_\d+$"  # a per-layer or per-group series: not the one a rule needs


def normalized_sql(column: str) -> str:
    """SQL for a tag's words: camelCase split, `%` as `pct`, lower case, every run of other
    characters one `_`."""
    split = f"regexp_replace(replace({column}, '%', ' pct '), '([a-z])([A-Z])', '\\1_\\2', 'g')"
    return f"trim(regexp_replace(lower({split}), '[^a-z0-9]+', '_', 'g'), '_')"


def load_user_aliases(*config_dirs: Path) -> dict[str, list[str]]:
    """`[aliases]` from `workbench.toml` in the given folders (later folders win). A glob with
    no literal character (`*`, `?*`) would name every tag one metric, and is refused
    (ConfigError naming the file and line), as is a value that is not a glob or a list of them."""
    merged: dict[str, list[str]] = {}
    for f, table in config.section("aliases", *config_dirs):
        for metric, globs in table.items():
            where = config.line_of(f, rf"^\s*\"?{re.escape(metric)}\"?\s*=") or 1
            listed = [globs] if isinstance(globs, str) else globs
            if not isinstance(listed, list) or not all(isinstance(g, str) for g in listed):
                raise config.ConfigError(
                    f"{f}, line {where}: alias {metric} must be a glob or a list of globs over tags "
                    f'(e.g. {metric} = ["my_model/*_loss"]), got {globs!r}'
                )
            if wild := [g for g in listed if not g.strip("*?")]:
                raise config.ConfigError(
                    f"{f}, line {where}: alias {metric} = {wild[0]!r} matches every tag: each would "
                    f"read as {metric} (hiding what the others mean); name the tags, e.g. "
                    f'{metric} = ["my_model/train_xent", "train/*_loss"]'
                )
            merged[metric] = list(listed)
    return merged


def glob_regex(glob: str) -> str:
    """`*` any run of characters, `?` one character, everything else literal."""
    return "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in glob)


def metric_case_sql(column: str, user: dict[str, list[str]] | None = None, words: str | None = None) -> str:
    """A SQL CASE expression mapping a tag column to its canonical metric (NULL if none);
    `words`: a column holding `normalized_sql(column)` already (worked out once per tag, not
    once per pattern)."""
    arms = []
    for metric, globs in (user or {}).items():
        for g in globs:
            regex = glob_regex(g)
            arms.append(f"WHEN regexp_full_match({column}, {literal(regex)}) THEN {literal(metric)}")
    words = words or normalized_sql(column)
    for metric, regex in BUILTIN:
        arms.append(f"WHEN regexp_full_match({words}, {literal(regex)}) THEN {literal(metric)}")
    return "CASE " + " ".join(arms) + " ELSE NULL END"


def metrics_of(tags: list[str], user: dict[str, list[str]] | None = None) -> dict[str, str | None]:
    """tag -> canonical metric (None if none) of these tags, as the store's views resolve them."""
    rows = duckdb.execute(
        f"SELECT tag, {metric_case_sql('tag', user)} FROM (SELECT unnest(?::VARCHAR[]) AS tag)", [tags]
    ).fetchall()
    return dict(rows)


def looks_like_sql(column: str, metric: str) -> str:
    """A SQL CASE naming the canonical metric a tag that maps to none (`metric` NULL) looks like:
    `loss` or `grad_norm` (the series every loss and gradient rule needs), else NULL."""
    words = normalized_sql(column)
    arms = [
        f"WHEN regexp_matches({words}, {literal(regex)}) THEN {literal(name)}" for name, regex in LOOKS_LIKE
    ]
    whole = f"NOT regexp_matches({words}, {literal(PART_OF_A_WHOLE)})"
    return f"CASE WHEN {metric} IS NULL AND {whole} THEN CASE {' '.join(arms)} END END"
