"""Docs that cannot go stale: the README's commands run, the CLI reference matches --help."""

import contextlib
import io
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np

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


# The pages a new user reads (the long benchmark pages and robustness.md's history aside).
USER_DOCS = ["README.md"] + [f"docs/{d}.md" for d in (
    "cli", "plans", "calibration", "architecture", "writing-a-pass", "migraphx",
    "pad-channels", "profiling-rocm")]


def _parsers():
    from rewriter.cli import build_parser, check_parser, plan_parser

    return {None: build_parser(), "plan": plan_parser(), "check": check_parser()}


def _commands():
    """Every `rewrite ...` command in the user docs, continuation lines joined, comments
    and placeholders (`[...]`, `...`) out: (doc, argv)."""
    for doc in USER_DOCS:
        text = (ROOT / doc).read_text().replace("\\\n", " ")
        fenced = False
        for line in text.splitlines():
            fenced ^= line.startswith("```")
            code = fenced or line.startswith("    ")   # a command, not prose
            line = line.split("#")[0].strip()
            if code and line.startswith("rewrite ") and "[" not in line and "..." not in line:
                yield doc, shlex.split(line)[1:]


def test_doc_commands_parse():
    """Every `rewrite`, `rewrite plan` and `rewrite check` command the docs show parses
    with the real CLI (README's were checked, the subcommands and other pages were not)."""
    parsers, seen = _parsers(), 0
    for doc, argv in _commands():
        if argv[0] == "advise":
            continue
        sub = argv[0] if argv[0] in parsers else None
        try:
            parsers[sub].parse_args(argv[1:] if sub else argv)
        except SystemExit as e:
            raise AssertionError(f"{doc}: rewrite {' '.join(argv)}: {e}") from None
        seen += 1
    assert seen >= 20


def test_docs_name_only_real_options():
    """A `--flag` in the user docs is one of the CLI's (any subcommand), or belongs to a
    tool the same passage names (tools/..., migraphx-driver, duplicates)."""
    from rewriter.advise.advice import main as advise_main

    known = {o for p in _parsers().values() for a in p._actions for o in a.option_strings}
    with contextlib.redirect_stdout(io.StringIO()) as out:
        advise_main(["-h"])
    known |= set(re.findall(r"--[a-z][a-z0-9-]+", out.getvalue()))
    bad = []
    for doc in USER_DOCS:
        text = (ROOT / doc).read_text()
        for m in re.finditer(r"(?<![\w-])--[a-z][a-z0-9-]+", text):
            before = text[max(0, m.start() - 600):m.start()]
            if m.group() not in known and not re.search(
                    r"tools/|migraphx-driver|duplicates|rocprof", before):
                bad.append(f"{doc}: {m.group()}")
    assert not bad, bad


def _yaml_block(doc: str, after: str) -> dict:
    import yaml

    text = (ROOT / doc).read_text()
    return yaml.safe_load(text[text.index(after):].split("```yaml\n", 1)[1].split("```")[0])


def test_plan_schema_in_docs_is_what_the_loader_takes():
    """plans.md's schema: the loader accepts it, it names every key the loader knows, and
    the values it shows for the int8, fp16 and verify sections are the defaults."""
    from rewriter.quant.plan import _DEFAULT_INT8, Plan, from_dict
    from rewriter.verify.metrics import LOSSY_DEFAULT

    doc = _yaml_block("docs/plans.md", "## Schema (version 1)")
    plan = from_dict(doc, "docs/plans.md")
    assert set(doc) == {"version", "default", "rules", "overrides", "int8", "fp16", "verify",
                        "preprocess"}
    assert set(doc["int8"]) == set(_DEFAULT_INT8)
    assert set(doc["int8"]["calibration"]) == set(_DEFAULT_INT8["calibration"])
    assert set(doc["verify"]) == set(LOSSY_DEFAULT)
    assert {k for r in doc["rules"] for k in r["match"]} == {"name", "regex", "op", "position"}
    default = Plan()
    assert (plan.int8, plan.fp16, plan.verify) == (default.int8, default.fp16, default.verify)
    assert doc["default"] == default.default


def test_preprocess_keys_in_docs_are_the_loaders():
    """calibration.md's preprocess block and key table: every key Preprocess takes, no
    other, and the block loads."""
    import dataclasses

    from rewriter.quant.data import Preprocess

    text = (ROOT / "docs" / "calibration.md").read_text()
    block = _yaml_block("docs/calibration.md", "## Images")["preprocess"]
    fields = {f.name for f in dataclasses.fields(Preprocess)}
    assert set(block) == fields
    Preprocess.from_dict(block)
    table = text[text.index("| key | default | notes |"):].split("\n\n")[0]
    named = {k for row in re.findall(r"^\| (`[^|]+)\|", table, re.M)
             for k in re.findall(r"`(\w+)`", row)}
    assert named == fields


def test_code_names_in_docs_exist():
    """Every `rewriter...` / `core.` / `quant.` ... name the user docs give in backticks
    (a function, class or module to read or call) exists."""
    import importlib

    own = ("rewriter", "core", "verify", "quant", "migraphx", "advise", "api", "cli")
    # MIGraphX's own Python API, named where the docs say how the backend calls it.
    theirs = {"migraphx.get_onnx_operators", "migraphx.save"}
    missing = []
    for doc in USER_DOCS:
        text = (ROOT / doc).read_text()
        for ref in re.findall(r"`([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\(\))?`", text):
            if ref.split(".")[0] not in own or ref in theirs:
                continue
            parts = ref.split(".")
            parts = parts if parts[0] == "rewriter" else ["rewriter"] + parts
            for i in range(len(parts), 0, -1):
                try:
                    obj = importlib.import_module(".".join(parts[:i]))
                    break
                except ImportError:
                    continue
            for name in parts[i:]:
                if not hasattr(obj, name):
                    missing.append(f"{doc}: {ref}")
                    break
                obj = getattr(obj, name)
    assert not missing, missing


def test_writing_a_pass_example_runs(tmp_path, monkeypatch):
    """writing-a-pass.md's minimal pass, run literally on a model with two Identities."""
    import onnx
    import onnx.parser

    text = (ROOT / "docs" / "writing-a-pass.md").read_text()
    code = re.findall(r"```python\n(.*?)```", text, re.S)[-1]
    onnx.save(onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1,4] x) => (float[1,4] y) { a = Identity(x) b = Relu(a) y = Identity(b) }"""),
        tmp_path / "m.onnx")
    monkeypatch.chdir(tmp_path)
    scope = {}
    exec(compile(code, "writing-a-pass.md", "exec"), scope)
    report = scope["report"]
    row = report.passes[0]
    assert row.name == "drop-identity"
    assert dict(row.counts) == {"dropped": 1, "skip:graph-output": 1}
    assert report.verified


def test_calibration_example_runs(tmp_path, monkeypatch):
    """calibration.md's Python block, run literally on a model whose tensors bear its
    names and a folder of 60 images (it gave no model and passed the path nowhere)."""
    from conftest import make_model
    from PIL import Image

    text = (ROOT / "docs" / "calibration.md").read_text()
    code = re.findall(r"```python\n(.*?)```", text, re.S)[0]
    import onnx

    onnx.save(make_model("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[N,3,8,8] input, float[4,3,3,3] w1, float[4,4,3,3] w2) => (float[N,4,8,8] y) {
          conv1_in = Relu(input)
          conv2_in = Conv<pads=[1,1,1,1]>(conv1_in, w1)
          y = Conv<pads=[1,1,1,1]>(conv2_in, w2)
        }""", {"w1": (4, 3, 3, 3), "w2": (4, 4, 3, 3)}), tmp_path / "m.onnx")
    (tmp_path / "photos").mkdir()
    rng = np.random.default_rng(5)
    for k in range(60):
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(
            tmp_path / "photos" / f"{k:02d}.png")
    monkeypatch.chdir(tmp_path)
    scope = {}
    exec(compile(code, "calibration.md", "exec"), scope)
    assert scope["held_out"].n_samples == 50 and scope["calib"].n_samples == 10
    assert set(scope["ranges"]) == {"conv1_in", "conv2_in"}


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


def test_pass_lists_in_docs_are_the_default_pipeline():
    """README's picture and architecture.md's layer list name the default pipeline in its
    order, and README marks exactly the MIGraphX-only passes; architecture.md put crop_pads
    before fold_shapes and scan_states twice once resize_inputs came in."""
    from rewriter.core.registry import DEFAULT_PIPELINE, MIGRAPHX_ONLY

    rows = re.findall(r"^   │  ([a-z][a-z0-9-]*(?:, [a-z][a-z0-9-]*)*)\s+(.*)$",
                      (ROOT / "README.md").read_text(), re.M)
    named = [(n.strip(), rest) for row, rest in rows for n in row.split(",")]
    readme = [n for n, _ in named]
    assert readme[:len(DEFAULT_PIPELINE)] == DEFAULT_PIPELINE
    marked = {n for n, rest in named if rest.startswith("(MIGraphX target")}
    assert marked == MIGRAPHX_ONLY
    arch = (ROOT / "docs" / "architecture.md").read_text()
    block = arch[arch.index("the FP32 default"):arch.index("pad_channels, and the plan's")]
    listed = [n.replace("_", "-") for n in re.findall(r"\b[a-z]+(?:_[a-z0-9]+)+\b", block)]
    assert listed == DEFAULT_PIPELINE


def test_planner_only_settings_in_plans_md_are_the_codes():
    """plans.md's lists of the flags (and API settings) a fixed plan refuses and those any
    plan reads are cli.PLANNER_ONLY and api.ANY_PLAN: both grew with --max-abs."""
    from rewriter.api import ANY_PLAN
    from rewriter.cli import PLANNER_ONLY

    text = " ".join((ROOT / "docs" / "plans.md").read_text().split())
    flags = text[text.index("The planner's flags ("):].split(")", 1)[0]
    assert set(re.findall(r"`--([a-z0-9-]+)`", flags)) == \
        {k.replace("_", "-") for k in PLANNER_ONLY}
    every = text[text.index("are an error with a fixed plan"):].split("apply to every", 1)[0]
    assert set(re.findall(r"`--([a-z0-9-]+)`", every)) == set(ANY_PLAN) - {"preprocess"}
    api = text[text.index("a setting other than"):].split("with `plan=`", 1)[0]
    assert set(re.findall(r"`([a-z_0-9]+)`", api)) == set(ANY_PLAN)
