import subprocess
import sys

import pytest

from dstk.cli import main


def test_help_exits_zero(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    assert "COMMAND" in capsys.readouterr().out


def test_unknown_command_is_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["no-such-command"])
    assert exc.value.code == 2
    assert "fix:" in capsys.readouterr().err


def test_no_command_prints_help_and_exits_2(capsys):
    assert main([]) == 2


def test_cli_import_stays_light():
    """validate/plan/generate/estimate must start without the heavy stack."""
    code = (
        "import sys, dstk.cli; dstk.cli.build_parser(); import dstk.models; "
        "heavy = [m for m in ('torch', 'deepspeed', 'transformers', 'datasets') if m in sys.modules]; "
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"importing the CLI pulled in: {out.stdout.strip()}"


def test_a_bug_exits_3_and_says_how_to_report_it(monkeypatch, capsys):
    """An exception dstk did not expect is its own fault, not the input's: exit 3, not 1."""
    import dstk.commands.models as command

    def broken(args):
        raise KeyError("a bug")

    monkeypatch.setattr(command, "run", broken)
    assert main(["models"]) == 3
    err = capsys.readouterr().err
    assert err.startswith("internal error (a bug in dstk") and "--debug" in err and "Traceback" not in err
    with pytest.raises(KeyError):
        main(["models", "--debug"])
