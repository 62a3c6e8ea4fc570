"""What `pip install .` installs: every tracked file of the package (missing ones fail only outside `pip -e`)."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[1]


def _tracked(*paths: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", *paths], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip("not a git checkout")
    return out.stdout.split()


@pytest.mark.slow  # pip builds a wheel
def test_the_wheel_holds_every_module_and_data_file_no_test_and_the_three_commands(tmp_path):
    # built from a copy of the tracked package and build files: no build folder is left in the checkout
    source, out = tmp_path / "source", tmp_path / "wheel"
    for name in _tracked("stapo_trl", "setup.cfg", "pyproject.toml", "README.md", "LICENSE"):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name)
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out),
           str(source)]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True)
    (path,) = out.glob("*.whl")
    wheel = zipfile.ZipFile(path)
    tracked = _tracked("stapo_trl")
    assert "stapo_trl/templates/demo_stapo.yaml" in tracked and len(tracked) > 40
    assert [name for name in tracked if name not in wheel.namelist()] == []
    assert not [name for name in wheel.namelist() if name.startswith("tests/")]
    (entry_points,) = [name for name in wheel.namelist() if name.endswith(".dist-info/entry_points.txt")]
    scripts = wheel.read(entry_points).decode()
    for command, target in [("stapo-train", "stapo_trl.cli.train:main"), ("stapo-eval", "stapo_trl.cli.eval:main"),
                            ("stapo-plot", "stapo_trl.cli.plot:main")]:  # fmt: skip
        assert f"{command} = {target}" in scripts, scripts


def test_what_stapo_train_names_as_the_demo_recipe_an_install_has(tmp_path):
    # The help and the errors that show a recipe name a copy the package holds (in the wheel: the test above).
    from stapo_trl.cli.args import DEMO_RECIPE, SHORT_HELP, load_recipe, parse_args

    assert Path(DEMO_RECIPE).read_bytes() == (ROOT / "recipes" / "demo" / "stapo.yaml").read_bytes()
    assert f"the CPU demo's: {DEMO_RECIPE}\n" in SHORT_HELP
    with pytest.raises(ValueError, match=f"the CPU demo's: {DEMO_RECIPE}"):
        parse_args([])
    (tmp_path / "empty.yaml").write_text("")
    with pytest.raises(ValueError, match=f"per line \\(as {DEMO_RECIPE}\\)"):
        load_recipe(str(tmp_path / "empty.yaml"))
