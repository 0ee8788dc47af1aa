import pytest

from attnclust.config import JobConfig, apply_overrides, default_job_path, load_job
from attnclust.errors import ConfigError


def test_demo_job_loads_and_round_trips():
    cfg = load_job(default_job_path())
    assert cfg.name == "demo" and cfg.model.name == "minilm" and cfg.featurize.method == "pooled"
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
    ("cluster.k=0", r"cluster\.k: got 0; allowed: a positive integer or 'auto'"),
    ("cluster.k=-3", r"cluster\.k: got -3"),
    ("featurize.method=fourier", r"featurize\.method: got 'fourier'; allowed: pooled \| resnet"),
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
