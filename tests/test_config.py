"""Config: explicit argument > environment > default; bad values name the setting."""
import pytest

from planner import Config, ConfigError
from planner.config import ENV


def test_defaults_follow_mxnet():
    c = Config.from_env({})
    assert (c.enable_inplace, c.match_range, c.auto_search_match_range, c.num_temp, c.gpu_worker_nthreads,
            c.pool_reserve_percent) == (True, 16, False, 1, 2, 5.0)
    assert c.workspace_limit == 64 << 20 and c.temp_slots == 1


def test_precedence():
    env = {"MXNET_EXEC_MATCH_RANGE": "4", "MXNET_EXEC_ENABLE_INPLACE": "0", "MXNET_EXEC_NUM_TEMP": "4"}
    c = Config.from_env(env, match_range=2)
    assert c.match_range == 2 and c.enable_inplace is False and c.num_temp == 4
    assert c.temp_slots == 2, "NUM_TEMP is capped by MXNET_GPU_WORKER_NTHREADS"


def test_every_field_has_a_variable():
    assert set(ENV) == set(Config.__dataclass_fields__)


@pytest.mark.parametrize("env, message", [
    ({"MXNET_EXEC_ENABLE_INPLACE": "maybe"}, "MXNET_EXEC_ENABLE_INPLACE='maybe'.*boolean"),
    ({"MXNET_EXEC_MATCH_RANGE": "-1"}, "match_range = -1.*>= 0"),
    ({"MXNET_EXEC_NUM_TEMP": "two"}, "MXNET_EXEC_NUM_TEMP='two'"),
    ({"MEMPLAN_WORKSPACE_MODE": "heap"}, "workspace_mode.*pool"),
])
def test_bad_environment(env, message):
    with pytest.raises(ConfigError, match=message):
        Config.from_env(env)


def test_bad_arguments():
    with pytest.raises(ConfigError, match="match_range"):
        Config(match_range=1.5)
    with pytest.raises(ConfigError, match="unknown Config fields"):
        Config.from_env({}, match_rnage=3)
