"""Defaults <- file <- --set <- flags, with errors that name the key."""
import re

import pytest

from galapagos.config import SECTIONS, Config, EnsembleConfig, load_config, parse_value
from galapagos.evolve.errors import ConfigError
from galapagos.evolve.train import TrainConfig
from galapagos.options import TRAIN_TASK


def test_layers_of_config(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text("[train]\nepochs = 3\n[run]\nevaluations = 10\n")
    cfg = load_config(f, ["train.epochs=4", "space.channels=[4, 8]"], {"run.evaluations": 20})
    assert cfg.train.epochs == 4 and cfg.run.evaluations == 20 and list(cfg.space.channels) == [4, 8]
    again = Config.from_dict(__import__("tomllib").loads(cfg.dumps()))
    assert again == cfg


def test_parse_value():
    assert parse_value("3") == 3 and parse_value("2.5") == 2.5 and parse_value("true") is True
    assert parse_value("[1, 2]") == [1, 2] and parse_value("'a:b'") == "a:b" and parse_value("adam") == "adam"


@pytest.mark.parametrize("sets, key", [
    (["train.epochs=0"], "train.epochs"),
    (["train.epochs='x'"], "train.epochs"),
    (["run.nope=1"], "run.nope"),
    (["nosuch.key=1"], "nosuch"),
    (["run.task_timeout=-1"], "run.task_timeout"),
    (["evolution.strategy='grid'"], "evolution.strategy"),
    (["epochs=3"], "section.key=value"),
])
def test_errors_name_the_key(sets, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, sets)


# --- one validation style for all six tables (evolve.settings.Table) ---
BAD_TYPE = {"space": ("max_layers", "ten"), "evolution": ("seed", "abc"), "train": ("epochs", 2.5),
            "run": ("readers", "all"), "ensemble": ("strategy", 3), "report": ("mlflow_uri", 5),
            "data": ("shm_limit_mib", "lots")}
OUT_OF_RANGE = {"space": ("max_params", 0), "evolution": ("crossover_prob", 1.5), "train": ("eval_batch_size", 0),
                "run": ("chunk_mib", 4096), "ensemble": ("init", 0), "report": ("mlflow_experiment", " "),
                "data": ("buffer_chunks", 0)}


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_every_section_names_the_key(section):
    table = SECTIONS[section]
    assert table.section == section and table.from_dict(table().to_dict()) == table()
    with pytest.raises(ConfigError, match=rf"^{section}\.nosuchkey: unknown key"):
        table.from_dict({"nosuchkey": 1})
    key, value = BAD_TYPE[section]
    with pytest.raises(ConfigError, match=rf"^{section}\.{key}: expected an? .+, got {re.escape(repr(value))}$"):
        table.from_dict({key: value})
    key, value = OUT_OF_RANGE[section]
    with pytest.raises(ConfigError, match=rf"^{section}\.{key}: expected .+, got {re.escape(repr(value))}$"):
        table.from_dict({key: value})
    with pytest.raises(ConfigError, match=rf"^{section}: expected a table"):
        table.from_dict([1])


@pytest.mark.parametrize("key, value, expected", [
    ("refit_epochs", -1, "at least 0"), ("refit_lr", 0, "a share above 0"), ("refit_lr", 1.5, "a share above 0")])
def test_the_refit_settings_are_checked(key, value, expected):
    with pytest.raises(ConfigError, match=rf"^ensemble\.{key}: expected {expected}"):
        load_config(None, [f"ensemble.{key}={value}"])


def test_tables_accept_ints_for_floats_and_lists_for_tuples():
    cfg = Config.from_dict({"run": {"budget_minutes": 5}, "space": {"lr": [1, 2], "channels": [8, 8, 4]},
                            "evolution": {"mutations": 2}})
    assert cfg.run.budget_minutes == 5.0 and isinstance(cfg.run.budget_minutes, float)
    assert cfg.space.lr == (1.0, 2.0) and all(isinstance(v, float) for v in cfg.space.lr)
    assert cfg.space.channels == (8, 4) and cfg.evolution.mutations == (2, 2)
    with pytest.raises(ConfigError, match=r"^ensemble\.strategy: expected one of distinct, seeds, mixed"):
        EnsembleConfig(strategy="best")  # built directly, a table checks itself the same way
    with pytest.raises(ConfigError, match=r"^train\.mixed_precision: expected true or false, got 1$"):
        TrainConfig(mixed_precision=1)


def test_a_config_written_before_the_one_namespace_runs_galapagos_s_own_task(tmp_path):
    """Run directories of before 0.2 name the default task by its old top-level module; --resume reads them."""
    old = tmp_path / "config.toml"
    old.write_text('[run]\ntask = "evolve.train:train_task"\nevaluations = 4\n')
    assert load_config(old).run.task == TRAIN_TASK == "galapagos.evolve.train:train_task"
    mine = tmp_path / "mine.toml"
    mine.write_text('[run]\ntask = "mylab.tasks:train"\n')
    assert load_config(mine).run.task == "mylab.tasks:train"


def test_the_heartbeat_follows_the_job_under_auto_and_a_set_one_is_kept(tmp_path):
    """run.heartbeat = "auto" (the default): 10 s, and from 20,000 workers on long enough that the workers' Alive
    messages stay at config.ALIVE_RATE a second, the timeouts at least three beats; a number is taken as given."""
    from galapagos.config import ALIVE_RATE

    auto = load_config(None)
    assert auto.run.heartbeat == load_config(None, ['run.heartbeat="auto"']).run.heartbeat == 0
    small = auto.run.liveness(tmp_path / "alive", 1000)
    assert (small.interval, small.worker_timeout, small.master_timeout) == (10.0, 30.0, 60.0)
    assert small.master_file == str(tmp_path / "alive")
    aurora = auto.run.liveness(tmp_path / "alive", 127_488)
    assert aurora.interval == pytest.approx(127_488 / ALIVE_RATE) and aurora.interval > 60
    assert aurora.worker_timeout == aurora.master_timeout == pytest.approx(3 * aurora.interval)
    given = load_config(None, ["run.heartbeat=5"]).run.liveness(tmp_path / "alive", 127_488)
    assert (given.interval, given.worker_timeout, given.master_timeout) == (5.0, 30.0, 60.0)
    with pytest.raises(ConfigError, match="run.heartbeat"):
        load_config(None, ["run.heartbeat=-1"])
