import json
import pickle
from pathlib import Path

import pytest
from pydantic import ValidationError

from attnclust._settings import _int, _Model
from attnclust.config import (
    ClusterConfig,
    ExtractConfig,
    FinetuneConfig,
    JobConfig,
    apply_overrides,
    default_job_path,
    load_job,
)
from attnclust.errors import ConfigError


def test_demo_job_loads_and_round_trips():
    cfg = load_job(default_job_path())
    assert cfg.name == "demo" and cfg.model.name == "minilm" and cfg.featurize.method == "profile"
    again = JobConfig.from_dict(cfg.to_dict())
    assert again == cfg
    assert again.fingerprint() == cfg.fingerprint()


def test_overrides_change_values_and_fingerprint():
    base = load_job(default_job_path())
    cfg = load_job(default_job_path(), ["cluster.k=12", "featurize.method=resnet", "name=other"])
    assert cfg.cluster.k == 12 and cfg.featurize.method == "resnet" and cfg.name == "other"
    assert cfg.fingerprint("cluster") != base.fingerprint("cluster")
    assert cfg.fingerprint("data", "model") == base.fingerprint("data", "model")


@pytest.mark.parametrize("override, match", [
    ("cluster.k=0", r"cluster\.k: got 0; allowed: an integer >= 2 or 'auto'"),
    ("cluster.k=-3", r"cluster\.k: got -3"),
    ("featurize.method=fourier", r"featurize\.method: got 'fourier'; allowed: pooled \| resnet \| profile"),
    ("featurize.arch=vgg16", r"featurize\.arch"),
    ("extract.doc_stride=400", r"extract\.doc_stride"),
    ("extract.batch_size=0", r"extract\.batch_size: got 0"),
    ("cluster.colour=red", r"cluster\.colour: unknown setting"),
    ("backend=tpu", r"backend: got 'tpu'; allowed: auto \| cpu \| gpu"),
    ("name=has-dash", r"name: got 'has-dash'"),
    ("data.max_examples=0", r"data\.max_examples"),
    ("cluster.k_max=2", r"cluster\.k_max"),
])
def test_bad_settings_name_the_key(override, match):
    with pytest.raises(ConfigError, match=match):
        load_job(default_job_path(), [override])


def test_malformed_yaml_names_the_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ncluster:\n  k: [1, 2\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: malformed YAML at line \d+"):
        load_job(bad)


def test_missing_job_file(tmp_path):
    with pytest.raises(ConfigError, match=r"cannot read it"):
        load_job(tmp_path / "nope.yaml")


def test_unknown_section_and_bad_override_syntax(tmp_path):
    job = tmp_path / "j.yaml"
    job.write_text("name: x\nclustering: {k: 3}\n")
    with pytest.raises(ConfigError, match=r"clustering: unknown section"):
        load_job(job)
    with pytest.raises(ConfigError, match=r"expected section\.key=value"):
        apply_overrides({}, ["cluster.k"])


def test_config_is_frozen():
    cfg = JobConfig()
    with pytest.raises(AttributeError):
        cfg.name = "x"


# --- pydantic models: keys, typed overrides, strict types, errors ------------------------------------------

JOBS = sorted((Path(__file__).resolve().parents[2] / "jobs").glob("*.yaml"))


@pytest.mark.parametrize("path", JOBS, ids=lambda p: p.name)
def test_every_job_file_round_trips(path):
    cfg = load_job(path)
    data = json.loads(json.dumps(cfg.to_dict()))
    assert JobConfig.from_dict(data) == cfg
    assert JobConfig.from_dict(data).fingerprint() == cfg.fingerprint()


def test_job_files_are_found():
    assert len(JOBS) >= 5


def test_keys_list_every_setting_and_value_reads_them():
    cfg = load_job(default_job_path())
    keys = JobConfig.keys()
    assert keys == cfg.keys()
    assert keys[0] == "data.path" and keys[-2:] == ("name", "backend")
    assert "cluster.k" in keys and "finetune.eval_max_examples" in keys
    assert len(keys) == len(set(keys)) == sum(len(s.model_fields) for s in JobConfig.SECTIONS.values()) + 2
    flat = cfg.to_dict()
    for key in keys:
        section, _, setting = key.partition(".")
        value = cfg.value(key)
        value = list(value) if isinstance(value, tuple) else value  # to_dict writes tuple settings as lists
        assert value == (flat[section][setting] if setting else flat[section])
    assert cfg.value("cluster.k") == "auto" and cfg.value("cluster.k_min") == 6
    assert cfg.value("name") == "demo" and cfg.value("backend") == "auto"


@pytest.mark.parametrize("key, match", [
    ("cluster.colour", r"config cluster\.colour: unknown setting; known settings of 'cluster': .*k_max"),
    ("clustering.k", r"config clustering\.k: unknown key"),
    ("cluster", r"config cluster: unknown key"),
    ("colour", r"config colour: unknown key"),
])
def test_value_of_an_unknown_key_names_it(key, match):
    with pytest.raises(ConfigError, match=match):
        JobConfig().value(key)


@pytest.mark.parametrize("item, path, expected", [
    ("cluster.k=12", ("cluster", "k"), 12),
    ("cluster.k=auto", ("cluster", "k"), "auto"),
    ("data.path=null", ("data", "path"), None),
    ("qa.null_threshold=0.5", ("qa", "null_threshold"), 0.5),
    ("cluster.umap=false", ("cluster", "umap"), False),
    ("finetune.learning_rate=3e-5", ("finetune", "learning_rate"), 3e-5),
    ("model.revision=1234", ("model", "revision"), "1234"),
    ("cluster.pca_components=~", ("cluster", "pca_components"), None),
    ("name=run2", ("name",), "run2"),
    ("backend=cpu", ("backend",), "cpu"),
])
def test_override_values_are_read_as_the_setting_type(item, path, expected):
    raw = apply_overrides({"cluster": None, "data": {"path": "x.json"}}, [item])
    got = raw[path[0]][path[1]] if len(path) == 2 else raw[path[0]]
    assert got == expected and type(got) is type(expected)
    cfg = JobConfig.from_dict(raw)
    assert cfg.value(".".join(path)) == expected


def test_overrides_do_not_modify_the_raw_mapping():
    raw = {"cluster": {"k": 3}}
    assert apply_overrides(raw, ["cluster.k=4"]) == {"cluster": {"k": 4}}
    assert raw == {"cluster": {"k": 3}}


@pytest.mark.parametrize("item", ["cluster.k", "cluster.k.x=1", "=3", "cluster.=1", ".k=1", "cluster=3", "name.x=1",
                                  "colour=red"])
def test_malformed_override_names_the_item_and_the_form(item):
    with pytest.raises(ConfigError, match=rf"--set '{item}': expected section\.key=value"):
        apply_overrides({}, [item])


@pytest.mark.parametrize("item, match", [
    ("cluster.colour=red", r"^config cluster\.colour: unknown setting; known settings of 'cluster': fit_sample, k,"),
    ("clustering.k=3", r"^config clustering: unknown section; known: backend, cluster"),
])
def test_override_of_an_unknown_key(item, match):
    with pytest.raises(ConfigError, match=match):
        apply_overrides({}, [item])


@pytest.mark.parametrize("item, match", [
    ("cluster.k=1.5", r"config cluster\.k: got '1\.5'; allowed: an integer >= 2 or 'auto'"),
    ("cluster.umap=maybe", r"config cluster\.umap: got 'maybe'; allowed: true \| false"),
    ("extract.max_seq_len=8", r"config extract\.max_seq_len: got 8; allowed: an integer >= 16 and <= 4096"),
    ("qa.null_threshold=inf", r"config qa\.null_threshold: got inf; allowed: a number"),
    ("report.title=!!python/object/apply:os.system [echo]", None),
])
def test_override_values_of_the_wrong_type_are_refused_by_validation(item, match):
    if match is None:  # no YAML is read from --set: a tag is plain text, nothing is constructed
        assert load_job(default_job_path(), [item]).report.title == item.partition("=")[2]
        return
    with pytest.raises(ConfigError, match=match):
        load_job(default_job_path(), [item])


def test_k_of_one_is_refused():
    with pytest.raises(ConfigError, match=r"config cluster\.k: got 1; allowed: an integer >= 2 or 'auto'"):
        load_job(default_job_path(), ["cluster.k=1"])
    with pytest.raises(ConfigError, match=r"^config cluster\.k: got 1; allowed: an integer >= 2 or 'auto'"):
        ClusterConfig(k=1)
    assert ClusterConfig(k=2).k == 2


@pytest.mark.parametrize("raw, match", [
    ({"qa": {"null_threshold": [1, 2]}}, r"^config qa\.null_threshold: got \[1, 2\]; allowed: a number$"),
    ({"cluster": {"k": [3]}}, r"^config cluster\.k: got \[3\]; allowed: an integer >= 2 or 'auto'"),
    ({"cluster": {"umap_min_dist": {"a": 1}}}, r"^config cluster\.umap_min_dist: got \{'a': 1\}; allowed: a number in"),
    ({"extract": {"batch_size": True}}, r"^config extract\.batch_size: got True; allowed: an integer >= 1$"),
    ({"data": {"max_examples": "12"}}, r"^config data\.max_examples: got '12'; allowed: an integer >= 1$"),
    ({"featurize": {"grid": 3.5}}, r"^config featurize\.grid: got 3\.5; allowed: an integer >= 2 and <= 256$"),
    ({"featurize": {"method": ["pooled"]}},
     r"^config featurize\.method: got \['pooled'\]; allowed: pooled \| resnet \| profile"),
    ({"finetune": {"epochs": 0}}, r"^config finetune\.epochs: got 0; allowed: a number > 0$"),
    ({"finetune": {"learning_rate": float("nan")}}, r"^config finetune\.learning_rate: got nan; allowed: a number"),
    ({"finetune": {"precision": "fp8"}}, r"^config finetune\.precision: got 'fp8'; allowed: auto \| fp32 \| fp16"),
    ({"data": {"path": "  "}}, r"^config data\.path: got '  '; allowed: a file path, .*or null"),
    ({"model": {"revision": 1234}}, r"^config model\.revision: got 1234; allowed: .*; quote a commit"),
    ({"name": 7}, r"^config name: got 7; allowed: letters, digits"),
    ({"cluster": 5}, r"^config cluster: expected a mapping of settings, got int"),
    ({"cluster": {3: 1}}, r"^config cluster\.3: unknown setting"),
    ({"extract": {"max_seq_len": 128, "max_query_len": 125}},
     r"^config extract\.max_query_len: got 125; allowed: an integer >= 4 and <= 120"),
    ({"extract": {"max_seq_len": 128, "max_query_len": 64, "doc_stride": 61}},
     r"^config extract\.doc_stride: got 61; allowed: less than max_seq_len - max_query_len - 3 = 61; lower"),
    ({"cluster": {"k_min": 8, "k_max": 6}}, r"^config cluster\.k_max: got 6; allowed: an integer >= k_min = 8"),
])
def test_a_validation_error_never_escapes(raw, match):
    with pytest.raises(ConfigError, match=match) as info:
        JobConfig.from_dict(raw)
    error = info.value
    assert not isinstance(error, ValidationError) and error.__cause__ is None
    assert error.__context__ is None or error.__suppress_context__  # no pydantic traceback shown under it


@pytest.mark.parametrize("build", [
    lambda: JobConfig(cluster={"k": 0}),
    lambda: JobConfig.model_validate({"cluster": {"k": 0}}),
    lambda: ClusterConfig.model_validate_json('{"k": 0}'),
    lambda: JobConfig().replace(cluster=ClusterConfig(k=0)),
    lambda: JobConfig().cluster.replace(k=0),
])
def test_pydantic_entry_points_raise_config_error_too(build):
    with pytest.raises(ConfigError, match=r"^config cluster\.k: got 0; allowed: an integer >= 2 or 'auto'"):
        build()


def test_types_are_strict_but_floats_take_ints_and_yaml_text(tmp_path):
    job = tmp_path / "j.yaml"
    job.write_text("finetune:\n  learning_rate: 3e-5\n  epochs: 2\n")  # YAML 1.1: 3e-5 (no dot) is a string
    cfg = load_job(job)
    assert cfg.finetune.learning_rate == 3e-5 and cfg.finetune.epochs == 2.0
    assert isinstance(cfg.finetune.epochs, float)
    with pytest.raises(ConfigError, match=r"finetune\.learning_rate: got 'fast'; allowed: a number > 0 and <= 1"):
        FinetuneConfig.from_dict({"learning_rate": "fast"})
    with pytest.raises(ConfigError, match=r"extract\.batch_size: got 8\.0"):
        ExtractConfig(batch_size=8.0)
    with pytest.raises(ConfigError, match=r"cluster\.umap: got 1; allowed: true \| false"):
        ClusterConfig(umap=1)


def test_replace_returns_a_validated_copy():
    cfg = JobConfig()
    other = cfg.replace(name="run2", cluster=cfg.cluster.replace(k=5))
    assert other.name == "run2" and other.cluster.k == 5 and cfg.cluster.k == "auto"
    assert other.fingerprint("data", "model") == cfg.fingerprint("data", "model")
    assert other.fingerprint("cluster") != cfg.fingerprint("cluster")
    with pytest.raises(ConfigError, match=r"config name: got 'a b'"):
        cfg.replace(name="a b")
    with pytest.raises(ConfigError, match=r"config clustr: unknown section"):
        cfg.replace(clustr=ClusterConfig())


def test_fingerprint_of_an_unknown_section():
    with pytest.raises(ConfigError, match=r"config clustr: unknown section"):
        JobConfig().fingerprint("clustr")


def test_sections_keep_their_names_and_frozen_pickle_round_trip():
    for name, section in JobConfig.SECTIONS.items():
        assert section.SECTION == name
        assert section.from_dict(section().to_dict()) == section()
    cfg = load_job(default_job_path(), ["cluster.k=7"])
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    with pytest.raises(AttributeError, match="frozen"):
        cfg.cluster.k = 3


class FourierSettings(_Model):
    """A test featurizer's settings.

    Parameters
    ----------
    bands
        Frequency bands kept.
    """

    SECTION = "featurize"
    bands: int = _int(4, 1, 64)


class ClashSettings(_Model):
    """Settings that name a setting another featurizer declares.

    Parameters
    ----------
    grid
        Clashes with ``pooled``'s.
    """

    SECTION = "featurize"
    grid: int = _int(8, 1)


class _Fourier:
    """A featurizer registered by a test, with its own settings model: ``featurize.bands``."""

    name = "fourier"
    version = 1
    settings = FourierSettings
    keys = ("featurize.bands",)

    def dim(self, cfg) -> int:
        return cfg.bands

    def check(self, cfg) -> None:
        pass

    def embed(self, maps, cfg, device="cpu"):
        return maps.reshape(len(maps), -1)[:, :cfg.bands]


class _Clash(_Fourier):
    name = "clash"
    settings = ClashSettings
    keys = ("featurize.grid",)


def test_featurizer_names_come_from_the_registry_at_validation_time():
    from attnclust.featurize import register_featurizer, unregister_featurizer

    register_featurizer(_Fourier())
    try:
        assert JobConfig.from_dict({"featurize": {"method": "fourier"}}).featurize.method == "fourier"
        with pytest.raises(ConfigError, match=r"featurize\.method: got 'wavelet'; allowed: pooled \| resnet \| "
                                              r"profile \| fourier$"):
            JobConfig.from_dict({"featurize": {"method": "wavelet"}})
    finally:
        unregister_featurizer("fourier")
    with pytest.raises(ConfigError, match=r"featurize\.method: got 'fourier'; allowed: pooled \| resnet \| profile$"):
        JobConfig.from_dict({"featurize": {"method": "fourier"}})


def test_a_featurizers_settings_join_the_featurize_section_until_it_is_removed():
    from attnclust.featurize import FEATURIZERS, register_featurizer, unregister_featurizer
    from attnclust.plugins import assemble_job_config

    before = JobConfig().to_dict()
    assert list(before["featurize"]) == ["method", "grid", "arch", "weights", "image_size", "batch_size", "precision"]
    assert JobConfig.SECTIONS["featurize"].DECLARED_IN["grid"].__name__ == "PooledSettings"
    register_featurizer(_Fourier())
    try:
        assert "bands" not in JobConfig().to_dict()["featurize"]  # the job changes when it is assembled
        assemble_job_config()
        cfg = load_job(None, ["featurize.method=fourier", "featurize.bands=9"])
        assert cfg.featurize.bands == 9 and cfg.to_dict()["featurize"]["bands"] == 9
        assert "featurize.bands" in JobConfig.keys() and JobConfig().featurize.bands == 4
        assert JobConfig.from_dict(cfg.to_dict()) == cfg
        with pytest.raises(ConfigError, match=r"config featurize\.bands: got 0; allowed: an integer >= 1 and <= 64"):
            load_job(None, ["featurize.bands=0"])
        with pytest.raises(ValueError, match="setting 'grid' is already declared by PooledSettings"):
            register_featurizer(_Clash())
        assert "clash" not in FEATURIZERS  # refused, and the featurize section is as it was
    finally:
        unregister_featurizer("fourier")
        assemble_job_config()
    assert JobConfig().to_dict() == before
    with pytest.raises(ConfigError, match=r"featurize\.bands: unknown setting"):
        load_job(None, ["featurize.bands=9"])


def test_syntax_section_is_off_by_default_and_validated():
    cfg = JobConfig()
    assert (cfg.syntax.conllu, cfg.syntax.spacy_model, cfg.syntax.max_features) == (None, None, None)
    assert sorted(JobConfig.SECTIONS) == ["cluster", "data", "extract", "featurize", "finetune", "head_map",
                                          "importance", "model", "probe", "qa", "report", "syntax"]
    demo = load_job(default_job_path())  # the demo parses with the gold parses bundled with its sample
    assert demo.syntax.conllu == "bundled" and demo.syntax.conllu_path().name == "sample_syntax.conllu"
    assert demo.syntax.conllu_path().is_file()
    assert load_job(default_job_path(), ["data.path=my.json"]).syntax.conllu == "bundled"  # skipped at report
    cfg = load_job(default_job_path(), ["syntax.conllu=gold.conllu", "syntax.max_features=8"])
    assert cfg.value("syntax.conllu") == "gold.conllu" and cfg.syntax.max_features == 8
    with pytest.raises(ConfigError, match=r"syntax\.max_features: got 0; allowed: an integer >= 1"):
        load_job(default_job_path(), ["syntax.max_features=0"])
    with pytest.raises(ConfigError, match=r"^config syntax\.parser: unknown setting; known settings of 'syntax': "
                                          r"conllu, max_features, spacy_model$"):
        apply_overrides({}, ["syntax.parser=x"])


def test_probe_section_defaults_and_validation():
    cfg = JobConfig()
    assert cfg.extract.head_outputs is True and cfg.probe.enabled is True
    assert (cfg.probe.tasks, cfg.probe.labels, cfg.probe.pooling, cfg.probe.top_k, cfg.probe.permutations) == (
        ("answerable", "qword", "correct"), (), "cls", 8, 20)
    cfg = JobConfig.from_dict({"probe": {"tasks": ["qword"], "labels": ["topic"], "pooling": "context_mean"}})
    assert cfg.probe.tasks == ("qword",) and cfg.probe.labels == ("topic",)
    assert JobConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match=r"^config probe\.tasks: got 'topic'; allowed: a list of answerable"):
        JobConfig.from_dict({"probe": {"tasks": ["topic"]}})
    with pytest.raises(ConfigError, match=r"^config probe\.labels: .*nor a built-in task"):
        JobConfig.from_dict({"probe": {"labels": ["qword"]}})
    with pytest.raises(ConfigError, match=r"^config probe\.pooling: got 'mean'; allowed: cls \| last_prompt \| "
                                          r"context_mean$"):
        JobConfig.from_dict({"probe": {"pooling": "mean"}})


def test_head_map_settings_are_checked_and_in_the_fingerprint_only_when_set():
    """``head_map.features`` / ``head_map.rows`` (the head distances' sample): checked in one line; at their
    defaults they leave the report stage's fingerprint as it was, set they enter it."""
    from attnclust.analysis.distances import DEFAULT_FEATURES, DEFAULT_ROWS
    from attnclust.analysis.plugins import ANALYSES

    cfg = JobConfig()
    assert (cfg.head_map.features, cfg.head_map.rows) == (DEFAULT_FEATURES, DEFAULT_ROWS)
    assert ANALYSES["head_distances"].fingerprint_keys(cfg) == ()
    cfg = JobConfig.from_dict({"head_map": {"features": 16, "rows": None}})
    assert ANALYSES["head_distances"].fingerprint_keys(cfg) == ("head_map.features", "head_map.rows")
    with pytest.raises(ConfigError, match=r"head_map\.features"):
        JobConfig.from_dict({"head_map": {"features": 0}})
