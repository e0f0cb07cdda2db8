import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```bash\n(.+?)\n```", text, flags=re.S)


def test_ci_runs_the_readme_test_command():
    commands = _readme_commands()
    test_cmd = next(c for c in commands if "pytest" in c)
    ci = (ROOT / ".ci" / "run").read_text()
    assert test_cmd in ci.splitlines(), "the .ci/run script must run the README's test command verbatim"


def test_readme_pins_torch_before_the_project():
    for cmd in _readme_commands()[:2]:
        assert cmd.index("torch==") < cmd.index("install -e"), cmd
