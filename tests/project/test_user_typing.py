"""A user's ``mypy --strict`` sees actorch after the README's ``pip install -e .``, and checks calls, tells and options.

A copy of the repository (so that the builds write nothing into the real one)
is installed, editable and for real, by pip and the project's own build
backend into a fresh virtualenv. To stay fast it installs nothing else:
the virtualenv reaches the test environment's packages (torch, msgpack and its
stubs, setuptools) through a ``.pth`` line, as ``--system-site-packages``
would reach the system's, and pip builds without isolation. A small typed
script with one wrong argument to ``call``, one to ``tell``, one option of
the wrong type and one misspelt must get exactly those four errors from mypy,
and none inside actorch (nor in its typed reading of a remote error). The
README must say how to install mypy beside actorch. A wheel built for
``pip install .`` must ship ``py.typed``, and neither kind of install may make
the repository's other folders importable.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
OTHER_FOLDERS = ("tests", "examples", "benchmarks", "docs")
"""Folders of the repository that no install may make importable."""

USER_SCRIPT = """\
import actorch


class Counter(actorch.Actor):
    async def add(self, k: int = 1) -> int:
        return k


async def main(system: actorch.ActorSystem) -> int:
    counter = await system.spawn(Counter)
    total: int = await counter.call(Counter.add, 5)
    counter.tell(Counter.add, 1)
    await counter.call(Counter.add, "two")
    counter.tell(Counter.add, "three")
    by_name: int = await counter.call("add", 4)
    return total + by_name


if __name__ == "__main__":
    actorch.run(main)
    shared = actorch.SystemOptions(strict=True, lookup_timeout=5.0)
    actorch.run(main, 2, options=shared, log_level="info", status_port=None)
    actorch.run(main, strict="yes")
    actorch.run(main, stirct=True)


async def remote_traceback_of(counter: actorch.ActorRef[Counter]) -> str:
    try:
        await counter.call(Counter.add, -1)
    except ValueError as exc:
        remote = actorch.remote_error_of(exc)
        return "" if remote is None else f"{remote.type_name}: {remote.remote_traceback}"
    return ""
"""
WRONG_CALL_LINE = 13
WRONG_TELL_LINE = 14
WRONG_OPTION_LINE = 23
MISSPELT_OPTION_LINE = 24

pytestmark = pytest.mark.timeout(600)  # mypy reads torch's stubs cold: about 40 s of CPU


def user_env() -> dict[str, str]:
    """The environment a user's shell would have: none of the test run's import paths."""
    return {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME", "MYPYPATH")}


def run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=user_env(), capture_output=True, text=True, timeout=540, check=False)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the repository as a user has it: its files, none of its builds or caches."""
    copy = tmp_path_factory.mktemp("checkout") / "actorch"
    left_out = shutil.ignore_patterns(".git", ".venv", "build", "dist", "site", "*.egg-info", "__pycache__", ".*_cache")
    shutil.copytree(REPO, copy, ignore=left_out)
    return copy


@pytest.fixture(scope="module")
def user_venv(tmp_path_factory: pytest.TempPathFactory, project: Path) -> Path:
    """A fresh virtualenv with actorch installed by ``pip install -e`` of the project; its python."""
    home = tmp_path_factory.mktemp("user")
    venv = home / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], home).stdout.strip()
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    Path(site, "test_environment.pth").write_text("".join(f"{path}\n" for path in sorted(ours)))
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-index", "--no-deps"]
    installed = run([*pip, "--no-build-isolation", "--editable", str(project)], home)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return python


def test_editable_install_puts_actorch_alone_on_the_path(user_venv: Path, project: Path) -> None:
    probe = (
        "import importlib.util, os, actorch\n"
        "print(os.path.realpath(actorch.__file__))\n"
        f"print([name for name in {OTHER_FOLDERS!r} if importlib.util.find_spec(name)])\n"
    )
    seen = run([str(user_venv), "-c", probe], user_venv.parent.parent)
    assert seen.returncode == 0, seen.stderr
    location, importable = seen.stdout.splitlines()
    assert all((project / name).is_dir() for name in OTHER_FOLDERS), "they are there to be left out"
    assert Path(location) == project / "actorch" / "__init__.py", "the install points at the project's own files"
    assert importable == "[]", "the project's other folders stay out of the user's imports"


def test_mypy_strict_on_a_users_script_checks_call_and_tell_and_reports_nothing_inside_actorch(
    user_venv: Path, tmp_path: Path
) -> None:
    script = tmp_path / "user_script.py"
    script.write_text(USER_SCRIPT)
    config = tmp_path / "mypy.ini"
    config.write_text("[mypy]\n")  # the user's own, empty: no setting of this repository's applies
    argv = [sys.executable, "-m", "mypy", "--strict", "--config-file", str(config), "--cache-dir", str(tmp_path)]
    checked = run([*argv, "--python-executable", str(user_venv), script.name], tmp_path)
    errors = [line for line in checked.stdout.splitlines() if ": error: " in line]
    assert [(*line.split(":")[:2], line.rpartition(" ")[2]) for line in errors] == [
        (script.name, str(WRONG_CALL_LINE), "[call-overload]"),
        (script.name, str(WRONG_TELL_LINE), "[call-overload]"),
        (script.name, str(WRONG_OPTION_LINE), "[arg-type]"),
        (script.name, str(MISSPELT_OPTION_LINE), "[call-arg]"),
    ], checked.stdout + checked.stderr
    assert 'Unexpected keyword argument "stirct" for "run"; did you mean "strict"?' in checked.stdout
    said = checked.stdout.replace("actorch.Actor", "").replace('note: "run" defined in "actorch._launch.world.run"', "")
    assert "actorch" not in said, "no error or note points inside actorch"
    assert checked.stdout.rstrip().endswith("Found 4 errors in 1 file (checked 1 source file)"), checked.stdout


def test_the_readme_says_how_to_install_the_mypy_it_says_checks_a_users_script() -> None:
    readme = (REPO / "README.md").read_text()
    paragraph = next(part for part in readme.split("\n\n") if "mypy --strict" in part)
    assert ".venv/bin/pip install mypy" in " ".join(paragraph.split()), paragraph


def test_a_wheel_for_pip_install_ships_py_typed_and_actorch_alone_with_its_console_script(
    project: Path, tmp_path: Path
) -> None:
    built = run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-index",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(tmp_path),
            str(project),
        ],
        tmp_path,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = tmp_path.glob("actorch-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "actorch/py.typed" in names
    # _actorch_cli.py: the console script's module, which starts the command without the package's facade
    shipped = {name.split("/")[0] for name in names}
    assert shipped == {"actorch", "_actorch_cli.py", wheel.name.split("-py")[0] + ".dist-info"}
