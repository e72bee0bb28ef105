from pathlib import Path

import pytest

from skulk.datadir.paths import resolve_paths

HOME = Path("/home/ada")


@pytest.mark.parametrize(
    ("env", "platform", "flag", "data_home", "models", "cache", "cards"),
    [
        ({}, "linux", None, "/home/ada/.local/share/skulk", "/home/ada/.local/share/skulk/models",
         "/home/ada/.cache/skulk", "/home/ada/.local/share/skulk/custom_model_cards"),
        ({"XDG_DATA_HOME": "/x/data", "XDG_CACHE_HOME": "/x/cache"}, "linux", None,
         "/x/data/skulk", "/x/data/skulk/models", "/x/cache/skulk", "/x/data/skulk/custom_model_cards"),
        ({}, "darwin", None, "/home/ada/.skulk", "/home/ada/.skulk/models", "/home/ada/.skulk/cache",
         "/home/ada/.skulk/custom_model_cards"),
        ({}, "win32", None, "/home/ada/.skulk", "/home/ada/.skulk/models", "/home/ada/.skulk/cache",
         "/home/ada/.skulk/custom_model_cards"),
        ({"SKULK_DATA_HOME": "/d"}, "linux", None, "/d", "/d/models", "/home/ada/.cache/skulk", "/d/custom_model_cards"),
        ({"SKULK_HOME": "/h", "SKULK_DATA_HOME": "/d"}, "linux", None, "/h", "/h/models", "/h/cache", "/h/custom_model_cards"),
        ({"SKULK_HOME": "/h"}, "linux", Path("/flag"), "/flag", "/flag/models", "/flag/cache", "/flag/custom_model_cards"),
        ({"SKULK_HOME": "/h", "SKULK_MODELS_DIR": "/m", "SKULK_CACHE_HOME": "/c", "SKULK_CUSTOM_MODEL_CARDS_DIR": "/k"},
         "linux", None, "/h", "/m", "/c", "/k"),
    ],
)
def test_resolve_paths(env, platform, flag, data_home, models, cache, cards):
    paths = resolve_paths(env, platform, HOME, flag)
    assert (str(paths.data_home), str(paths.models_dir), str(paths.cache_home), str(paths.custom_cards_dir)) == (
        data_home, models, cache, cards,
    )


def test_derived_files_live_in_data_home():
    paths = resolve_paths({"SKULK_HOME": "/h"}, "linux", HOME)
    assert paths.config_file == Path("/h/skulk.yaml")
    assert paths.lease_file == Path("/h/skulk.lease")
    assert paths.event_log_dir == Path("/h/event_log")
    assert paths.traces_dir == Path("/h/cache/traces")
