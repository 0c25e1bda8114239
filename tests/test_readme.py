"""The README's quick start is what CI runs."""

import re

from conftest import REPO_ROOT


def bash_blocks(text: str) -> list[str]:
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", text, flags=re.S)]


def test_ci_runs_the_readme_test_command():
    readme = (REPO_ROOT / "README.md").read_text()
    quick_start = readme.split("## Quick start", 1)[1]
    blocks = bash_blocks(quick_start)
    assert len(blocks) >= 2
    test_command = blocks[1]
    assert "pytest" in test_command
    ci_lines = [
        line.strip()
        for line in (REPO_ROOT / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert test_command in ci_lines


def test_requirements_pin_torch_exactly():
    req = (REPO_ROOT / "requirements.txt").read_text().splitlines()
    assert "torch==2.13.0" in [line.strip() for line in req]
    assert not any(line.strip().startswith("torchvision") for line in req)


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors_of(text: str) -> set[str]:
    outside_code = re.sub(r"```.*?```", "", text, flags=re.S)
    seen: dict[str, int] = {}
    anchors = set()
    for heading in re.findall(r"^#+\s+(.+?)\s*$", outside_code, flags=re.M):
        base = github_anchor(heading)
        n = seen.get(base, 0)
        anchors.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return anchors


def test_github_anchor_matches_hand_made_cases():
    assert github_anchor("Defaults (the paper's setting, for GPUs and real data)") == (
        "defaults-the-papers-setting-for-gpus-and-real-data"
    )
    assert anchors_of("# A\n```\n# not a heading\n```\n## A\n") == {"a", "a-1"}


def test_readme_and_docs_links_resolve():
    """Every relative link of the README and the docs pages names a file that exists and, with #anchor, a heading of
    it: pages are split and sections move between them, and a dead link is what a reader meets first."""
    pages = [
        REPO_ROOT / "README.md",
        REPO_ROOT / "bundle" / "docs" / "README.md",
        *sorted((REPO_ROOT / "docs").glob("*.md")),
        *sorted((REPO_ROOT / "glam_benchmark").rglob("*.md")),
    ]
    broken = []
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{page.relative_to(REPO_ROOT)}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in anchors_of(linked.read_text(encoding="utf-8")):
                broken.append(f"{page.relative_to(REPO_ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_quick_start_paragraph_states_the_preset():
    """The README's quick start names the preset's image count, size, patch size and epochs per stage: a figure
    quoted beside a preset that has moved on is what misleads a first reader."""
    import yaml

    readme = (REPO_ROOT / "README.md").read_text()
    paragraph = readme.split("## Quick start", 1)[1].split("```bash", 1)[0]
    stated = re.search(
        r"`configs/quickstart\.yaml`: (\d+) images of (\d+)x(\d+), (\d+) px patches,.*?(\d+) / (\d+) / (\d+) epochs",
        paragraph,
        flags=re.S,
    )
    assert stated, "the quick start paragraph no longer states the preset's sizes and epochs"
    preset = yaml.safe_load((REPO_ROOT / "configs" / "quickstart.yaml").read_text())
    n, height, width, patch, *epochs = (int(v) for v in stated.groups())
    assert (n, [height, width], patch) == (preset["quickstart_images"], preset["quickstart_size"], preset["patch_size"])
    assert epochs == [preset["epochs"][stage] for stage in ("global", "local", "joint")]
