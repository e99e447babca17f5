"""Docs that cannot go stale: the README's commands run, the CLI reference matches --help."""

import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_cli_reference_matches_help():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import gen_cli_docs
    finally:
        sys.path.pop(0)
    assert (ROOT / "docs" / "cli.md").read_text() == gen_cli_docs.render(), \
        "docs/cli.md is stale: run python tools/gen_cli_docs.py"


def _setup_commands():
    text = (ROOT / "README.md").read_text()
    return [line.strip() for line in text.splitlines() if line.strip().startswith("pip install")]


def test_readme_has_two_setup_commands_and_ci_runs_the_test_one():
    cmds = _setup_commands()
    assert len(cmds) == 2
    ci = (ROOT / ".ci" / "run").read_text()
    assert cmds[1] in ci


def test_readme_main_job_runs(tmp_path):
    """The part of the first set-up command after the install, run as a user would."""
    main_job = _setup_commands()[0].split("&&", 1)[1].strip()
    argv = shlex.split(main_job)
    assert argv[0] == "rewrite"
    r = subprocess.run([sys.executable, "-m", "rewriter.cli"] + argv[1:], cwd=tmp_path,
                       capture_output=True, text=True, env=_env())
    # The README runs from the checkout: models/ paths are relative to it.
    if r.returncode != 0 and "no such file" in r.stderr:
        argv = [str(ROOT / a) if a.startswith("models/") else a for a in argv]
        r = subprocess.run([sys.executable, "-m", "rewriter.cli"] + argv[1:], cwd=tmp_path,
                           capture_output=True, text=True, env=_env())
    assert r.returncode == 0, r.stderr
    assert "BatchNormalization" in r.stdout and "yes" in r.stdout
    out = [a for a in argv if a.endswith(".opt.onnx")][0]
    assert (tmp_path / out).exists()


def test_readme_examples_use_real_options():
    """Every `rewrite ...` example in the README parses with the real CLI."""
    from rewriter.cli import SUBCOMMANDS, build_parser

    text = (ROOT / "README.md").read_text()
    seen = 0
    for line in text.splitlines():
        line = line.split("#")[0].strip()
        if not line.startswith("rewrite ") or shlex.split(line)[1] in SUBCOMMANDS:
            continue
        build_parser().parse_args(shlex.split(line)[1:])
        seen += 1
    assert seen >= 5


def _env():
    import os
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT)
    return env


# docs/architecture.md's layers, top to bottom: a module may import its own layer's
# package and the ones below it. Two lazy imports go up, each for a reason said there.
_LAYERS = {"passes": {"rewriter.core", "rewriter.passes"},
           "rewriter/core": {"rewriter.core"},
           "rewriter/verify": {"rewriter.core", "rewriter.verify"},
           "rewriter/advise": {"rewriter.core", "rewriter.advise"},
           "rewriter/quant": {"rewriter.core", "rewriter.verify", "rewriter.quant"},
           "rewriter/migraphx": {"rewriter.core", "rewriter.verify", "rewriter.migraphx"}}
_UPWARD = {("rewriter/core/report.py", "rewriter.verify"),      # certificate text
           ("rewriter/migraphx/target.py", "rewriter.api")}     # --fix-shapes retry


def test_imports_follow_the_documented_layers():
    """architecture.md says what may import what; insert-qdq imported its progress bar
    from quant (a pass reaching a service) and Options' check imported migraphx's version
    parser (core reaching up) before anyone noticed. The rule is checked here."""
    import ast
    bad = []
    for folder, allowed in _LAYERS.items():
        for path in sorted((ROOT / folder).glob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([node.module] if isinstance(node, ast.ImportFrom) and node.level == 0
                         and node.module else [a.name for a in node.names]
                         if isinstance(node, ast.Import) else [])
                for name in names:
                    top = ".".join(name.split(".")[:2])
                    if (name.startswith("rewriter") and top not in allowed
                            and (rel, top) not in _UPWARD):
                        bad.append(f"{rel}: {name}")
    assert not bad, bad
