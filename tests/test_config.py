"""Defaults <- file <- --set <- flags, with errors that name the key."""
import pytest

from evolve.errors import ConfigError
from galapagos.config import Config, load_config, parse_value


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
