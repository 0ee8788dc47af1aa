"""``backend.enable_numba_cache``: numba code compiled once, loaded from disk by the next process."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from attnclust import backend as bk

ROOT = Path(__file__).resolve().parents[3]

TINY = textwrap.dedent('''
    import numba

    @numba.njit
    def add_squares(a, b):
        return a * a + b * b

    @numba.njit(cache=True)
    def already_cached(a):
        return a + 1
''')

CHILD = textwrap.dedent('''
    import json, sys
    import tinyjit
    from attnclust.backend import enable_numba_cache

    before = tinyjit.already_cached._cache._cache_path
    n = enable_numba_cache(("tinyjit",), cache_dir=sys.argv[1])
    value = tinyjit.add_squares(3, 4)
    tinyjit.already_cached(1)
    print(json.dumps({"enabled": n, "value": value, "hits": sum(tinyjit.add_squares.stats.cache_hits.values()),
                      "misses": sum(tinyjit.add_squares.stats.cache_misses.values()),
                      "cached_path_kept": tinyjit.already_cached._cache._cache_path == before}))
''')


def _child(tmp_path: Path, cache: Path, script: str = CHILD) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "mod"), str(ROOT)])
    proc = subprocess.run([sys.executable, "-c", script, str(cache)], env=env, capture_output=True, text=True,
                          check=False, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_second_process_loads_the_compiled_function_from_the_cache_dir(tmp_path):
    (tmp_path / "mod").mkdir()
    (tmp_path / "mod" / "tinyjit.py").write_text(TINY)
    cache = tmp_path / "cache"

    first = _child(tmp_path, cache)
    assert first == {"enabled": 2, "value": 25, "hits": 0, "misses": 1, "cached_path_kept": True}
    index = sorted(p.name for p in cache.rglob("*.nbi"))
    assert index and all(name.startswith("tinyjit.add_squares") for name in index)  # not already_cached's
    assert list(cache.rglob("*.nbc"))
    # the cache=True function kept numba's own location, next to its source
    assert list((tmp_path / "mod" / "__pycache__").glob("tinyjit.already_cached*.nbi"))

    second = _child(tmp_path, cache)
    assert second["value"] == 25 and second["hits"] == 1 and second["misses"] == 0


def test_without_the_call_nothing_is_cached(tmp_path):
    (tmp_path / "mod").mkdir()
    (tmp_path / "mod" / "tinyjit.py").write_text(TINY)
    cache = tmp_path / "cache"
    script = CHILD.replace('enable_numba_cache(("tinyjit",), cache_dir=sys.argv[1])', "0")
    out = _child(tmp_path, cache, script)
    assert out["value"] == 25 and out["hits"] == 0
    assert not cache.exists() and not list(tmp_path.rglob("tinyjit.add_squares*"))


def test_unwritable_directory_warns_once_and_caches_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.warns(RuntimeWarning, match=r"numba cache directory .*a-file/numba is not writable.*NUMBA_CACHE_DIR"):
        assert bk.enable_numba_cache(cache_dir=blocker / "numba") == 0
    assert "NUMBA_CACHE_DIR" not in os.environ


def test_cache_dir_default_and_overrides(tmp_path, monkeypatch):
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert bk.numba_cache_dir() == tmp_path / "xdg" / "attnclust" / "numba"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert bk.numba_cache_dir() == tmp_path / "home" / ".cache" / "attnclust" / "numba"
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "mine"))
    assert bk.numba_cache_dir() == tmp_path / "mine"


@pytest.mark.slow
def test_make_umap_turns_the_cache_on_for_umap(tmp_path):
    """umap-learn's functions get a cache in the user's ``NUMBA_CACHE_DIR``, which stays as the user set it. The
    directory set here is a link to the cache the suite's runs use (:func:`attnclust.backend.numba_cache_dir`):
    importing umap-learn with an empty one compiles its numba code again (~20 s), which this test does not need."""
    script = textwrap.dedent('''
        import json, os, sys
        from numba.core.caching import NullCache
        from attnclust.backend import make_umap
        import umap.umap_ as uu

        before = isinstance(uu.smooth_knn_dist._cache, NullCache)
        make_umap("cpu", n_neighbors=5, min_dist=0.1, random_state=0)
        print(json.dumps({"before": before, "after": isinstance(uu.smooth_knn_dist._cache, NullCache),
                          "dir": os.environ["NUMBA_CACHE_DIR"]}))
    ''')
    shared = bk.numba_cache_dir()
    shared.mkdir(parents=True, exist_ok=True)
    (tmp_path / "c").symlink_to(shared, target_is_directory=True)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "c"), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"before": True, "after": False, "dir": str(tmp_path / "c")}


@pytest.mark.slow
def test_warming_the_cache_leaves_the_cluster_stages_umap_code_to_load(tmp_path):
    """What ``.ci/setup`` compiles ahead (``warm_numba_cache``) is what the cluster stage's UMAP runs: a process
    after it loads the layout optimiser from the cache and compiles none of it. The cache is the suite's own (a
    link, as above): warmed by the set-up, each child takes seconds."""
    script = textwrap.dedent('''
        import json
        from attnclust.backend import warm_numba_cache
        import umap.layouts as layouts

        seconds = warm_numba_cache()
        stats = layouts._nb_optimize_layout_euclidean_single_epoch.stats
        print(json.dumps({"hits": sum(stats.cache_hits.values()), "misses": sum(stats.cache_misses.values()),
                          "seconds": seconds}))
    ''')
    shared = bk.numba_cache_dir()
    shared.mkdir(parents=True, exist_ok=True)
    (tmp_path / "c").symlink_to(shared, target_is_directory=True)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "c"), "PYTHONPATH": str(ROOT)}
    runs = []
    for _ in range(2):  # the first may compile (a cache not warmed yet); the second must load
        proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stderr[-2000:]
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert runs[1]["hits"] > 0 and runs[1]["misses"] == 0, runs
