"""Validation against the user's DeepSpeed release: the shipped schemas (0.14-0.19), how one is chosen
(--deepspeed-version, [tool.dstk], the installed deepspeed, a pin, the newest), keys that one release reads
and another does not, and `dstk schema` / `dstk upgrade` per release."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from dstk.cli import main
from dstk.validate import validate_config
from dstk.validate import versions
from dstk.validate.schema import current_minor, load_schema, schema_text, using
from dstk.validate.versions import SHIPPED, select

ROOT = pathlib.Path(__file__).resolve().parent.parent
DATA = ROOT / "toolkit" / "data"


@pytest.fixture
def tree(tmp_path):
    def write(rel, content):
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(content))
        return str(path)
    (tmp_path / ".git").mkdir()  # the repository root: the pin search stops here
    return write


@pytest.fixture
def no_deepspeed(monkeypatch):
    """As on a light install (no deepspeed): the installed release is not a source."""
    monkeypatch.setattr(versions, "installed_deepspeed", lambda: None)


def _codes(config: dict, minor: str) -> dict[str, str]:
    with using(minor):
        return {f.pointer: f.code for f in validate_config(config)}


# ---------------------------------------------------------------------------- the shipped schemas


def test_one_schema_per_minor_is_shipped_and_says_what_it_is():
    files = sorted(p.name for p in DATA.glob("deepspeed-*.schema.json"))
    assert files == [f"deepspeed-{m}.schema.json" for m in SHIPPED]
    for minor, release in SHIPPED.items():
        schema = load_schema(minor)
        assert schema["x-dstk-deepspeed-version"] == release
        assert schema["$id"] == f"urn:dstk:schema:deepspeed-config:{minor}"
        assert set(schema["x-dstk-removed"]) == {"top_level", "zero_optimization"}
        assert "\n" not in schema_text(minor).rstrip("\n")  # minified


@pytest.mark.parametrize("minor", list(SHIPPED))
def test_every_shipped_schema_is_a_valid_draft_2020_12_schema(minor):
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator.check_schema(load_schema(minor))


def test_the_removed_key_tables_are_each_release_s_own():
    assert load_schema("0.18")["x-dstk-removed"] == {"top_level": {}, "zero_optimization": {}}
    removed = load_schema("0.19")["x-dstk-removed"]
    assert {"sparse_attention", "amp", "elasticity"} <= set(removed["top_level"])
    assert "mics_shard_size" in removed["zero_optimization"]


# Keys that exist in one release and not another (found by diffing the generated schemas), each with the
# release where it is last/first unknown and the finding there: (config, {minor: code or None}).
DIFFERENCES = {
    "torch_autocast (0.17+)": ({"torch_autocast": {"enabled": True}}, "/torch_autocast",
                               {"0.14": "DS101", "0.16": "DS101", "0.17": None, "0.19": None}),
    "seq_parallel_comm_data_type (renamed in 0.16)": ({"seq_parallel_comm_data_type": "fp32"},
                                                     "/seq_parallel_comm_data_type",
                                                     {"0.14": None, "0.15": None, "0.16": "DS101", "0.19": "DS101"}),
    "seq_parallel_communication_data_type (0.16+)": ({"seq_parallel_communication_data_type": "fp32"},
                                                     "/seq_parallel_communication_data_type",
                                                     {"0.15": "DS101", "0.16": None, "0.19": None}),
    "sparse_attention (removed in 0.19)": ({"sparse_attention": {"mode": "fixed"}}, "/sparse_attention",
                                           {"0.14": None, "0.18": None, "0.19": "DS105"}),
    "zero mics_shard_size (removed in 0.19)": ({"zero_optimization": {"stage": 3, "mics_shard_size": 8}},
                                               "/zero_optimization/mics_shard_size",
                                               {"0.14": None, "0.18": None, "0.19": "DS105"}),
    "zero zenflow (0.17+, pydantic)": ({"zero_optimization": {"stage": 2, "zenflow": {"topk_ratio": 0.1}}},
                                       "/zero_optimization/zenflow",
                                       {"0.16": "DS101", "0.17": None, "0.19": None}),
    "progressive_layer_drop (removed in 0.19)": ({"progressive_layer_drop": {"enabled": True, "theta": 0.5}},
                                                 "/progressive_layer_drop", {"0.14": None, "0.18": None,
                                                                             "0.19": "DS105"}),
    "progressive_layer_drop without enabled (KeyError before 0.19)": (
        {"progressive_layer_drop": {"theta": 0.5}}, "/progressive_layer_drop/enabled",
        {"0.14": "DS110", "0.18": "DS110"}),
    "top-level eigenvalue (read only inside quantize_training before 0.19)": (
        {"eigenvalue": {"enabled": True}}, "/eigenvalue", {"0.14": "DS101", "0.18": "DS101", "0.19": "DS105"}),
    "aio thread_count (0.14-0.15)": ({"aio": {"thread_count": 2}}, "/aio/thread_count",
                                     {"0.14": None, "0.15": None, "0.16": "DS101", "0.19": "DS101"}),
    "disable_python_gc (0.19)": ({"disable_python_gc": True}, "/disable_python_gc",
                                 {"0.18": "DS101", "0.19": None}),
    "1-bit Adam (removed in 0.19)": ({"optimizer": {"type": "OneBitAdam", "params": {"lr": 1e-3, "freeze_step": 10}}},
                                     "/optimizer/type", {"0.14": None, "0.18": None, "0.19": "DS209"}),
}


@pytest.mark.parametrize("name", list(DIFFERENCES))
def test_a_key_gets_the_verdict_of_the_chosen_release(name):
    config, pointer, expected = DIFFERENCES[name]
    config = {"train_micro_batch_size_per_gpu": 1, **config}
    for minor, code in expected.items():
        assert _codes(config, minor).get(pointer) == code, (name, minor)


def test_an_unknown_key_names_the_releases_that_read_it():
    with using("0.16"):
        found = validate_config({"torch_autocast": {"enabled": True}})
    (finding,) = [f for f in found if f.pointer == "/torch_autocast"]
    assert finding.code == "DS101"
    assert "DeepSpeed 0.17-0.19 read 'torch_autocast'" in finding.hint and "--deepspeed-version 0.19" in finding.hint


def test_using_restores_the_newest_after_the_block():
    assert current_minor() == versions.NEWEST == "0.19"
    with using("0.14"):
        assert load_schema()["x-dstk-deepspeed-version"] == "0.14.5"
    assert load_schema()["x-dstk-deepspeed-version"] == "0.19.8"
    with pytest.raises(ValueError):
        with using("0.12"):
            pass


# ---------------------------------------------------------------------------- choosing the release


@pytest.mark.parametrize("flag, minor, nearest", [
    ("0.14", "0.14", False), ("0.14.5", "0.14", False), ("0.17.1", "0.17", False), ("v0.16.4", "0.16", False),
    ("0.12.6", "0.14", True), ("0.20.1", "0.19", True), ("1.0", "0.19", True)])
def test_the_flag_takes_the_nearest_shipped_minor(flag, minor, nearest):
    sel = select(flag=flag, installed=lambda: "0.19.8")
    assert (sel.minor, sel.release, sel.source, sel.nearest) == (minor, SHIPPED[minor], "flag", nearest)
    assert sel.reason.startswith(f"DeepSpeed {minor} schema ({SHIPPED[minor]}), from --deepspeed-version {flag}")


def test_order_flag_then_project_then_installed_then_pin_then_newest(tree):
    config = tree("configs/ds.json", "{}")
    tree("requirements.txt", "torch\ndeepspeed==0.15.2\n")
    assert select(flag="0.14", project_version="0.16", config_path=config, installed=lambda: "0.18.1").source == "flag"
    sel = select(project_version="0.16", project_source="pyproject.toml", config_path=config,
                 installed=lambda: "0.18.1")
    assert (sel.source, sel.minor) == ("project", "0.16")
    sel = select(config_path=config, installed=lambda: "0.18.1")
    assert (sel.source, sel.minor, sel.requested) == ("installed", "0.18", "0.18.1")
    sel = select(config_path=config, installed=lambda: None)
    assert (sel.source, sel.minor, sel.requested) == ("pin", "0.15", "==0.15.2")
    assert sel.where.endswith("requirements.txt:2")
    os.remove(os.path.join(os.path.dirname(config), "..", "requirements.txt"))
    sel = select(config_path=config, installed=lambda: None)
    assert (sel.source, sel.minor) == ("newest", "0.19")


@pytest.mark.parametrize("files, minor, where", [
    ({"requirements.txt": "deepspeed>=0.15,<0.17  # not 0.17\n"}, "0.16", "requirements.txt:1"),
    ({"requirements.txt": "deepspeed-mii==0.2.0\ndeepspeed_kernels==0.1\ndeepspeed\ndeepspeed==0.16.1\n"}, "0.16",
     "requirements.txt:4"),
    ({"requirements-dev.txt": "-r base.txt\nDeepSpeed[autotuning] ~= 0.17.0\n"}, "0.17", "requirements-dev.txt:2"),
    ({"requirements/train.txt": "deepspeed==0.14.4 ; sys_platform == 'linux'\n"}, "0.14", "train.txt:1"),
    ({"pyproject.toml": '[project]\nname = "x"\ndependencies = ["torch", "deepspeed==0.18.3"]\n'}, "0.18",
     "(project.dependencies)"),
    ({"pyproject.toml": '[project]\nname = "x"\n[project.optional-dependencies]\ntrain = ["deepspeed<0.16"]\n'},
     "0.15", "(project.optional-dependencies.train)"),
    ({"pyproject.toml": '[tool.poetry.dependencies]\ndeepspeed = "^0.16.2"\n'}, "0.16", "(tool.poetry.dependencies)"),
    ({"pyproject.toml": '[tool.poetry.dependencies]\ndeepspeed = {version = "0.15.1", extras = ["x"]}\n'}, "0.15",
     "(tool.poetry.dependencies)"),
])
def test_pins_in_requirements_and_pyproject(tree, files, minor, where):
    for rel, text in files.items():
        tree(rel, text)
    config = tree("a/b/ds_config.json", "{}")  # the pin is two folders up
    sel = select(config_path=config, installed=lambda: None)
    assert (sel.source, sel.minor) == ("pin", minor)
    assert sel.where.endswith(where)


def test_the_pin_search_stops_at_the_repository_root(tmp_path):
    (tmp_path / "requirements.txt").write_text("deepspeed==0.14.5\n")  # outside the repository
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "ds.json").write_text("{}")
    assert select(config_path=repo / "ds.json", installed=lambda: None).source == "newest"


def test_a_nearer_pin_wins(tree):
    tree("requirements.txt", "deepspeed==0.14.5\n")
    config = tree("sub/ds.json", "{}")
    tree("sub/requirements.txt", "deepspeed==0.17.6\n")
    assert select(config_path=config, installed=lambda: None).minor == "0.17"


def test_installed_version_is_what_importlib_metadata_reads():
    import importlib.metadata

    try:
        expected = importlib.metadata.version("deepspeed")
    except importlib.metadata.PackageNotFoundError:
        expected = None
    assert versions.installed_deepspeed() == expected


def test_finding_the_installed_version_does_not_import_deepspeed():
    code = ("import sys; from dstk.validate.versions import installed_deepspeed; installed_deepspeed(); "
            "print(sorted(m for m in ('deepspeed', 'torch', 'importlib.metadata') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ---------------------------------------------------------------------------- the command line


def test_validate_says_which_release_and_why(tree, capsys, no_deepspeed):
    tree("requirements.txt", "deepspeed==0.16.4\n")
    path = tree("ds.json", '{"train_micro_batch_size_per_gpu": 1, "torch_autocast": {"enabled": true}}')
    assert main(["validate", path]) == 1
    captured = capsys.readouterr()
    assert "checked against DeepSpeed 0.16 schema (0.16.9), from the pin deepspeed==0.16.4 in" in captured.err
    assert "DS101" in captured.out
    assert main(["validate", path, "--deepspeed-version", "0.17"]) == 0
    assert "from --deepspeed-version 0.17" in capsys.readouterr().err
    assert main(["validate", path, "--format", "json"]) == 1
    (entry,) = json.loads(capsys.readouterr().out)["files"]
    assert entry["deepspeed_schema"] == "0.16.9"
    assert entry["deepspeed_version"]["source"] == "pin" and entry["deepspeed_version"]["schema"] == "0.16"
    assert main(["validate", path, "--format", "sarif", "--deepspeed-version", "0.18.2"]) == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    (props,) = run["properties"]["deepspeedVersions"]
    assert props["path"] == path and props["source"] == "flag" and props["release"] == "0.18.9"


def test_the_installed_deepspeed_is_used_without_a_flag(tree, capsys, monkeypatch):
    monkeypatch.setattr(versions, "installed_deepspeed", lambda: "0.15.3")
    path = tree("ds.json", '{"train_micro_batch_size_per_gpu": 1, "seq_parallel_comm_data_type": "fp32"}')
    assert main(["validate", path]) == 0
    assert "from the installed deepspeed 0.15.3" in capsys.readouterr().err


def test_tool_dstk_deepspeed_version_works(tree, capsys, monkeypatch):
    monkeypatch.setattr(versions, "installed_deepspeed", lambda: "0.19.8")  # the project's setting wins
    tree("pyproject.toml", '[tool.dstk]\ndeepspeed_version = "0.16"\n')
    path = tree("ds.json", '{"train_micro_batch_size_per_gpu": 1, "torch_autocast": {"enabled": true}}')
    assert main(["validate", path, "--format", "json"]) == 1
    (entry,) = json.loads(capsys.readouterr().out)["files"]
    assert [f["code"] for f in entry["findings"]] == ["DS101"]  # no DS010: 0.16 ships
    assert entry["deepspeed_version"]["source"] == "project" and entry["deepspeed_version"]["schema"] == "0.16"


def test_a_bad_version_is_a_usage_error(tree, capsys):
    path = tree("ds.json", "{}")
    assert main(["validate", path, "--deepspeed-version", "latest"]) == 2
    assert "not a DeepSpeed version" in capsys.readouterr().err
    tree("pyproject.toml", '[tool.dstk]\ndeepspeed_version = "new"\n')
    assert main(["validate", path]) == 2


@pytest.mark.parametrize("minor", list(SHIPPED))
def test_schema_writes_that_release_s_schema(minor, capsys):
    assert main(["schema", "--deepspeed-version", SHIPPED[minor]]) == 0
    captured = capsys.readouterr()
    assert captured.out == (DATA / f"deepspeed-{minor}.schema.json").read_text()
    assert json.loads(captured.out)["$id"] == f"urn:dstk:schema:deepspeed-config:{minor}"
    assert f"DeepSpeed {minor} schema" in captured.err


def test_schema_pointer_per_release(capsys):
    assert main(["schema", "--deepspeed-version", "0.16", "--pointer", "/properties/torch_autocast"]) == 2
    capsys.readouterr()
    assert main(["schema", "--deepspeed-version", "0.17", "--pointer", "/properties/torch_autocast"]) == 0
    assert json.loads(capsys.readouterr().out)["type"] == "object"


OLD = {"train_micro_batch_size_per_gpu": 1, "seq_parallel_comm_data_type": "fp32",
       "sparse_attention": {"mode": "fixed"}, "zero_optimization": {"stage": 3, "mics_shard_size": 8}}


def test_upgrade_uses_the_target_release_s_tables(tmp_path, capsys):
    path = tmp_path / "old.json"
    path.write_text(json.dumps(OLD, indent=2) + "\n")
    assert main(["upgrade", str(path), "--deepspeed-version", "0.15", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["changes"] == []  # 0.15 reads all of it
    assert main(["upgrade", str(path), "--deepspeed-version", "0.16", "--format", "json"]) == 0
    (change,) = json.loads(capsys.readouterr().out)["changes"]
    assert change["pointer"] == "/seq_parallel_comm_data_type" and change["action"] == "renamed"
    assert main(["upgrade", str(path), "--deepspeed-version", "0.19.8", "--write"]) == 0
    new = json.loads(path.read_text())
    assert "sparse_attention" not in new and "mics_shard_size" not in new["zero_optimization"]
    assert new["seq_parallel_communication_data_type"] == "fp32"
    assert main(["upgrade", str(path), "--deepspeed-version", "0.9.0"]) == 2


SDIST_CACHE = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache")) / "dstk" / "deepspeed-sdists"


def _sdist(version: str) -> tuple[pathlib.Path | None, str]:
    """The unpacked source of DeepSpeed ``version``: under ``DSTK_DEEPSPEED_SDISTS`` when set, else fetched once
    with pip (``pip download --no-binary :all:``, from the index pip is configured with) and unpacked into
    ``SDIST_CACHE``. (None, why) when neither works: no index, no network."""
    import tarfile

    sdists = os.environ.get("DSTK_DEEPSPEED_SDISTS")
    root = pathlib.Path(sdists) if sdists else SDIST_CACHE
    src = root / f"deepspeed-{version}"
    if (src / "deepspeed" / "__init__.py").is_file():
        return src, ""
    if sdists:
        return None, f"DSTK_DEEPSPEED_SDISTS={sdists} holds no deepspeed-{version}/"
    root.mkdir(parents=True, exist_ok=True)
    got = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                          f"deepspeed=={version}", "--dest", str(root)], capture_output=True, text=True, timeout=300)
    archive = root / f"deepspeed-{version}.tar.gz"
    if got.returncode != 0 or not archive.is_file():
        return None, (f"pip could not fetch the deepspeed {version} sdist ({got.stderr.strip().splitlines()[-1:]}); "
                      f"set DSTK_DEEPSPEED_SDISTS to a folder holding deepspeed-{version}/")
    with tarfile.open(archive) as tar:
        try:
            tar.extractall(root, filter="data")
        except TypeError:  # a Python without extraction filters (before 3.11.4)
            tar.extractall(root)
    return (src, "") if (src / "deepspeed" / "__init__.py").is_file() else (None, f"{archive} holds no deepspeed/")


@pytest.mark.slow
@pytest.mark.parametrize("minor", [m for m in SHIPPED if m != versions.NEWEST])
def test_an_old_release_s_schema_is_what_the_generator_writes_from_it(minor, tmp_path):
    """Regenerates from that release's sdist (``DSTK_DEEPSPEED_SDISTS=DIR`` holding ``deepspeed-0.14.5/`` etc.,
    else fetched with pip into ``SDIST_CACHE``; docs/validate.md) and compares with the shipped file: the sdists
    are not in the repository (only the generated schemas are). Skipped, with the reason, when it cannot be
    had. The newest is checked against the installed deepspeed by tests/test_schema_drift.py."""
    src, why = _sdist(SHIPPED[minor])
    if src is None:
        pytest.skip(why)
    out = tmp_path / "schema.json"
    subprocess.run([sys.executable, "-m", "dstk.validate.schema_gen", str(out), "--deepspeed-src", str(src),
                    "--version", SHIPPED[minor]], check=True, capture_output=True, timeout=600)
    assert json.loads(out.read_text()) == load_schema(minor)
