"""The command line: a thin shell over the API, with help that explains and errors that exit 2."""

import subprocess
import sys

import pytest

from swiglu_fused.cli import main


def test_help_lists_commands_and_examples(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for word in ("convert", "verify", "inspect", "demo", "examples:"):
        assert word in out


def test_convert_help_explains_interleave(capsys):
    with pytest.raises(SystemExit):
        main(["convert", "--help"])
    out = capsys.readouterr().out
    assert "--interleave" in out and "multiple" in out and "--force" in out


def test_convert_verify_inspect(tmp_path, tiny_llama, capsys):
    src, _ = tiny_llama
    dst = tmp_path / "packed"
    assert main(["convert", str(src), str(dst), "--format", "nvfp4", "--no-progress"]) == 0
    assert "2 MLPs" in capsys.readouterr().out
    assert main(["verify", str(dst), "--against", str(src)]) == 0
    assert "OK" in capsys.readouterr().out
    assert main(["inspect", str(dst)]) == 0
    assert "model.layers.0.mlp" in capsys.readouterr().out
    assert main(["convert", str(src), str(dst)]) == 2
    assert "already exists; pass --force to replace it" in capsys.readouterr().err


def test_errors_exit_2_with_the_reason(tmp_path, capsys):
    assert main(["convert", str(tmp_path), str(tmp_path / "out")]) == 2
    assert "config.json: missing" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_verify_fails_with_exit_1(tmp_path, tiny_llama, capsys):
    src, _ = tiny_llama
    assert main(["verify", str(src)]) == 1
    assert "not a swiglu-fused checkpoint" in capsys.readouterr().out


def test_console_script_demo_runs_offline():
    out = subprocess.run([sys.executable, "-m", "swiglu_fused.cli", "demo", "--format", "fp8_block128"],
                         capture_output=True, text=True, check=True).stdout
    assert "fp8_block128" in out and "top-1 agree" in out


def _fresh_python(code: str) -> subprocess.CompletedProcess:
    """``code`` run by a new interpreter (nothing of the package or torch imported yet)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_a_ctrl_c_while_the_command_starts_is_one_line_not_a_traceback():
    """The command's entry imports no torch (the package's names load on use), so a Ctrl-C in the
    seconds torch takes to import lands inside main(), which answers it as any other interrupt:
    one line, exit 128 + SIGINT. (Before, it landed in the entry's import: a traceback.)"""
    import re

    code = ("import os, signal, sys, threading\n"
            "from swiglu_fused.cli import main\n"  # what the console script runs first
            "assert 'torch' not in sys.modules, 'the entry imported torch'\n"
            "threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT)).start()\n"
            "sys.exit(main(['inspect', 'no-such-dir']))\n")
    proc = _fresh_python(code)
    assert proc.returncode == 130, proc.stderr
    assert re.fullmatch(r"swiglu-fused( inspect)?: interrupted\n", proc.stderr), proc.stderr


def test_help_and_a_bad_flag_are_answered_before_torch_loads():
    """The parser is built from format_names (no torch), so --help and flag errors take no seconds;
    format_names spells the formats formats.py registers."""
    from swiglu_fused import format_names, formats

    assert tuple(formats.WEIGHT_FORMATS) == format_names.WEIGHT_FORMAT_NAMES
    assert formats.DEFAULT_INTERLEAVE == format_names.DEFAULT_INTERLEAVE
    code = ("import sys\n"
            "from swiglu_fused.cli import main\n"
            "for argv in (['--help'], ['convert', '--help'], ['convert', 'a', 'b', '--format', 'nope']):\n"
            "    try:\n"
            "        main(argv)\n"
            "    except SystemExit:\n"
            "        pass\n"
            "    assert 'torch' not in sys.modules, argv\n")
    proc = _fresh_python(code)
    assert proc.returncode == 0, proc.stderr
    assert "invalid choice: 'nope'" in proc.stderr


def test_the_lazy_names_and_the_type_checkers_imports_agree():
    import ast

    import swiglu_fused

    tree = ast.parse(open(swiglu_fused.__file__).read())
    checked = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    seen = {(a.name, node.module) for node in checked.body for a in node.names}
    assert seen == {(name, module) for name, module in swiglu_fused._API.items()}


def test_import_swiglu_fused_loads_no_torch_until_a_name_is_used():
    code = ("import sys, swiglu_fused\n"
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules\n"
            "assert swiglu_fused.FusedSwiGLUMLP.__module__ == 'swiglu_fused.layer'\n"
            "assert 'torch' in sys.modules and 'FusedSwiGLUMLP' in dir(swiglu_fused)\n"
            "assert swiglu_fused.formats.FORMAT_VERSION  # (its modules too, as when they loaded eagerly)\n")
    proc = _fresh_python(code)
    assert proc.returncode == 0, proc.stderr
