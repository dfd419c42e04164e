"""The peers of bench/search.py: Optuna's samplers searching Galapagos's space, and what they share with the expert
(the training data as a Galapagos worker has it, one process per core, the best network saved).

- `tpe`, `optuna-random`: Optuna's TPESampler or RandomSampler at their defaults, with a MedianPruner on the config's
  `run.prune_after` and `run.prune_min_results`.
- `tpe-best`: TPE at its best (bench/PROTOCOL.md): multivariate, with the constant liar for the trials running in the
  other processes (https://optuna.readthedocs.io/en/stable/reference/samplers/generated/optuna.samplers.TPESampler.html),
  Optuna's HyperbandPruner over the epochs
  (https://optuna.readthedocs.io/en/stable/reference/generated/optuna.pruners.HyperbandPruner.html), and warm-started
  with the prior networks evolution starts from (evolve/priors.py), each enqueued as its trial's parameters
  (`study.enqueue_trial`, `trial_params`).
"""
from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import torch

from galapagos.config import Config, load_config
from galapagos.datashare.format import inspect, load
from galapagos.evolve.check import check_genome
from galapagos.evolve.errors import InvalidGenome
from galapagos.evolve.genome import GENE_FIELDS, Gene, Genome
from galapagos.evolve.netdir import NetworkDir
from galapagos.evolve.priors import prior_genomes
from galapagos.evolve.problem import Problem
from galapagos.evolve.space import SearchSpace
from galapagos.evolve.train import normalization_stats, train_candidate

MAX_DENSE = 3  # dense-section genes of a sampled network with a spatial section, as evolve.space samples them
OPTUNA = ("tpe", "tpe-best", "optuna-random")


class Deadline(Exception):
    """The contestant's wall time is over: the trial in training is abandoned, as Galapagos abandons its tasks."""


def _gene(trial, name: str, gene_type: str, space: SearchSpace, problem: Problem) -> Gene:
    values = {f: trial.suggest_float(f"{name}_{gene_type}_rate", *space.dropout) if f == "rate"
              else trial.suggest_categorical(f"{name}_{gene_type}_{f}", space.field_choices(problem, f))
              for f in GENE_FIELDS[gene_type]}
    return Gene(gene_type, **values)


def genome_from_trial(trial, space: SearchSpace, problem: Problem) -> Genome:
    """A genome of Galapagos's search space from an Optuna trial, drawn as evolve.space draws a random network: a
    layer count, a spatial section starting with conv or residual, then up to MAX_DENSE genes starting with dense
    (only dense-section genes for tabular data), and the training genes. Not yet repaired: see check_genome."""
    n = trial.suggest_int("layers", space.min_layers, space.max_layers)
    spatial, dense = space.section_types(problem, "spatial"), space.section_types(problem, "dense")
    if problem.spatial_dims == 0 or not spatial:
        n_dense = n
    else:
        n_dense = trial.suggest_int("dense_layers", 0, min(MAX_DENSE, n)) if "dense" in dense else 0
    layers = []
    first = tuple(t for t in ("conv", "residual") if t in spatial) or spatial
    for i in range(n - n_dense):
        gene_type = trial.suggest_categorical(f"spatial{i}", first if i == 0 else spatial)
        layers.append(_gene(trial, f"spatial{i}", gene_type, space, problem))
    for i in range(n_dense):
        gene_type = "dense" if i == 0 and "dense" in dense else trial.suggest_categorical(f"dense{i}", dense)
        layers.append(_gene(trial, f"dense{i}", gene_type, space, problem))
    decay = 0.0
    if space.weight_decay != (0.0, 0.0) and (space.zero_weight_decay_prob == 0
                                             or trial.suggest_categorical("weight_decay_on", (True, False))):
        decay = trial.suggest_float("weight_decay", *space.weight_decay, log=True)
    return Genome(layers=tuple(layers), optimizer=trial.suggest_categorical("optimizer", space.optimizers),
                  lr=trial.suggest_float("lr", *space.lr, log=True),
                  batch_size=trial.suggest_categorical("batch_size", space.batch_sizes), weight_decay=decay,
                  head=trial.suggest_categorical("head", space.heads) if problem.spatial_dims else space.heads[0],
                  shift=_suggest_shift(trial, space, problem))


def _suggest_shift(trial, space: SearchSpace, problem: Problem) -> float:
    shifts = space.shift_choices(problem)  # suggested only where there is a choice, as evolution draws it
    return trial.suggest_categorical("shift", shifts) if len(shifts) > 1 else shifts[0]


def trial_params(genome: Genome, space: SearchSpace, problem: Problem) -> dict | None:
    """The parameters of a trial for which genome_from_trial draws `genome` (for `study.enqueue_trial`), or None
    where no trial draws it (a gene type, value or section length outside what a trial draws)."""
    layers, n = list(genome.layers), len(genome.layers)
    spatial, dense = space.section_types(problem, "spatial"), space.section_types(problem, "dense")
    sections = bool(problem.spatial_dims and spatial)
    cut = next((i for i, g in enumerate(layers) if g.type == "dense"), n) if sections else 0
    params: dict = {"layers": n}
    if sections and "dense" in dense:
        params["dense_layers"] = n - cut
    elif sections and cut < n:
        return None
    if sections and n - cut > min(MAX_DENSE, n):
        return None
    first = tuple(t for t in ("conv", "residual") if t in spatial) or spatial
    named = [(f"spatial{i}", g, first if i == 0 else spatial) for i, g in enumerate(layers[:cut])]
    named += [(f"dense{i}", g, ("dense",) if i == 0 and "dense" in dense else dense)
              for i, g in enumerate(layers[cut:])]
    for name, gene, types in named:
        if gene.type not in types:
            return None
        if name != "dense0" or "dense" not in dense:  # genome_from_trial's first dense gene is dense, unsuggested
            params[name] = gene.type
        for f in GENE_FIELDS[gene.type]:
            params[f"{name}_{gene.type}_{f}"] = gene[f]
    if space.weight_decay != (0.0, 0.0):
        if space.zero_weight_decay_prob:
            params["weight_decay_on"] = genome.weight_decay > 0
        if genome.weight_decay > 0 or not space.zero_weight_decay_prob:
            params["weight_decay"] = genome.weight_decay
    elif genome.weight_decay:
        return None
    params.update(optimizer=genome.optimizer, lr=genome.lr, batch_size=genome.batch_size)
    if problem.spatial_dims:
        params["head"] = genome.head
    if len(space.shift_choices(problem)) > 1:  # a shift outside the choices: _within says no
        params["shift"] = genome.shift
    return params if _within(params, genome, space, problem) else None


def _within(params: dict, genome: Genome, space: SearchSpace, problem: Problem) -> bool:
    """Whether every categorical value is among the space's choices and every number in its range."""
    for gene in genome.layers:
        for f in GENE_FIELDS[gene.type]:
            if f == "rate" and not space.dropout[0] <= gene[f] <= space.dropout[1]:
                return False
            if f != "rate" and gene[f] not in space.field_choices(problem, f):
                return False
    return (space.min_layers <= len(genome.layers) <= space.max_layers and genome.optimizer in space.optimizers
            and space.lr[0] <= genome.lr <= space.lr[1] and genome.batch_size in space.batch_sizes
            and (not problem.spatial_dims or genome.head in space.heads)
            and genome.shift in space.shift_choices(problem)
            and ("weight_decay" not in params or space.weight_decay[0] <= genome.weight_decay <= space.weight_decay[1]))


def _sampler_and_pruner(optuna, contestant: str, config: Config, seed: int):
    """The contestant's sampler and pruner (see the module's docstring)."""
    run = config.run
    if contestant == "tpe-best":
        return (optuna.samplers.TPESampler(multivariate=True, constant_liar=True, seed=seed),
                optuna.pruners.HyperbandPruner(min_resource=1, max_resource=config.train.epochs, reduction_factor=3)
                if run.prune else optuna.pruners.NopPruner())
    sampler = (optuna.samplers.TPESampler if contestant == "tpe" else optuna.samplers.RandomSampler)(seed=seed)
    return sampler, (optuna.pruners.MedianPruner(n_startup_trials=run.prune_min_results,
                                                 n_warmup_steps=run.prune_after)
                     if run.prune else optuna.pruners.NopPruner())


def _storage(path: Path):
    """The study's storage: a journal file that the contestant's processes share (Optuna's choice for several
    processes on one machine without a database server)."""
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend
    return JournalStorage(JournalFileBackend(str(path)))


def training_data(data: Path) -> tuple[Problem, dict, dict]:
    """The problem, the train and val tensors and the normalisation a worker of Galapagos would use."""
    info, arrays = load(data, ("train", "val"))
    problem = Problem.of_dataset(info)
    tensors = {split: tuple(torch.from_numpy(a) for a in arrays[split]) for split in ("train", "val")}
    return problem, tensors, normalization_stats(*tensors["train"], problem.task)


def spawn(target, args: list[tuple], who: str) -> None:
    """Run one process per tuple of arguments (spawned: no torch state inherited) and wait for all of them."""
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=target, args=a) for a in args]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    if failed := [p.exitcode for p in procs if p.exitcode]:
        raise RuntimeError(f"{who}: {len(failed)} process(es) failed (exit codes {failed}); their tracebacks are above")


def save_best(out: Path, data: Path, genome: dict, fitness: float, weights: Path) -> Path:
    NetworkDir(out / "best").write(genome, {"problem": Problem.of_dataset(inspect(data)).to_dict(),
                                            "fitness": fitness}, weights_from=weights)
    return out / "best"


def optuna_worker(contestant: str, storage: Path, data: Path, config: Config, seed: int, worker: int, core: int,
                  deadline: float, out: Path) -> None:
    """One of the W processes of an Optuna contestant: trials until the deadline."""
    import optuna
    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # no line per trial
    problem, tensors, stats = training_data(data)
    sampler, pruner = _sampler_and_pruner(optuna, contestant, config, 1000 * seed + worker)

    def objective(trial) -> float:
        try:
            genome = check_genome(genome_from_trial(trial, config.space, problem), problem, config.space)
        except InvalidGenome as exc:
            trial.set_user_attr("invalid", str(exc))
            raise optuna.TrialPruned() from None
        trial.set_user_attr("genome", genome.to_json())

        def report(metrics: dict) -> None:
            if time.time() >= deadline:
                trial.set_user_attr("abandoned", True)
                raise Deadline
            trial.report(metrics["fitness"], metrics["epoch"])
            if metrics["epoch"] < config.train.epochs and trial.should_prune():
                raise optuna.TrialPruned()

        summary, state = train_candidate(genome, problem, tensors, config.train, seed=seed * 1_000_003 + trial.number,
                                         report=report, stats=stats)
        torch.save(state, out / f"{trial.number}.pt")
        return summary["fitness"]

    try:  # a diverged candidate (NonFiniteLoss) is a failed trial, as Galapagos records it `nan`
        study = optuna.load_study(study_name="search", storage=_storage(storage), sampler=sampler, pruner=pruner)
        if contestant == "tpe-best" and worker == 0:  # warm-started with the networks evolution starts from
            for genome in prior_genomes(config.space, problem):
                if (params := trial_params(genome, config.space, problem)) is not None:
                    study.enqueue_trial(params)
        study.optimize(objective, timeout=max(0.0, deadline - time.time()), catch=(FloatingPointError,))
    except Deadline:
        pass


def run_optuna(contestant: str, data: Path, config_path: Path, out: Path, seed: int, workers: int,
               cores: list[int], deadline: float, sets: list[str]) -> dict:
    import optuna
    from optuna.trial import TrialState
    config = load_config(config_path, sets)
    out.mkdir(parents=True)
    storage = out / "journal.log"
    optuna.create_study(study_name="search", direction="maximize", storage=_storage(storage))
    spawn(optuna_worker, [(contestant, storage, data, config, seed, w, cores[w % len(cores)], deadline, out)
                           for w in range(workers)], contestant)
    trials = optuna.load_study(study_name="search", storage=_storage(storage)).get_trials(deepcopy=False)
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    status = {"ok": done,
              "pruned": [t for t in trials if t.state == TrialState.PRUNED and "invalid" not in t.user_attrs],
              "failed": [t for t in trials if t.state == TrialState.FAIL and "abandoned" not in t.user_attrs],
              "invalid": [t for t in trials if "invalid" in t.user_attrs]}
    row = {"evaluations": sum(len(status[s]) for s in ("ok", "pruned", "failed")),
           "by_status": {s: len(v) for s, v in status.items() if v}, "val": None, "model": None}
    if done:
        best = max(done, key=lambda t: t.value)
        row.update(val=best.value, model=save_best(out, data, best.user_attrs["genome"], best.value,
                                                    out / f"{best.number}.pt"))
    return row


